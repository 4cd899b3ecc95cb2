"""serving.json is read as a record an agent wrote or not at all: `ServerRecord.from_json` checks every field's type
and range (a `start_ticks` of another type once made the next agent SIGKILL the live, ready server as a stranger's
leftover), `read_record` never follows a symlink nor waits on a FIFO, and the identity check never lets a live pid
carrying the run's token be signalled. Real files, real processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import asdict

import pytest
from support.waits import wait_for

from lynxtop.agent.serving import launcher, procs
from lynxtop.agent.serving.launcher import ServerRecord

pytestmark = pytest.mark.timeout(60)

TOKEN = "0123456789abcdef"


def _record(**changes) -> ServerRecord:
    fields = dict(run_id=7, profile="v4-tp8", pid=4242, pgid=4242, start_ticks=123456,
                  argv=["/opt/vllm/bin/vllm", "serve", "m"], token=TOKEN, log_path="/var/lib/lynxtop/logs/r.log",
                  started_ms=1_700_000_000_000, ready_ms=1_700_000_100_000, env={"VLLM_LOGGING_LEVEL": "INFO"},
                  shm_segments=["/dev/shm/psm_ab12"], readiness_timeout_s=1200.0, tmp_dir="/var/lib/lynxtop/t/x")
    return ServerRecord(**{**fields, **changes})


def _text(**changes) -> str:
    """The record as the agent writes it, with `changes` to its JSON (a value of `...` drops the field)."""
    data = json.loads(_record().to_json())
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    return json.dumps(data)


def test_the_record_carries_its_format_and_reads_back_as_written():
    rec = _record()
    data = json.loads(rec.to_json())
    assert data["format"] == 1 and list(data)[0] == "format"
    assert ServerRecord.from_json(rec.to_json()) == rec


def test_an_unknown_start_time_is_written_as_null_and_read_back_as_unknown():
    rec = _record(start_ticks=0)
    assert json.loads(rec.to_json())["start_ticks"] is None  # never a 0 a later agent would take for a start time
    assert ServerRecord.from_json(rec.to_json()).start_ticks == 0


def test_the_previous_versions_record_is_still_read():
    """No "format", every field asdict() wrote, start_ticks 0 where /proc could not say; and an older one without
    the fields added since (env, segments, readiness timeout, TMPDIR)."""
    previous = asdict(_record(start_ticks=0))
    assert ServerRecord.from_json(json.dumps(previous)) == _record(start_ticks=0)
    older = {k: v for k, v in asdict(_record()).items()
             if k not in ("ready_ms", "env", "shm_segments", "readiness_timeout_s", "tmp_dir")}
    assert ServerRecord.from_json(json.dumps(older)) == _record(ready_ms=None, env={}, shm_segments=[],
                                                              readiness_timeout_s=None, tmp_dir=None)
    # int seconds (a TOML integer) and an unknown key (a later format-1 agent's) are fine
    assert ServerRecord.from_json(_text(readiness_timeout_s=600, extra="x")).readiness_timeout_s == 600.0
    assert ServerRecord.from_json(_text(run_id=None)).run_id is None


@pytest.mark.parametrize("key, value, words", [
    ("start_ticks", "123456", '"start_ticks" is "123456", not a positive integer or null'),
    ("start_ticks", 123456.0, '"start_ticks" is 123456.0, not a positive integer'),
    ("start_ticks", True, '"start_ticks" is true'),
    ("start_ticks", 0, '"start_ticks" is 0, not a positive integer'),  # format 1 writes null for unknown
    ("start_ticks", -3, '"start_ticks" is -3'),
    ("start_ticks", ..., '"start_ticks" is missing'),
    ("pid", "4242", '"pid" is "4242", not an integer from 1 to 4194304'),
    ("pid", 0, '"pid" is 0'),
    ("pid", 1 << 22 | 1, '"pid" is 4194305'),  # no such pid: os.kill would overflow
    ("pid", None, '"pid" is null'),
    ("pgid", [4242], '"pgid" is [4242]'),
    ("run_id", "7", '"run_id" is "7", not a positive integer or null'),
    ("run_id", 7.5, '"run_id" is 7.5'),
    ("run_id", ..., '"run_id" is missing'),
    ("argv", [], '"argv" is [], not a command line'),
    ("argv", "vllm serve m", '"argv" is "vllm serve m", not a list of strings'),
    ("argv", ["vllm", 3], '"argv" is ["vllm", 3], not a list of strings'),
    ("argv", [""], '"argv" is [""], not a command line'),
    ("token", ..., '"token" is missing'),
    ("token", "", '"token" is "", not a non-empty string'),
    ("token", 1234, '"token" is 1234, not a non-empty string'),
    ("token", "not-a-run-token", '"token" is "not-a-run-token", not a run token (16 lowercase hex digits)'),
    ("token", "0123456789ABCDEF", '"token" is "0123456789ABCDEF", not a run token'),
    ("profile", 5, '"profile" is 5, not a non-empty string'),
    ("log_path", None, '"log_path" is null, not a non-empty string'),
    ("started_ms", "1700000000000", '"started_ms" is "1700000000000"'),
    ("ready_ms", 1.5, '"ready_ms" is 1.5'),
    ("env", {"A": 1}, '"env" is {"A": 1}, not an object of strings'),
    ("env", ["A=1"], '"env" is ["A=1"], not an object of strings'),
    ("shm_segments", "/dev/shm/psm_ab12", '"shm_segments" is "/dev/shm/psm_ab12", not a list of strings'),
    ("shm_segments", None, '"shm_segments" is null, not a list of strings'),
    ("readiness_timeout_s", "1200", '"readiness_timeout_s" is "1200", not a number of seconds above 0'),
    ("readiness_timeout_s", 0, '"readiness_timeout_s" is 0'),
    ("readiness_timeout_s", False, '"readiness_timeout_s" is false'),
    ("tmp_dir", 5, '"tmp_dir" is 5, not a non-empty string or null'),
    ("format", 2, '"format" is 2: written by a newer agent (this one reads format 1)'),
    ("format", "1", '"format" is "1", not a format number'),
    ("format", 0, '"format" is 0, not a format number'),
    ("format", True, '"format" is true, not a format number'),
])
def test_a_field_of_another_type_or_range_is_refused_naming_it(key, value, words):
    with pytest.raises(ValueError) as exc:
        ServerRecord.from_json(_text(**{key: value}))
    assert words in str(exc.value)


@pytest.mark.parametrize("text, words", [
    (_text().replace('"start_ticks": 123456', '"start_ticks": 1e999'), "1e999"),
    (_text().replace('"start_ticks": 123456', '"start_ticks": NaN'), "NaN"),
    (_text().replace('"start_ticks": 123456', '"start_ticks": -Infinity'), "-Infinity"),
    (_text().replace('"start_ticks": 123456', '"start_ticks": 99999999999999999999999'), "out of range"),
    (_text().replace('"readiness_timeout_s": 1200.0', '"readiness_timeout_s": Infinity'), "Infinity"),
    ("[1, 2]", "not a JSON object"),
    ('{"pid": 1', "Expecting"),
], ids=["1e999", "NaN", "-Infinity", "huge-int", "infinite-seconds", "list", "truncated"])
def test_json_no_agent_writes_is_refused(text, words):
    with pytest.raises(ValueError) as exc:
        ServerRecord.from_json(text)
    assert words in str(exc.value)


def test_read_record_says_which_field_is_wrong_and_that_nothing_is_adopted_or_signalled(tmp_path):
    p = tmp_path / "serving.json"
    assert launcher.read_record(p) == (None, None)
    p.write_text(_text(start_ticks=None))
    assert launcher.read_record(p) == (_record(start_ticks=0), None)
    p.write_text(_text(start_ticks="123456"))
    rec, err = launcher.read_record(p)
    assert rec is None and err is not None
    assert err.startswith(f'{p} is not a valid server record ("start_ticks" is "123456"'), err
    assert "nothing is adopted and nothing is signalled" in err


def test_a_symlink_or_fifo_in_place_of_the_record_is_unreadable_not_followed_nor_waited_on(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(_record().to_json())
    link = tmp_path / "serving.json"
    link.symlink_to(target)
    rec, err = launcher.read_record(link)
    assert rec is None and f"{link} is a symbolic link, not a regular file" in (err or "")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    rec, err = launcher.read_record(fifo)  # a plain read would block here until the test's timeout
    assert rec is None and f"{fifo} is a FIFO (named pipe)" in (err or "") and time.monotonic() - t0 < 5
    big = tmp_path / "big.json"
    big.write_text(" " * (2 << 20))
    assert "too large" in (launcher.read_record(big)[1] or "")


# ------------------------------------------------------------------------------------------ spawn's start time


def _sleeper(tmp_path, *extra: str) -> launcher.ServerProcess:
    script = tmp_path / "server.py"
    script.write_text("import time\ntime.sleep(60)\n")
    proc = launcher.spawn([sys.executable, str(script), *extra], tmp_path / "logs" / "r.log", {}, "alpha")
    wait_for(lambda: procs.environ_has(proc.pid, procs.RUN_TOKEN_ENV, proc.record.token), 10, what="exec'd")
    return proc


def _end(proc: launcher.ServerProcess) -> None:
    proc.close()
    if proc.popen is not None and proc.popen.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.popen.wait(5)


def test_spawn_reads_the_start_time_again_and_records_unknown_rather_than_zero(tmp_path, monkeypatch):
    real = procs.stat
    misses = {"n": 3}

    def stat(pid):
        if misses["n"] > 0:
            misses["n"] -= 1
            return None
        return real(pid)

    monkeypatch.setattr(procs, "stat", stat)
    proc = _sleeper(tmp_path)
    try:
        assert misses["n"] == 0 and proc.record.start_ticks == real(proc.pid).start_ticks  # read on the 4th try
    finally:
        _end(proc)
    monkeypatch.setattr(procs, "stat", lambda pid: None)  # /proc never answers
    sleeps: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr(launcher.time, "sleep", sleeps.append)
    proc = launcher.spawn([sys.executable, str(tmp_path / "server.py")], tmp_path / "logs" / "r2.log", {}, "alpha")
    monkeypatch.setattr(procs, "stat", real)
    monkeypatch.setattr(launcher.time, "sleep", real_sleep)
    try:
        assert proc.record.start_ticks == 0 and json.loads(proc.record.to_json())["start_ticks"] is None
        assert sleeps == [launcher.START_READ_GAP_S] * (launcher.START_READS - 1)
    finally:
        _end(proc)


# ------------------------------------------------------------------------------------------ identity on the token


@pytest.mark.parametrize("start", ["wrong", "unknown"])
def test_a_live_server_whose_recorded_start_time_is_wrong_is_adopted_on_its_token(tmp_path, start):
    proc = _sleeper(tmp_path)
    try:
        real = procs.stat(proc.pid).start_ticks
        rec = ServerRecord.from_json(proc.record.to_json())
        rec.start_ticks = real + 1 if start == "wrong" else 0
        found = launcher.identify(rec)
        assert found.reason is None and "adopted on its run token" in (found.note or ""), found
        assert ("start time differs" if start == "wrong" else "start time not recorded") in (found.note or "")
        adopted, found = launcher.take_over(rec)
        assert adopted is not None and adopted.adopted and adopted.pid == proc.pid
        assert rec.start_ticks == real  # corrected: the next agent's check needs no token
        assert launcher.identify(rec).note is None
        adopted.close()
    finally:
        _end(proc)


@pytest.mark.parametrize("edit", ["argv", "pgid"])
async def test_a_token_carrier_that_cannot_be_proven_the_server_is_held_and_never_signalled(tmp_path, edit):
    """The start time differs and the command line (or the process group) does not match: not adopted, but the
    token says it is the run's: `kill_leftovers` (which SIGKILLs every token carrier) must not touch the run."""
    proc = _sleeper(tmp_path)
    try:
        rec = ServerRecord.from_json(proc.record.to_json())
        rec.start_ticks += 1
        if edit == "argv":
            rec.argv = [*rec.argv, "--other"]
        else:
            rec.pgid = rec.pid + 1
        found = launcher.identify(rec, settle_s=0)
        assert found.reason is not None and found.ours, found
        assert "carries the run's token" in found.reason
        res = await launcher.kill_leftovers(rec, wait_s=1)
        assert res.pids == [] and not res.leader_was_dead and not res.removed
        await asyncio.sleep(0.2)
        assert proc.popen.poll() is None and procs.alive(proc.pid)
    finally:
        _end(proc)


async def test_leftovers_of_a_dead_leader_are_still_killed(tmp_path):
    """The recorded pid is gone: what carries the run's token is a leftover (today's cleaning, unchanged)."""
    proc = launcher.spawn(["/bin/sh", "-c", "sleep 60 & exit 0"], tmp_path / "logs" / "r.log", {}, "alpha")
    try:
        proc.popen.wait(10)
        left = wait_for(lambda: launcher.leftovers(proc.record), 10, what="the orphaned sleep")
        assert launcher.check_adoptable(proc.record) == f"pid {proc.pid} is no longer running"
        res = await launcher.kill_leftovers(proc.record, wait_s=5)
        assert res.pids == left and not res.survivors
        assert not any(procs.alive(p) for p in left)
    finally:
        for pid in launcher.leftovers(proc.record):
            os.kill(pid, signal.SIGKILL)
        proc.close()
