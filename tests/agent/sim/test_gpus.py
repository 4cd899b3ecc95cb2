"""Simulated GPUs: idle node without a server, memory and activity coupled to live engines only."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest

from lynxtop.agent.gpu.backend import open_backend
from lynxtop.sim.gpus import SimScenario
from lynxtop.sim.state import EngineState, Holder, process_identity, write_state


def engine_state(pid: int, phase: str = "ready", **kw) -> EngineState:
    holders = [Holder(gpu=g, pid=pid, start_ticks=process_identity(pid), mem_bytes=120 * 2**30) for g in range(8)]
    return EngineState(engine_pid=pid, api_pid=pid, model="m", tp=8, gpus=list(range(8)), phase=phase,
                       holders=holders, updated_unix=time.time(), **kw)


def test_no_server_is_an_idle_8xh200_node(tmp_path):
    scen = SimScenario(tmp_path / "nothing-here")
    assert [g.name for g in scen.gpus()] == ["NVIDIA H200"] * 8
    assert len({g.uuid for g in scen.gpus()}) == 8
    st = scen.state(0, time.monotonic())
    assert st.mem_used_bytes == 0 and st.processes == [] and st.util_gpu_pct == 0
    assert st.power_w < 100 and st.throttle_reasons == 0x1


def test_decode_and_prefill_look_different(tmp_path):
    me = os.getpid()
    write_state(tmp_path, engine_state(me, busy_frac=1.0, decode_frac=1.0, mean_batch=12,
                                       generation_tokens_per_s=86.0))
    decode = SimScenario(tmp_path).state(2, time.monotonic())
    write_state(tmp_path, engine_state(me, busy_frac=1.0, prefill_frac=1.0, mean_batch=1,
                                       prompt_tokens_per_s=620.0))
    prefill = SimScenario(tmp_path).state(2, time.monotonic())
    assert decode.processes == [(me, 120 * 2**30)] and decode.mem_used_bytes == 120 * 2**30
    assert decode.dram_bw_pct > decode.tensor_active_pct  # decode is memory-bound
    assert prefill.tensor_active_pct > prefill.dram_bw_pct  # prefill is tensor-core bound
    assert sum(decode.nvlink_tx_bytes_per_s) > 0 and sum(prefill.nvlink_tx_bytes_per_s) > sum(
        decode.nvlink_tx_bytes_per_s)
    assert decode.power_w > 300 and decode.util_gpu_pct == 100


def test_memory_is_released_only_when_the_holders_exit(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        write_state(tmp_path, engine_state(child.pid))
        scen = SimScenario(tmp_path)
        assert scen.state(0, time.monotonic()).mem_used_bytes == 120 * 2**30
    finally:
        child.kill()
        child.wait()
    assert SimScenario(tmp_path).state(0, time.monotonic()).mem_used_bytes == 0  # zombie reaped: gone


def test_temperature_lags_power(tmp_path):
    """The load is seen at t0 + 1; the temperature is the state's course read at a time (`temp_at`)."""
    me = os.getpid()
    scen = SimScenario(tmp_path)
    t0 = time.monotonic()
    cold = scen.state(0, t0).temp_at(t0)
    write_state(tmp_path, engine_state(me, busy_frac=1.0, prefill_frac=1.0))
    scen._read_at = None  # re-read now
    warm_1s = scen.state(0, t0 + 1).temp_at(t0 + 2)
    warm_60s = scen.state(0, t0 + 61).temp_at(t0 + 61)
    target = scen.p.ambient_temp_c + scen.p.temp_c_per_w * scen.state(0, t0 + 600).power_w
    assert cold < warm_1s < warm_60s
    assert warm_1s - cold < 0.1 * (target - cold)  # a second of load barely warms the die...
    assert warm_60s - cold > 0.9 * (target - cold)  # ...a minute gets it close to steady state


def test_the_fake_nvml_backend_wraps_the_scenario(tmp_path):
    me = os.getpid()
    write_state(tmp_path, engine_state(me, busy_frac=0.5, decode_frac=0.5, mean_batch=4))
    nvml = open_backend("sim", str(tmp_path), SimScenario)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(5)
    assert nvml.nvmlDeviceGetMemoryInfo(h).used >= 120 * 2**30
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)] == [me]
    assert nvml.nvmlDeviceGetCount() == 8


def test_broken_or_foreign_state_files_are_ignored(tmp_path):
    (tmp_path / "engine-1.json").write_text("{not json")
    (tmp_path / "engine-2.json").write_text('{"unexpected": true}')
    (tmp_path / "engine-3.json").write_text("[]")
    (tmp_path / "notes.txt").write_text("hello")
    write_state(tmp_path, engine_state(os.getpid()))
    st = SimScenario(tmp_path).state(1, time.monotonic())
    assert st.processes == [(os.getpid(), 120 * 2**30)]


