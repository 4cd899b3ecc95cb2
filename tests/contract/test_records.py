"""The typed records (contract/records.py, contract/events.py): strict on what they need, tolerant of what a newer
agent adds, the JSON on the wire unchanged; and no test fixture writes an event kind that no agent writes."""

from __future__ import annotations

import ast
import dataclasses
import sqlite3
import time
from pathlib import Path

import pytest

from lynxtop.contract.events import LEGACY_KINDS, Event, EventKind, Severity
from lynxtop.contract.records import ActionAnswer, ProfileInfo, ProfileList, RecordError, RunInfo, read_list
from lynxtop.store.errors import StoreError
from lynxtop.store.reader import StoreReader
from lynxtop.store.schema import RUN_COLUMNS
from lynxtop.store.writer import StoreWriter

ROOT = Path(__file__).resolve().parents[2]
T0 = int(time.time() * 1000) - 60_000  # recent: older rows would be the store's retention's to delete
EVENT = {"id": 4, "ts_ms": 1_700_000_000_000, "run_id": 7, "kind": "serving.crash", "severity": "error",
         "message": "vLLM exited with code 1", "details": {"exit_code": 1}}


# ------------------------------------------------------------------------------------------ Event


def test_event_reads_and_writes_the_wire_json_unchanged():
    ev = Event.from_json(EVENT)
    assert ev.kind is EventKind.SERVING_CRASH and ev.severity is Severity.ERROR and ev.details == {"exit_code": 1}
    assert ev.to_json() == EVENT


def test_event_unknown_kind_is_an_error_naming_the_field_and_value():
    # a newer agent's well-formed kind reads as a generic event (test_s17_unknown_event_kind.py); a malformed one not
    assert str(Event.from_json({**EVENT, "kind": "serving.exploded"}).kind) == "serving.exploded"
    with pytest.raises(RecordError, match=r"^Event\.kind: unknown kind 'serving\.\\x1b'"):
        Event.from_json({**EVENT, "kind": "serving.\x1b"})
    with pytest.raises(RecordError, match=r"^Event\.severity: .*'fatal'"):
        Event.from_json({**EVENT, "severity": "fatal"})
    with pytest.raises(RecordError, match=r"^Event\.kind: unknown kind 'state'"):  # nor can one be made
        Event("state", Severity.INFO, "x")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["kind", "severity", "message"])
def test_event_missing_required_field_is_an_error_naming_it(name):
    with pytest.raises(RecordError, match=rf"^Event\.{name}: missing"):
        Event.from_json({k: v for k, v in EVENT.items() if k != name})


def test_event_wrong_type_is_an_error_naming_the_field_and_value():
    with pytest.raises(RecordError, match=r"^Event\.run_id: expected an integer or null, got '7'"):
        Event.from_json({**EVENT, "run_id": "7"})
    with pytest.raises(RecordError, match=r"^Event: must be a JSON object, not list"):
        Event.from_json([EVENT])  # type: ignore[arg-type]


def test_event_of_a_newer_agent_extra_fields_are_ignored_and_old_kinds_mapped():
    ev = Event.from_json({**EVENT, "node": "n2", "trace_id": "abc"})  # fields this version does not know
    assert ev.to_json() == EVENT
    old = Event.from_json({**EVENT, "kind": "xid"})  # an older agent's stored name
    assert old.kind is EventKind.GPU_XID
    assert Event.from_json({**EVENT, "kind": "store"}).kind is EventKind.STORE_LEGACY  # older stores' kind


def test_read_list_names_the_item():
    with pytest.raises(RecordError, match=r"^events\[1\]\.kind: unknown kind 'nope'"):
        read_list(Event, [EVENT, {**EVENT, "kind": "nope"}], "events")


# ------------------------------------------------------------------------------------------ runs


def test_run_info_round_trips_and_is_strict():
    row = {"id": 3, "profile": "tp8", "argv": ["vllm", "serve", "m"], "started_ms": 1, "simulated": True,
           "flags": {"--tp": "8"}, "gpu_names": ["H200"], "pid_start_time": 12}
    run = RunInfo.from_json(row)
    assert run.id == 3 and run.argv == ["vllm", "serve", "m"] and run.pid_start_time == 12
    assert run.to_json() == {f.name: row.get(f.name) for f in dataclasses.fields(RunInfo) if f.name != "summary"}
    assert "summary" in RunInfo.from_json({**row, "summary": {"ended": False}}).to_json()
    assert RunInfo.from_json({**row, "colour": "red"}) == run  # a newer agent's field: ignored
    with pytest.raises(RecordError, match=r"^RunInfo\.id: missing"):
        RunInfo.from_json({"profile": "tp8"})
    with pytest.raises(RecordError, match=r"^RunInfo\.simulated: expected true or false or null, got 1"):
        RunInfo.from_json({**row, "simulated": 1})
    with pytest.raises(RecordError, match=r"^RunInfo\.argv: .*got \['vllm', 3\]"):
        RunInfo.from_json({**row, "argv": ["vllm", 3]})


def test_run_info_has_every_column_of_the_runs_table():
    """A column added to the store without the record would be dropped on read (or a record field never stored)."""
    fields = {f.name for f in dataclasses.fields(RunInfo)} - {"summary"}
    assert fields == {"id", *(name for name, _ in RUN_COLUMNS)}


# ------------------------------------------------------------------------------------------ profiles, actions


