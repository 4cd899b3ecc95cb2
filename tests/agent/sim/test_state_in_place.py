"""Engine state published in place (issue 29.3): the GPU model keeps each engine's file open and `pread`s it."""

from __future__ import annotations

import os
import time

import pytest

import lynxtop.sim.state as state_mod
from lynxtop.sim.gpus import SimScenario
from lynxtop.sim.state import (
    SLOT,
    EngineState,
    Holder,
    StateFiles,
    Torn,
    _pack,
    load_state,
    process_identity,
    read_states,
    state_path,
    write_state,
)


def engine(pid: int, gpu: int, busy: float, model: str = "m") -> EngineState:
    me = os.getpid()
    return EngineState(engine_pid=pid, api_pid=me, model=model, tp=1, gpus=[gpu], phase="ready",
                       holders=[Holder(gpu=gpu, pid=me, start_ticks=process_identity(me), mem_bytes=2**30)],
                       busy_frac=busy, decode_frac=1.0, mean_batch=8, updated_unix=time.time())


def _age_dir(path) -> None:
    """The directory last changed 10 s ago, as after an engine's start (its listing can then be trusted)."""
    old = time.time_ns() - 10_000_000_000
    os.utime(path, ns=(old, old))


def test_a_publish_of_the_same_size_keeps_the_file_and_a_bigger_one_replaces_it(tmp_path):
    write_state(tmp_path, engine(11, 0, 0.5))
    path = state_path(tmp_path, 11)
    ino = os.stat(path).st_ino
    write_state(tmp_path, engine(11, 0, 0.25))
    assert os.stat(path).st_ino == ino and os.path.getsize(path) == SLOT  # written in place
    assert load_state(path).busy_frac == 0.25
    write_state(tmp_path, engine(11, 0, 0.75, model="x" * SLOT))  # past its slot: a new file, atomically
    assert os.stat(path).st_ino != ino and os.path.getsize(path) == 2 * SLOT
    assert load_state(path).model == "x" * SLOT and not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_the_model_reads_a_publish_with_one_pread_and_no_listing(tmp_path, monkeypatch):
    """Steady DP engines: after the first listing each model step is one `pread` per engine (no scandir, stat,
    open or close), and every publish is seen; a file replaced under its name (new inode) or a new engine's
    file changes the directory and is listed and opened again."""
    for i in range(2):
        write_state(tmp_path, engine(100 + i, i, 0.5))
    _age_dir(tmp_path)
    scen = SimScenario(tmp_path)
    t = 9000.0
    assert scen.state(0, t).util_gpu_pct == 50.0
    counted = {"scandir": 0, "open": 0, "stat": 0}
    looking = [False]
    for fn in counted:
        real = getattr(os, fn)

        def counting(*a, _real=real, _fn=fn, **kw):
            if looking[0]:
                counted[_fn] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(os, fn, counting)
    for k in range(1, 6):
        write_state(tmp_path, engine(100, 0, 0.5 + 0.1 * k))  # a publish, in place
        looking[0] = True
        t += 0.25
        busy = scen.state(0, t).util_gpu_pct
        looking[0] = False
        assert busy == pytest.approx(100 * (0.5 + 0.1 * k))
    assert counted == {"scandir": 0, "open": 0, "stat": 5}  # the directory's stat, once a step
    os.unlink(state_path(tmp_path, 101))
    write_state(tmp_path, engine(101, 1, 0.3))  # the same name, another file
    write_state(tmp_path, engine(102, 2, 0.2))
    t += 0.25
    assert (scen.state(1, t).util_gpu_pct, scen.state(2, t).util_gpu_pct) == (30.0, 20.0)


def _torn(a: bytes, b: bytes) -> bytes:
    """A read that caught a publish half written: the new record's start, the old one's end."""
    return b[:64] + a[64:]


def test_a_torn_read_is_read_again_and_else_answered_with_the_last_state(tmp_path, monkeypatch):
    old, new = _pack(engine(7, 0, 0.5), 1), _pack(engine(7, 0, 0.25), 2)
    with pytest.raises(Torn):
        state_mod._unpack(_torn(old, new))
    path = state_path(tmp_path, 7)
    path.write_bytes(old)
    files, cache = StateFiles(), {}
    assert [s.busy_frac for s in read_states(tmp_path, cache, 1.0, files=files)] == [0.5]
    reads = iter([_torn(old, new), new])  # torn once, then the whole new record
    real_pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: next(reads, None) or real_pread(fd, n, off))
    assert [s.busy_frac for s in read_states(tmp_path, cache, 2.0, files=files)] == [0.25]
    reads = iter([_torn(new, old)] * 2)  # torn twice: the last state read stands
    assert [s.busy_frac for s in read_states(tmp_path, cache, 3.0, files=files)] == [0.25]
    reads = iter([_torn(new, old)] * 2)  # and without one the file is skipped
    assert read_states(tmp_path, {}, 4.0, files=StateFiles()) == []
    files.close()


def test_a_publish_that_moves_only_figures_keeps_the_holders_and_their_verdict(tmp_path, monkeypatch):
    """A republish whose GPUs, holders, model and phase are byte for byte the last one's takes the last state's
    objects for them and its liveness verdict (no exit since); any other change is read afresh and asked."""
    write_state(tmp_path, engine(7, 0, 0.5))
    files, cache, watch = StateFiles(), {}, state_mod.PidWatch()
    first = read_states(tmp_path, cache, 1.0, watch=watch, files=files)[0]
    asked = []
    real_alive = state_mod.PidWatch.alive
    monkeypatch.setattr(state_mod.PidWatch, "alive", lambda self, proc: asked.append(proc) or real_alive(self, proc))
    write_state(tmp_path, engine(7, 0, 0.25))
    again = read_states(tmp_path, cache, 2.0, watch=watch, files=files)[0]
    assert again.busy_frac == 0.25 and again.holders is first.holders and again.gpus is first.gpus
    assert asked == []
    moved = engine(7, 0, 0.25, model="n")  # the same lengths, other bytes: read afresh
    moved.holders[0].mem_bytes = 2**31
    write_state(tmp_path, moved)
    third = read_states(tmp_path, cache, 3.0, watch=watch, files=files)[0]
    assert third.model == "n" and third.holders == moved.holders and third.holders is not first.holders
    assert len(asked) == 1
    watch.close()
    files.close()