def test_the_gpus_of_one_group_differ_slightly_and_always_the_same_way(tmp_path):
    write_state(tmp_path, engine_state(os.getpid(), busy_frac=1.0, decode_frac=1.0, mean_batch=12,
                                       generation_tokens_per_s=86.0))
    now = time.monotonic()
    states = [SimScenario(tmp_path).state(i, now) for i in range(8)]
    again = [SimScenario(tmp_path).state(i, now) for i in range(8)]
    for attr in ("sm_active_pct", "dram_bw_pct", "power_w", "temp_c"):
        values = [getattr(st, attr) for st in states]
        assert len({round(v, 3) for v in values}) == 8, attr  # never identical to the digit
        mean = sum(values) / 8
        assert max(abs(v - mean) for v in values) < 0.08 * mean, attr  # but only slightly apart
        assert values == [getattr(st, attr) for st in again], attr  # fixed per GPU index, not random
    assert {st.util_gpu_pct for st in states} == {100.0} and {st.mem_used_bytes for st in states} == {120 * 2**30}
    assert {st.sm_clock_mhz for st in states} == {1980} and {st.throttle_reasons & 0x20 for st in states} == {0}


def test_a_straggler_runs_hot_and_slow_while_its_group_waits(tmp_path):
    write_state(tmp_path, engine_state(os.getpid(), busy_frac=1.0, decode_frac=1.0, mean_batch=12,
                                       generation_tokens_per_s=66.0, straggler_gpu=3, straggler_slowdown=1.3))
    now = time.monotonic()
    scen = SimScenario(tmp_path)
    states = [scen.state(i, now) for i in range(8)]
    slow, others = states[3], states[:3] + states[4:]
    assert slow.throttle_reasons & 0x20 and not any(st.throttle_reasons & 0x20 for st in others)  # SW thermal
    assert slow.sm_clock_mhz == round(1980 / 1.3) and {st.sm_clock_mhz for st in others} == {1980}
    assert slow.temp_c > max(st.temp_c for st in others) + 8
    assert slow.sm_active_pct > 1.15 * max(st.sm_active_pct for st in others)  # the others idle in the all-reduce
    assert {st.util_gpu_pct for st in states} == {100.0}  # utilization alone does not show it


def test_the_gpu_model_builds_each_gpu_once_per_time_step(tmp_path):
    """Issue 29.3: eight GPUs × a dozen NVML calls a tick ask for the same moment; the model answers them from
    one state per GPU per step (the state directory's re-read), not one rebuilt per call."""
    from lynxtop.sim.gpus import REREAD_S

    write_state(tmp_path, engine_state(os.getpid(), busy_frac=1.0, decode_frac=1.0, mean_batch=12))
    scen = SimScenario(tmp_path)
    now = time.monotonic()
    first = [scen.state(i, now) for i in range(8)]
    within = [scen.state(i, now + REREAD_S / 2) for i in range(8)]
    assert all(a is b for a, b in zip(first, within, strict=True))
    assert first[3].mem_used_bytes == 120 * 2**30 and first[3].sm_active_pct > 0
    later = scen.state(3, now + 1.5 * REREAD_S)  # past the step: (now + REREAD_S) - now may round below it
    assert later.mem_used_bytes == first[3].mem_used_bytes  # (the same load on a settled die: the same state)