def test_profiles_are_strict_and_keep_the_wire_json():
    wire = {"current": "tp8", "profiles": [
        {"name": "tp8", "description": "d", "argv": ["vllm"], "flags": {"--tp": "8"}, "env": {"K": "***ab12"}}]}
    listing = ProfileList.from_json(wire)
    assert listing.names == ["tp8"] and listing.get("tp8") == ProfileInfo("tp8", "d", ["vllm"], {"--tp": "8"},
                                                                           {"K": "***ab12"})
    assert listing.to_json() == wire
    assert ProfileList.from_json({**wire, "generation": 2}) == listing  # unknown key ignored
    with pytest.raises(RecordError, match=r"^profiles\[0\]\.name: missing"):
        ProfileList.from_json({"current": None, "profiles": [{"description": "no name"}]})
    with pytest.raises(RecordError, match=r"^ProfileList\.current: expected a string or null, got 5"):
        ProfileList.from_json({"current": 5, "profiles": []})


def test_action_answer_is_strict():
    wire = {"accepted": True, "action": "restart", "message": "restart accepted"}
    assert ActionAnswer.from_json(wire).to_json() == wire
    assert ActionAnswer.from_json({**wire, "request_id": 9}).message == "restart accepted"
    with pytest.raises(RecordError, match=r"^ActionAnswer\.message: missing"):
        ActionAnswer.from_json({"accepted": True, "action": "restart"})
    with pytest.raises(RecordError, match=r"^ActionAnswer\.accepted: expected true or false, got 'yes'"):
        ActionAnswer.from_json({**wire, "accepted": "yes"})


# ------------------------------------------------------------------------------------------ the store


def test_store_reads_typed_records_and_names_a_row_it_cannot_read(tmp_path):
    db = tmp_path / "h.db"
    with StoreWriter(db) as w:
        rid = w.create_run(profile="tp8", argv=["vllm", "serve", "m"], started_ms=T0, simulated=True)
        w.record(Event(EventKind.SERVING_READY, Severity.INFO, "ready", {"load_s": 9}, run_id=rid, ts_ms=T0 + 1))
    c = sqlite3.connect(db)
    c.execute("INSERT INTO events (ts_ms, kind, severity, message, details) VALUES (?, 'gpu.xid', 'error', "
              "'details that are no object', '[1, 2]')", (T0 + 2,))
    c.commit()
    r = StoreReader(db)
    (run,) = r.runs()
    assert isinstance(run, RunInfo) and run.id == rid and run.argv == ["vllm", "serve", "m"] and run.simulated
    ready, xid = r.events()
    assert ready == Event(EventKind.SERVING_READY, Severity.INFO, "ready", {"load_s": 9}, run_id=rid, ts_ms=T0 + 1)
    assert xid.details == {"stored": [1, 2]}  # kept under a name, never dropped
    c.execute("INSERT INTO events (ts_ms, kind, severity, message) VALUES (?, 'gpu.melted', 'error', 'x')", (T0 + 3,))
    c.commit()
    assert str(r.events()[-1].kind) == "gpu.melted"  # a newer agent's kind: read, not an error
    c.execute("INSERT INTO events (ts_ms, kind, severity, message) VALUES (?, 'gpu melted!', 'error', 'x')",
              (T0 + 4,))
    c.commit()
    with pytest.raises(StoreError, match=rf"{db}: events row 4 cannot be read .*unknown kind 'gpu melted!'"):
        r.events()
    r.close()
    c.close()


# ------------------------------------------------------------------------------------------ fixtures


def _event_kinds_in(tree: ast.AST) -> list[tuple[int, str]]:
    """Kinds written as text in `Event("...", ...)` calls and in event-shaped dicts ({"kind": ..., "severity": ...})."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Event":
            arg = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "kind"), None)
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((node.lineno, arg.value))
        if isinstance(node, ast.Dict):
            keys = {k.value: v for k, v in zip(node.keys, node.values, strict=True) if isinstance(k, ast.Constant)}
            kind = keys.get("kind")
            if "severity" in keys and isinstance(kind, ast.Constant) and isinstance(kind.value, str):
                found.append((node.lineno, kind.value))
    return found


def test_fixtures_use_only_kinds_that_exist():
    """Every event kind a test or benchmark writes as text is an EventKind (or an old name the store maps); this
    file alone makes bad ones on purpose."""
    known = {k.value for k in EventKind} | set(LEGACY_KINDS)
    bad = [f"{path.relative_to(ROOT)}:{line}: {kind!r}"
           for folder in ("tests", "benchmarks") for path in sorted((ROOT / folder).rglob("*.py"))
           if path != Path(__file__).resolve()
           for line, kind in _event_kinds_in(ast.parse(path.read_text(), str(path))) if kind not in known]
    assert not bad, "event kinds no agent writes:\n" + "\n".join(bad)


def test_the_fixture_scan_finds_an_unknown_kind():
    """The scan above looks where fixtures write kinds (so it passing means something)."""
    src = 'Event("gpu", "info", "m")\nrows = [{"id": 1, "kind": "state", "severity": "info"}]\n'
    assert _event_kinds_in(ast.parse(src)) == [(1, "gpu"), (2, "state")]


def test_the_agent_writes_only_kinds_it_knows_even_where_readers_take_a_newer_agents():
    """Readers take a well-formed unknown kind as a newer agent's (contract/events.py); a sampler's typo must
    still fail where the agent makes the event, never be stored as a kind no dashboard or alert rule knows."""
    from lynxtop.agent.sampling import as_event

    with pytest.raises(RecordError, match="serving.redy"):
        as_event({"kind": "serving.redy", "severity": "info", "message": "typo", "details": {}})
