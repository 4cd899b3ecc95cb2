"""s25: each board's serial number (nvmlDeviceGetSerial) is read with its other facts and kept in its `gpus` row.

The UUID tells boards apart in the history; the serial is what is printed on the board and what a vendor's RMA
asks for: an operator told "GPU 1's board was replaced" can name the boards. Read once per (re)initialisation
(never per tick); a board that answers NOT_SUPPORTED (some boards keep no serial) leaves it NULL and nothing
else, and a later read that fails keeps the serial a start stored (the same UUID is the same board).

Real parts: the GPU sampler over the fake NVML, its static rows stored by the real StoreWriter in a SQLite file read
back by StoreReader; the column is added in place to a file made before it (no schema version moved).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from lynxtop.agent.gpu.fake import FakeNvml
from lynxtop.agent.gpu.protocol import FakeGpuSpec, FakeGpuState
from lynxtop.agent.gpu.sampler import GpuSampler
from lynxtop.store.reader import StoreReader
from lynxtop.store.schema import schema_version
from lynxtop.store.writer import StoreWriter

UUIDS = [f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in range(2)]


class Node:
    """A fake NVML node: two boards, the second's serial `unsupported` on demand."""

    def __init__(self, serial_unsupported: bool = False, serials: tuple[str, str] = ("", "")):
        no = frozenset({"nvmlDeviceGetSerial"}) if serial_unsupported else frozenset()
        self.specs = [FakeGpuSpec(index=0, uuid=UUIDS[0], serial=serials[0]),
                      FakeGpuSpec(index=1, uuid=UUIDS[1], serial=serials[1], unsupported=no)]

    def driver_version(self) -> str:
        return "580.159.04"

    def gpus(self) -> list[FakeGpuSpec]:
        return list(self.specs)

    def state(self, index: int, now: float) -> FakeGpuState:
        return FakeGpuState()


def static_of(node: Node) -> list[dict]:
    s = GpuSampler(lambda: FakeNvml(node), xid_events=False, retry_initial_s=1.0)
    s.open()
    try:
        return s.static()
    finally:
        s.close()


def store(db: Path, node: Node, wall_s: float) -> None:
    w = StoreWriter(db, clock=lambda: wall_s)
    w.start()
    try:
        w.upsert_gpus(static_of(node), enumerated=2)
        assert w.flush(30)
    finally:
        w.close()


def serials(db: Path) -> dict[str, str | None]:
    r = StoreReader(db)
    try:
        return {g["uuid"]: g["serial"] for g in r.gpus()}
    finally:
        r.close()


def test_the_sampler_reads_each_boards_serial():
    static = static_of(Node(serials=("1654922008479", "")))
    assert [g["serial"] for g in static] == ["1654922008479", "1320000000001"]  # the fake's own for an unset one


def test_a_board_without_a_serial_leaves_it_empty_and_the_rest_read():
    static = static_of(Node(serial_unsupported=True))
    assert static[1]["serial"] is None
    assert static[1]["uuid"] == UUIDS[1] and static[1]["name"] and static[1]["pci_bus_id"]  # its other facts read
    assert static[0]["serial"] == "1320000000000"


def test_the_serial_is_stored_and_a_later_failed_read_keeps_it(tmp_path):
    db = tmp_path / "lynxtop.db"
    store(db, Node(), 1000.0)
    assert serials(db) == {UUIDS[0]: "1320000000000", UUIDS[1]: "1320000000001"}
    store(db, Node(serial_unsupported=True), 2000.0)  # the read failed this time: the same board, the same serial
    assert serials(db) == {UUIDS[0]: "1320000000000", UUIDS[1]: "1320000000001"}


def test_a_file_from_before_gets_the_column_in_place(tmp_path):
    db = tmp_path / "lynxtop.db"
    store(db, Node(), 1000.0)
    c = sqlite3.connect(db)
    try:
        version = schema_version(c)
        c.execute("ALTER TABLE gpus DROP COLUMN serial")  # as a file written before s25
        c.commit()
    finally:
        c.close()
    r = StoreReader(db)
    try:
        assert {g["serial"] for g in r.gpus()} == {None}  # read from an older file: unknown
    finally:
        r.close()
    store(db, Node(), 2000.0)
    assert serials(db) == {UUIDS[0]: "1320000000000", UUIDS[1]: "1320000000001"}
    c = sqlite3.connect(db)
    try:
        assert schema_version(c) == version  # no migration: the column added in place
    finally:
        c.close()


@pytest.mark.parametrize("raw", [b"1654922008479", "1654922008479"])
def test_the_serial_is_text_whatever_pynvml_gives(raw):
    """pynvml gives bytes in older releases, str in newer ones."""

    class BytesNvml(FakeNvml):
        def nvmlDeviceGetSerial(self, handle):  # noqa: N802 (pynvml's name)
            super().nvmlDeviceGetSerial(handle)
            return raw

    s = GpuSampler(lambda: BytesNvml(Node()), xid_events=False, retry_initial_s=1.0)
    s.open()
    try:
        assert [g["serial"] for g in s.static()] == ["1654922008479"] * 2
    finally:
        s.close()