def test_a_gpu_is_rebuilt_only_when_its_load_moves(tmp_path):
    """Issue 29.3: a step rebuilds only the GPUs on which a republished engine put a new load. The others keep
    their state object, which the fake NVML takes as unchanged rates; the readings stay what a rebuild would
    give. A die still heating towards its new power keeps its state too (session 9): the state carries the
    thermal course and the temperature is worked out when read."""
    from lynxtop.sim.gpus import REREAD_S

    me = os.getpid()
    ticks = process_identity(me)

    def engine(gpu: int, busy: float) -> EngineState:
        return EngineState(engine_pid=1000 + gpu, api_pid=me, model="m", tp=1, gpus=[gpu], phase="ready",
                           holders=[Holder(gpu=gpu, pid=me, start_ticks=ticks, mem_bytes=2**30)],
                           updated_unix=time.time(), busy_frac=busy, decode_frac=busy, mean_batch=8)

    write_state(tmp_path, engine(0, 0.5))
    write_state(tmp_path, engine(1, 0.5))
    scen = SimScenario(tmp_path)
    t = 9000.0
    first = [scen.state(i, t) for i in range(3)]
    steps = [[scen.state(i, t + k * 1.5 * REREAD_S) for i in range(3)] for k in range(1, 4)]
    assert all(step[i] is first[i] for step in steps for i in range(3))  # nothing moved: no GPU rebuilt
    write_state(tmp_path, engine(1, 0.9))  # GPU 1's engine publishes a busier interval
    t2 = t + 6 * REREAD_S
    after = [scen.state(i, t2) for i in range(3)]
    assert after[0] is first[0] and after[2] is first[2]
    assert after[1] is not first[1] and after[1].util_gpu_pct == 90.0 and after[1].power_w > first[1].power_w
    times = [t2 + k * 1.5 * REREAD_S for k in range(1, 4)]
    heating = [scen.state(1, tk) for tk in times]  # its die warms towards the new power: the same state
    temps = [after[1].temp_at(t2)] + [st.temp_at(tk) for st, tk in zip(heating, times, strict=True)]
    assert all(st is after[1] for st in heating) and temps == sorted(temps) and temps[-1] > temps[0]
    fresh = SimScenario(tmp_path).state(0, t2)
    assert fresh.sm_active_pct == after[0].sm_active_pct and fresh.power_w == after[0].power_w


def test_unchanged_state_files_are_not_parsed_again(tmp_path):
    from lynxtop.sim.state import read_states, remove_state

    me = os.getpid()
    write_state(tmp_path, engine_state(me, busy_frac=0.5))
    cache: dict = {}
    first = read_states(tmp_path, cache)
    again = read_states(tmp_path, cache)
    assert len(first) == 1 and again[0] is first[0]  # same file: the parsed state is reused
    write_state(tmp_path, engine_state(me, busy_frac=0.25))  # a publish replaces the file
    fresh = read_states(tmp_path, cache)
    assert fresh[0] is not first[0] and fresh[0].busy_frac == 0.25
    remove_state(tmp_path, me)
    assert read_states(tmp_path, cache) == [] and cache == {}


def test_liveness_is_looked_up_in_proc_once_per_holder(tmp_path, monkeypatch):
    """Issue 29.3: the model reads the state directory five times a second and the engines republish twice a
    second with the same holders. A holder's identity is read from /proc once, when its pidfd is opened; then
    the pidfd says whether it exited. Over 3 s of 0.1 s looks (30 looks, 15 directory reads, 6 publishes) an
    engine of one holder is looked up once (it was 3 or 4 times with a /proc read a second, 15 with none kept)."""
    import lynxtop.sim.state as state_mod

    me = os.getpid()
    lookups: list[int] = []
    real = state_mod._start_ticks

    def counting(pid: int) -> int | None:
        lookups.append(pid)
        return real(pid)

    ticks = process_identity(me)

    def one_holder(**kw) -> EngineState:
        return EngineState(engine_pid=me, api_pid=me, model="m", tp=1, gpus=[0], phase="ready",
                           holders=[Holder(gpu=0, pid=me, start_ticks=ticks, mem_bytes=2**30)],
                           updated_unix=time.time(), busy_frac=1.0, decode_frac=1.0, **kw)

    write_state(tmp_path, one_holder())
    monkeypatch.setattr(state_mod, "_start_ticks", counting)
    scen = SimScenario(tmp_path)
    t0 = 5000.0
    for k in range(30):
        if k % 5 == 0:
            write_state(tmp_path, one_holder(running=k))  # a publish: a new file, the same holders
        st = scen.state(0, t0 + 0.1 * k)
        assert st.mem_used_bytes == 2**30 and st.processes == [(me, 2**30)]
    assert lookups == [me]
    assert scen.engines(t0 + 3.0)[0].running == 25  # the publishes were read all the same


def _open_fds() -> int:
    """This process' pidfds (the model's holder watches)."""
    return sum(_fd_targets().count(t) for t in ("anon_inode:[pidfd]", "pidfd:"))


def _fd_targets() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass  # the listing's own fd, closed since
    return out


def _state_fds(state_dir) -> list[str]:
    """The engine state files this process holds open (the model keeps them open: `StateFiles`)."""
    return sorted(t.rsplit("/", 1)[-1] for t in _fd_targets() if t.startswith(str(state_dir) + "/"))


