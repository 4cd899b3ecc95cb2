"""contract.files.atomic_write: the target is the old file or the new one, never half of one."""

from __future__ import annotations

import os
import stat

import pytest

from lynxtop.contract.files import atomic_write


def test_writes_str_bytes_and_stream(tmp_path):
    p = tmp_path / "a.json"
    atomic_write(p, "héllo\r\n")
    assert p.read_bytes() == "héllo\r\n".encode()  # UTF-8, no newline translation
    atomic_write(p, b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    assert atomic_write(p, lambda f: f.write("streamed") and 42) == 42
    assert p.read_text() == "streamed"
    assert os.listdir(tmp_path) == ["a.json"]  # no temporary file left


def test_mode_and_umask(tmp_path):
    p = tmp_path / "m"
    atomic_write(p, "x", mode=0o640)
    assert stat.S_IMODE(p.stat().st_mode) == 0o640
    old = os.umask(0o027)
    try:
        atomic_write(p, "x", fsync=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o640  # 0666 & ~027, like a shell's `>`


def test_failure_keeps_the_old_file(tmp_path):
    p = tmp_path / "keep"
    p.write_text("old")

    def boom(f):
        f.write("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        atomic_write(p, boom)
    assert p.read_text() == "old"
    assert os.listdir(tmp_path) == ["keep"]