def test_memory_is_freed_at_the_first_read_after_the_holders_exit_and_their_fds_closed(tmp_path):
    """The holders' pidfds: a killed engine's memory goes at the model's next step (REREAD_S), not a second
    later, and the pidfd of a holder no state file names any more is closed (no fd leak)."""
    from lynxtop.sim.state import remove_state

    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    try:
        fds = _open_fds()
        for c in children:
            st = engine_state(c.pid)
            for h in st.holders:
                h.mem_bytes = 40 * 2**30  # two engines fit on one GPU
            write_state(tmp_path, st)
        scen = SimScenario(tmp_path)
        t0 = 7000.0
        assert scen.state(0, t0).mem_used_bytes == 2 * 40 * 2**30
        assert _open_fds() == fds + 2  # one pidfd per holder process
        assert _state_fds(tmp_path) == sorted(f"engine-{c.pid}.state" for c in children)
        children[0].kill()
        children[0].wait()
        assert scen.state(0, t0 + 0.25).mem_used_bytes == 40 * 2**30  # the next step, not t0 + 1 s
        assert [e.engine_pid for e in scen.engines(t0 + 0.3)] == [children[1].pid]
        assert _open_fds() == fds + 1  # the exited holder's fd is closed
        remove_state(tmp_path, children[1].pid)  # the engine goes away (its process still runs)
        assert scen.state(0, t0 + 0.5).mem_used_bytes == 0 and _open_fds() == fds
        assert _state_fds(tmp_path) == [f"engine-{children[0].pid}.state"]  # the removed file's fd is closed
    finally:
        for c in children:
            c.kill()
            c.wait()


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "proc"])
def test_an_engine_whose_holders_exit_frees_its_memory_within_a_second(tmp_path, monkeypatch, pidfd):
    """With pidfds, or where pidfd_open is refused (a seccomp filter, an old kernel) and /proc answers."""
    if not pidfd:
        def refused(pid: int, flags: int = 0) -> int:
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(os, "pidfd_open", refused)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        write_state(tmp_path, engine_state(child.pid))
        scen = SimScenario(tmp_path)
        t0 = 7000.0
        assert scen.state(0, t0).mem_used_bytes == 120 * 2**30
    finally:
        child.kill()
        child.wait()
    assert scen.state(0, t0 + 1.05).mem_used_bytes == 0  # the next look past the liveness interval
    assert scen.engines(t0 + 1.3) == []


def test_a_state_file_reads_back_equal_to_what_was_written(tmp_path):
    from lynxtop.sim.state import load_state, read_states, state_path

    me = os.getpid()
    st = EngineState(engine_pid=me, api_pid=me + 1, model="deepseek-ai/DeepSeek-V3 ✓", tp=2, gpus=[3, 5],
                     phase="loading weights", running=7, waiting=2, kv_usage=0.25, busy_frac=0.5, prefill_frac=0.1,
                     decode_frac=0.4, mean_batch=3.5, prompt_tokens_per_s=12.5, generation_tokens_per_s=99.0,
                     straggler_gpu=5, straggler_slowdown=1.5, updated_unix=1.7e9,
                     holders=[Holder(gpu=3, pid=me, start_ticks=process_identity(me), mem_bytes=2**40),
                              Holder(gpu=5, pid=me, start_ticks=None, mem_bytes=7)])
    write_state(tmp_path, st)
    assert load_state(state_path(tmp_path, me)) == st
    plain = EngineState(engine_pid=me + 2, api_pid=me, model="", tp=1, gpus=[], phase="ready")
    write_state(tmp_path, plain)
    assert load_state(state_path(tmp_path, me + 2)) == plain  # no holders, no straggler: read back as such
    assert read_states(tmp_path) == [st]  # the one without holders holds nothing


def test_a_state_file_of_another_layout_or_cut_short_is_skipped(tmp_path):
    from lynxtop.sim.state import read_states, state_path

    me = os.getpid()
    write_state(tmp_path, engine_state(me))
    good = state_path(tmp_path, me).read_bytes()
    for pid, raw in ((1, good[:-3]), (2, good[:40]), (3, b'{"engine_pid": 3}'), (4, b""), (5, good + b"x"),
                     (6, b"LXES\x01\x00" + good[6:])):
        (tmp_path / f"engine-{pid}.state").write_bytes(raw)
    assert [st.engine_pid for st in read_states(tmp_path)] == [me]


def test_the_gpu_model_parses_no_json_per_publish(tmp_path, monkeypatch):
    """Issue 29.3: the model reads every engine's publish (16 a second at DP8); a JSON parse of each was ~40 µs
    with its dataclass building, the fixed binary layout a fraction of that. No JSON is parsed on the way."""
    import json

    def no_json(*a, **kw):
        raise AssertionError("a state file parsed as JSON")

    me = os.getpid()
    write_state(tmp_path, engine_state(me, busy_frac=0.5))
    monkeypatch.setattr(json, "loads", no_json)
    scen = SimScenario(tmp_path)
    assert scen.state(0, 9000.0).mem_used_bytes == 120 * 2**30 and scen.state(0, 9000.0).util_gpu_pct == 50.0


def test_a_steady_load_on_a_warming_die_builds_nothing_and_is_asked_once_a_step(tmp_path, monkeypatch):
    """Issue 29.3, session 9: the simulated GPUs' cost inside the agent. Through the fake NVML at 10 Hz for 3 s
    under a steady load that has just started (every die warming, τ 20 s): each GPU's state is built once (was
    once a step while its die settled: 16 builds each) and so starts one counter segment; the fake asks the
    model once per model step (15 in 3 s), not on every tick (30); the temperature NVML reports still rises
    along the thermal lag, to what a fresh model gives at that moment."""
    from lynxtop.agent.gpu import fake_driver
    from lynxtop.agent.gpu.fake import FakeNvml
    from lynxtop.sim import gpus as gpus_mod

    builds: list[int] = []
    asks: list[int] = []
    segments: list[int] = []
    real_build, real_state, real_segment = SimScenario._build, SimScenario.state, fake_driver.Segment

    def counting_build(self, index, now, ld):
        builds.append(index)
        return real_build(self, index, now, ld)

    def counting_state(self, index, now):
        asks.append(index)
        return real_state(self, index, now)

    def counting_segment(*a, **kw):
        segments.append(1)
        return real_segment(*a, **kw)

    monkeypatch.setattr(gpus_mod.SimScenario, "_build", counting_build)
    monkeypatch.setattr(gpus_mod.SimScenario, "state", counting_state)
    monkeypatch.setattr(fake_driver, "Segment", counting_segment)
    scen = SimScenario(tmp_path)
    t = [4000.0]
    nvml = FakeNvml(scen, clock=lambda: t[0])
    nvml.nvmlInit()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]  # idle: a cold die on each
    write_state(tmp_path, engine_state(os.getpid(), busy_frac=1.0, prefill_frac=1.0))
    t[0] += 1.0
    builds.clear(), asks.clear(), segments.clear()
    temps = []
    for k in range(30):
        t[0] = 4001.0 + 0.1 * k + 1e-6
        temps.append([nvml.nvmlDeviceGetTemperature(h, 0) for h in handles])
        for h in handles:
            nvml.nvmlDeviceGetPowerUsage(h), nvml.nvmlDeviceGetUtilizationRates(h)
            nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert sorted(builds) == list(range(8))  # the load changed once: one build a GPU
    assert len(segments) == 8  # and one new counter segment a GPU
    assert len(asks) <= 8 * 16  # once a model step (0.2 s) a GPU, not once a 0.1 s tick (8 * 30)
    assert all(temps[-1][i] > temps[0][i] for i in range(8))  # the dies warm all the same
    assert all(a <= b for row, nxt in zip(temps[:-1], temps[1:], strict=True) for a, b in zip(row, nxt, strict=True))
    cold = SimScenario(tmp_path / "idle").state(0, 0.0).temp_c  # where GPU 0's die started, when the load came
    hot = scen.state(0, t[0]).temp_target_c
    tau = scen.p.temp_time_constant_s
    assert round(hot + (cold - hot) * math.exp(-(t[0] - 4001.0 - 1e-6) / tau)) == temps[-1][0]  # the exact lag


def test_an_unchanged_state_file_asks_no_liveness_while_no_holder_exited(tmp_path, monkeypatch):
    """Issue 29.3, session 9: the model reads the directory five times a second; a file not replaced since the
    last read, none of whose watched holders exited (the read's one poll says so), keeps its verdict without a
    question per holder. A holder that exits is still seen at the next read."""
    from lynxtop.sim.state import PidWatch, read_states

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        write_state(tmp_path, engine_state(child.pid))
        questions: list[object] = []
        real = PidWatch.alive

        def counting(self, proc):
            questions.append(proc)
            return real(self, proc)

        monkeypatch.setattr(PidWatch, "alive", counting)
        cache: dict = {}
        watch = PidWatch()
        assert watch.usable
        for k in range(10):
            assert len(read_states(tmp_path, cache, 100.0 + 0.2 * k, watch=watch)) == 1
        assert len(questions) == 1  # the first read only (one holder process): was one a read
        child.kill()
        child.wait()
        assert read_states(tmp_path, cache, 102.2, watch=watch) == []
        watch.close()
    finally:
        child.kill()
        child.wait()
