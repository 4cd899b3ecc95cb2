"""Proof of GPU sampling on real hardware: the real NVML backend under idle, matmul, copy and peer-copy load.

Run from the repository root on a GPU node (torch, psutil and nvidia-ml-py present, lynxtop need not be
installed: the repo's folders are imported through a temporary package of symlinks):

    python3 benchmarks/nvml_real.py            # ~40-70 s; never changes clocks, power limits or modes
    python3 benchmarks/nvml_real.py --fake     # the same measurement code on the fake NVML (no GPU, no torch)

Phases: idle; bf16 matmul loop on GPU 0; device-to-device copy loop on GPU 0 (after allocating a known size
to check memory accounting); with >= 2 GPUs, a peer copy GPU 0 -> GPU 1 for NVLink. The GPU load runs in a
child process so the sampler's own cost is measured undisturbed. Every check prints PASS/FAIL/ABSENT/SKIP and
the run goes on after a failure. Cost: the median CPU time of one full tick per GPU (thread CPU clock) and the
tick's wall time against the sum of the raw pynvml calls it makes, replayed one by one in the same run.
Last line: one JSON object {tick_cpu_ms_per_gpu, tick_vs_raw_nvml_ratio, checks, gpus, ...}. Exit 0 when no
check failed, 1 when one did, 2 when it could not run (no driver, no torch: the message says which).
"""

from __future__ import annotations

import argparse
import atexit
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def import_shim() -> Path:
    """Make `import lynxtop.agent…` load this checkout: a temp `lynxtop` package linking agent/, store/, contract/."""
    d = Path(tempfile.mkdtemp(prefix="lynxtop-shim-"))
    pkg = d / "lynxtop"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""lynxtop, imported from a source checkout by benchmarks/nvml_real.py."""\n')
    for name in ("agent", "store", "contract"):
        (pkg / name).symlink_to(REPO / name, target_is_directory=True)
    sys.path.insert(0, str(d))
    for mod in [m for m in sys.modules if m == "lynxtop" or m.startswith("lynxtop.")]:
        del sys.modules[mod]
    atexit.register(shutil.rmtree, d, True)  # removes the links, never what they point to
    return d


# ---------------------------------------------------------------------------------------------- the load

LOAD = r'''
import os, sys, time
import torch
dev = int(sys.argv[1])
torch.cuda.set_device(dev)
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
for _ in range(3):
    c = a @ b
torch.cuda.synchronize()
block = None
def say(*x):
    print(*x, flush=True)
say("ready")
for line in sys.stdin:
    cmd = line.split()
    if not cmd:
        continue
    if cmd[0] == "alloc":
        n = int(cmd[1])
        block = torch.empty(n, dtype=torch.uint8, device=dev)
        block.fill_(1)  # touch it: memory is committed, not just reserved
        torch.cuda.synchronize()
        say("allocated", n)
    elif cmd[0] == "matmul":
        end = time.time() + float(cmd[1]); n = 0
        say("started")
        t0 = time.time()
        while time.time() < end:
            for _ in range(20):
                c = a @ b
            torch.cuda.synchronize(); n += 20
        say("done", f"{2 * 8192**3 * n / (time.time() - t0) / 1e12:.0f} TFLOP/s")
    elif cmd[0] == "copy":
        half = block.numel() // 2
        src, dst = block[:half], block[half:2 * half]
        end = time.time() + float(cmd[1]); n = 0
        say("started")
        t0 = time.time()
        while time.time() < end:
            for _ in range(10):
                dst.copy_(src)
            torch.cuda.synchronize(); n += 10
        say("done", f"{2 * half * n / (time.time() - t0) / 1e9:.0f} GB/s read+write")
    elif cmd[0] == "p2p":
        x = torch.ones(1 << 30, dtype=torch.uint8, device=0)
        y = torch.empty(1 << 30, dtype=torch.uint8, device=1)
        y.copy_(x); torch.cuda.synchronize(0); torch.cuda.synchronize(1)
        end = time.time() + float(cmd[1]); n = 0
        say("started")
        t0 = time.time()
        while time.time() < end:
            for _ in range(5):
                y.copy_(x)
            torch.cuda.synchronize(0); torch.cuda.synchronize(1); n += 5
        say("done", f"{(1 << 30) * n / (time.time() - t0) / 1e9:.0f} GB/s GPU0->GPU1")
        del x, y
    elif cmd[0] == "exit":
        break
'''


class Load:
    """A child process holding a CUDA context and running one kind of load on command."""

    def __init__(self, device: int = 0):
        env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
        self.p = subprocess.Popen([sys.executable, "-c", LOAD, str(device)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        self.expect("ready", timeout=120)

    def send(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def expect(self, word: str, timeout: float) -> str:
        assert self.p.stdout is not None
        t = time.monotonic() + timeout
        while time.monotonic() < t:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"load process exited (code {self.p.poll()}) while waiting for {word!r}")
            if line.startswith(word):
                return line.strip()
        raise RuntimeError(f"load process did not say {word!r} within {timeout} s")

    def close(self) -> None:
        try:
            self.send("exit")
            self.p.wait(timeout=20)
        except Exception:
            self.p.kill()
            self.p.wait(timeout=10)


# ---------------------------------------------------------------------------------------------- measuring


class Recorder:
    """Forwards to a backend and records the nvml* calls one tick makes, to replay them raw."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.log: list[tuple[str, tuple, dict]] | None = None

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._inner, name)
        if not name.startswith("nvml"):
            return fn

        def rec(*args: Any, **kw: Any) -> Any:
            if self.log is not None:
                self.log.append((name, args, kw))
            return fn(*args, **kw)

        return rec


def replay(target: Any, calls: list[tuple[str, tuple, dict]]) -> tuple[int, dict[str, int]]:
    """Wall ns of each recorded call made directly on `target` (the pynvml module): their sum, and by name."""
    clock = time.perf_counter_ns
    total = 0
    by_name: dict[str, int] = {}
    for name, args, kw in calls:
        fn = getattr(target, name)
        t = clock()
        try:
            fn(*args, **kw)
        except Exception:
            pass  # the sampler met the same error; its cost counts all the same
        dt = clock() - t
        total += dt
        by_name[name] = by_name.get(name, 0) + dt
    return total, by_name


def measure_cost(sampler: Any, recorder_sampler: Any, recorder: Recorder, raw_target: Any, n_gpus: int,
                 rounds: int, gap_s: float) -> dict:
    """Median tick CPU/wall and raw NVML time, each tick and each replay `gap_s` after the last activity."""
    # steady state: GPM has a previous sample, slow readings are not due
    sampler.sample(set())
    recorder_sampler.sample(set())
    time.sleep(0.05)
    recorder.log = []
    recorder_sampler.sample(set())
    calls, recorder.log = recorder.log, None
    cpu, wall, raw = [], [], []
    by_name_all: dict[str, list[int]] = {}
    for _ in range(rounds):
        if gap_s:
            time.sleep(gap_s)
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        sampler.sample(set())
        wall.append(time.perf_counter_ns() - w0)
        cpu.append(time.thread_time_ns() - c0)
        if gap_s:
            time.sleep(gap_s)
        total, by_name = replay(raw_target, calls)
        raw.append(total)
        for k, v in by_name.items():
            by_name_all.setdefault(k, []).append(v)
    med_cpu, med_wall, med_raw = statistics.median(cpu), statistics.median(wall), statistics.median(raw)
    return {
        "tick_cpu_ms_per_gpu": round(med_cpu / 1e6 / max(n_gpus, 1), 4),
        "tick_vs_raw_nvml_ratio": round(med_wall / med_raw, 3) if med_raw else None,
        "tick_wall_ms": round(med_wall / 1e6, 4),
        "tick_cpu_ms": round(med_cpu / 1e6, 4),
        "raw_nvml_ms": round(med_raw / 1e6, 4),
        "raw_calls_per_tick": len(calls),
        "raw_ms_by_function": {k: round(statistics.median(v) / 1e6, 4) for k, v in sorted(by_name_all.items())},
    }


def gpm_nan_by_interval(nv: Any, reps: int = 4) -> dict:
    """How often GPM answers NaN (stored as NULL) for a given time between two samples, per interval."""
    from lynxtop.agent.gpu.gpm import GpmReader

    reader = GpmReader(nv, nv.nvmlDeviceGetHandleByIndex(0), 0)
    out = {}
    for interval in (0.005, 0.02, 0.05, 0.1, 0.2, 0.5):
        nulls = total = 0
        for _ in range(reps):
            reader.reset()
            reader.read()
            time.sleep(interval)
            vals = reader.read() or []
            nulls += sum(v is None for v in vals)
            total += len(vals)
        out[f"{interval * 1000:g}ms"] = f"{nulls}/{total} NULL"
    reader.close()
    return out


def measure_slow(sampler_cls: Any, factory: Any, n_gpus: int) -> dict:
    """The first tick reads the slow-cadence figures (energy ≈ 4 ms each) for every GPU: its CPU cost."""
    s = sampler_cls(factory, xid_events=False)
    s.open()
    c0 = time.thread_time_ns()
    s.sample(set())
    first = time.thread_time_ns() - c0
    s.close()
    return {"first_tick_with_slow_reads_cpu_ms_per_gpu": round(first / 1e6 / max(n_gpus, 1), 3)}


def call_costs(nv: Any, rounds: int = 50) -> dict:
    """Median wall and thread-CPU µs of single NVML calls on GPU 0: where a tick's time goes on this host."""
    h = nv.nvmlDeviceGetHandleByIndex(0)
    sample = nv.nvmlGpmSampleAlloc()
    calls = {
        "memory_v1": lambda: nv.nvmlDeviceGetMemoryInfo(h),
        "memory_v2": lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2),
        "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "power": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "processes": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
        "process_utilization": lambda: nv.nvmlDeviceGetProcessUtilization(h, 0),
        "gpm_sample": lambda: nv.nvmlGpmSampleGet(h, sample),
        "energy": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
    }
    out = {}
    for name, fn in calls.items():
        walls, cpus = [], []
        for _ in range(rounds if name != "energy" else 5):
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            try:
                fn()
            except Exception as e:
                out[name] = f"error: {e}"
                break
            walls.append(time.perf_counter_ns() - w0)
            cpus.append(time.thread_time_ns() - c0)
        if walls:
            out[name] = {"wall_us": round(statistics.median(walls) / 1e3, 1),
                         "cpu_us": round(statistics.median(cpus) / 1e3, 1)}
    nv.nvmlGpmSampleFree(sample)
    return out


def collect(sampler: Any, seconds: float, interval: float = 0.5) -> list[list[dict]]:
    """Ticks over a window; the first is dropped (its GPM interval straddles the phase change)."""
    sampler.sample(set())
    rows = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(interval)
        rows.append(sampler.sample(set()).gpu_rows)
    return rows


def med(rows: list[list[dict]], gpu: int, col: str) -> float | None:
    vals = [r[gpu][col] for r in rows if gpu < len(r) and r[gpu].get(col) is not None]
    return statistics.median(vals) if vals else None


class Checks:
    def __init__(self) -> None:
        self.results: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    def check(self, name: str, value: Any, ok: bool | None, want: str) -> None:
        verdict = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        self.set(name, verdict, value, want)

    def set(self, name: str, verdict: str, value: Any, want: str) -> None:
        self.results[name] = verdict
        self.values[name] = value
        print(f"{verdict:6} {name}: {value!r} (want {want})", flush=True)


def nvlink_field_rate(nv: Any, handle: Any, links: int, fid: int) -> tuple[int, int] | None:
    """Sum of one NVLink data counter (KiB) over links, with the latest µs timestamp; None if unsupported."""
    try:
        vals = nv.nvmlDeviceGetFieldValues(handle, [(fid, link) for link in range(links)])
    except Exception:
        return None
    ok = [v for v in vals if v.nvmlReturn == 0]
    if not ok:
        return None
    return sum(v.value.ullVal for v in ok), max(v.timestamp for v in ok)


# ---------------------------------------------------------------------------------------------- main


@dataclass
class Bench:
    """One run: the sampler under test, what was found, and the checks so far."""

    args: argparse.Namespace
    sampler: Any
    static: list[dict]
    checks: Checks
    out: dict[str, Any]
    events: list[tuple]
    t_start: float

    @property
    def n(self) -> int:
        return len(self.static)

    def finish(self) -> int:
        return finish(self.out, self.checks, self.sampler, self.events, self.t_start)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fake", default="", help="run on a fake NVML scenario (e.g. h200x8) instead: no load phases")
    ap.add_argument("--rounds", type=int, default=200, help="ticks for the cost measurement (default 200)")
    ap.add_argument("--phase-s", type=float, default=5.0, help="seconds of each load window (default 5)")
    ap.add_argument("--self-check", action="store_true", help="only show where lynxtop is imported from")
    return ap.parse_args()


def _backend(args: argparse.Namespace, pynvml: Any) -> tuple[Any, Any]:
    """(factory of the NVML backend, what the raw calls are replayed on): the real NVML, or --fake's scenario."""
    from lynxtop.agent.gpu.backend import RealNvml, open_backend

    if not args.fake:
        return RealNvml, pynvml
    from lynxtop.sim.gpus import SimScenario  # "sim": the simulator's node is passed in

    fake = open_backend(args.fake, scenario=SimScenario)
    return (lambda: fake), fake


def _full_ticks(gpu_sampler: Any) -> dict:
    """Every reading on every tick (refresh_s=0): the cost of a full tick, as measured before the sampler read
    memory, temperature, processes... about once a second (a sampler of older code has no such argument)."""
    return {"refresh_s": 0.0} if "refresh_s" in inspect.signature(gpu_sampler).parameters else {}


def _open(args: argparse.Namespace, gpu_sampler: Any, factory: Any) -> Bench | None:
    """Open the sampler and print what it found; None (after printing why) when NVML cannot be sampled."""
    events: list[tuple] = []

    def on_event(kind: str, severity: str, message: str, details: dict | None = None) -> None:
        events.append((kind, severity, message))
        print(f"event {severity}: {message}", flush=True)

    t_start = time.monotonic()
    sampler = gpu_sampler(factory, on_event=on_event, **_full_ticks(gpu_sampler))
    st = sampler.open()
    if st["state"] != "ok":
        print(f"cannot sample GPUs: {st['message']}", file=sys.stderr)
        print(json.dumps({"error": st["message"], "nvml": st, "checks": {}, "gpus": 0}))
        return None
    static = sampler.static()
    print(f"NVML ok: driver {st['driver_version']}, NVML {st['nvml_version']}, {len(static)} GPU(s)")
    for g in static:  # the board's serial is said by its length only: results are kept in the repository
        print("  " + json.dumps({**g, "serial": None if g.get("serial") is None else f"<{len(g['serial'])} chars>"}))
    out: dict[str, Any] = {"gpus": len(static), "driver_version": st["driver_version"],
                           "nvml_version": st["nvml_version"], "names": sorted({g["name"] for g in static}),
                           "simulated": bool(args.fake),
                           # nvmlDeviceGetSerial through the agent's facts reader (NULL: the board keeps none)
                           "serials_read": sum(1 for g in static if g.get("serial"))}
    b = Bench(args, sampler, static, Checks(), out, events, t_start)
    if b.n >= 2:
        for key in ("idx", "uuid", "pci_bus_id"):
            vals = [g[key] for g in static]
            b.checks.check(f"distinct_{key}", vals, len(set(vals)) == b.n and all(v != "" for v in vals),
                           "all distinct")
    return b


def _cost(b: Bench, gpu_sampler: Any, factory: Any, raw_target: Any, pynvml: Any) -> None:
    """The sampler's own cost, while idle, against the raw NVML calls it makes."""
    from lynxtop.agent.gpu.backend import RealNvml

    args, n = b.args, b.n
    rec = Recorder(factory() if args.fake else RealNvml())
    rec_sampler = gpu_sampler(lambda: rec, xid_events=False, **_full_ticks(gpu_sampler))
    rec_sampler.open()
    # Three regimes. back_to_back (the headline keys): ticks and replays alternate with no pause, the way the
    # per-call figures in reference/nvml.md were measured. gap_5ms and after_idle_100ms: every call finds
    # colder caches, which is what a real 1 Hz tick pays; NVML's calls slow down as much as the Python does.
    cost = measure_cost(b.sampler, rec_sampler, rec, raw_target, n, args.rounds, gap_s=0.0)
    for label, gap, rounds in (("gap_5ms", 0.005, args.rounds), ("after_idle_100ms", 0.1, max(args.rounds // 4, 10))):
        c = measure_cost(b.sampler, rec_sampler, rec, raw_target, n, rounds, gap_s=gap)
        cost[label] = {k: c[k] for k in ("tick_cpu_ms_per_gpu", "tick_vs_raw_nvml_ratio", "tick_wall_ms",
                                         "raw_nvml_ms")}
    rec_sampler.close()
    cost.update(measure_slow(gpu_sampler, factory, n))
    if not args.fake:
        cost["single_call_costs_gpu0"] = call_costs(pynvml)
        print("single NVML call costs on GPU 0:", json.dumps(cost["single_call_costs_gpu0"]), flush=True)
        if b.static[0]["gpm_supported"]:
            cost["gpm_null_by_interval"] = gpm_nan_by_interval(RealNvml())
            print("GPM NULL answers by sample interval:", json.dumps(cost["gpm_null_by_interval"]), flush=True)
    b.out.update(cost)
    checks = b.checks
    checks.check("tick_cpu_ms_per_gpu", cost["tick_cpu_ms_per_gpu"], cost["tick_cpu_ms_per_gpu"] <= 0.25, "<= 0.25")
    ratio = cost["tick_vs_raw_nvml_ratio"]
    checks.check("tick_vs_raw_nvml_ratio", ratio, None if ratio is None else ratio <= 2.0, "<= 2.0")
    for label in ("gap_5ms", "after_idle_100ms"):
        r2 = cost[label]["tick_vs_raw_nvml_ratio"]
        checks.check(f"tick_vs_raw_nvml_ratio_{label}", r2, None if r2 is None else r2 <= 2.0, "<= 2.0")


def _idle(b: Bench, nvlinks: int) -> None:
    idle = collect(b.sampler, 3.0)
    for gi in range(b.n):
        v = med(idle, gi, "sm_active_pct")
        b.checks.check(f"idle_sm_active_gpu{gi}", v, None if v is None else v < 5, "< 5 %")
    if nvlinks:
        v = med(idle, 0, "nvlink_tx_bytes_per_s")
        b.checks.check("idle_nvlink_tx_gpu0", v, None if v is None else v < 1e9, "about 0 (< 1 GB/s)")


def _memory(b: Bench, load: Load) -> None:
    """A known allocation on top of the context's own."""
    before = collect(b.sampler, 1.0)
    size = 8 << 30
    load.send(f"alloc {size}")
    load.expect("allocated", 60)
    after = collect(b.sampler, 1.0)
    m0, m1 = med(before, 0, "mem_used_bytes"), med(after, 0, "mem_used_bytes")
    rise = None if m0 is None or m1 is None else m1 - m0
    b.checks.check("memory_accounting", {"allocated": size, "rise": rise},
                   None if rise is None else abs(rise - size) <= 0.05 * size, "rise within 5 % of allocated")


_PHASE_COLS = ("util_gpu_pct", "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct", "power_w")


def _phase(b: Bench, load: Load, what: str, start_timeout: float = 30) -> list[list[dict]]:
    """Run one load phase on the child and sample through it."""
    load.send(f"{what} {b.args.phase_s + 1.5}")
    load.expect("started", start_timeout)
    time.sleep(0.7)
    rows = collect(b.sampler, b.args.phase_s)
    print("load:", load.expect("done", 60))
    return rows


def _matmul(b: Bench, load: Load, has_gpm: bool) -> None:
    mm = _phase(b, load, "matmul")
    sm, tc = med(mm, 0, "sm_active_pct"), med(mm, 0, "tensor_active_pct")
    b.out["matmul_gpu0"] = {c: med(mm, 0, c) for c in _PHASE_COLS}
    if has_gpm:
        b.checks.check("matmul_sm_active", sm, None if sm is None else sm > 80, "> 80 %")
        b.checks.check("matmul_tensor_active", tc, None if tc is None else tc > 80, "> 80 %")
    else:
        b.checks.set("matmul_sm_active", "ABSENT", sm, "GPM (Hopper+): SM columns are NULL here")
    if b.n >= 2 and has_gpm:
        v = med(mm, 1, "sm_active_pct")
        b.checks.check("matmul_gpu1_stays_idle", v, None if v is None else v < 5, "< 5 % (load is on GPU 0)")


def _processes(b: Bench, load: Load) -> None:
    """Per-process rows under load: the load's pid on GPU 0 with its memory and an SM share, owned by "the run"."""
    load.send(f"matmul {b.args.phase_s + 1.5}")
    load.expect("started", 30)
    time.sleep(0.7)
    pid, seen = load.p.pid, []
    end = time.monotonic() + min(b.args.phase_s, 4.0)
    while time.monotonic() < end:
        time.sleep(0.5)
        seen.extend(r for r in b.sampler.sample({pid}).process_rows if r["gpu"] == 0)
    print("load:", load.expect("done", 60))
    mine = [r for r in seen if r["pid"] == pid]
    shares = [r["sm_util_pct"] for r in mine if r["sm_util_pct"] is not None]
    b.out["process_rows_gpu0"] = {"rows": len(seen), "load_pid": pid, "pids": sorted({r["pid"] for r in seen}),
                                  "load_rows": len(mine), "sm_util_pct": shares[-5:]}
    b.checks.check("process_row_of_load", len(mine), bool(mine) and all(r["in_vllm_tree"] for r in mine),
                   "the load's pid (this pid namespace) listed on GPU 0, marked as the run's")
    b.checks.check("process_sm_share", max(shares, default=None), bool(shares) and max(shares) > 50,
                   "> 50 % SM share for the matmul process (nvmlDeviceGetProcessUtilization)")


def _copy(b: Bench, load: Load, has_gpm: bool) -> None:
    """Device-to-device copy."""
    cp = _phase(b, load, "copy")
    b.out["copy_gpu0"] = {c: med(cp, 0, c) for c in _PHASE_COLS}
    tc, bw = med(cp, 0, "tensor_active_pct"), med(cp, 0, "dram_bw_pct")
    if has_gpm:
        b.checks.check("copy_tensor_active", tc, None if tc is None else tc < 5, "< 5 %")
        b.checks.check("copy_dram_bw", bw, None if bw is None else bw > 60, "> 60 %")


def _nvlink(b: Bench, load: Load, pynvml: Any, nvlinks: int) -> None:
    """Peer copy GPU 0 -> GPU 1, seen by GPM and by NVML's field counters."""
    if b.n < 2 or nvlinks == 0:
        b.checks.set("nvlink_p2p", "ABSENT", {"gpus": b.n, "nvlink_count": nvlinks},
                     "NVLink needs >= 2 linked GPUs: absent here, not an error")
        return
    h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
    tx_id, rx_id = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX

    def fields() -> tuple:
        return nvlink_field_rate(pynvml, h0, nvlinks, tx_id), nvlink_field_rate(pynvml, h1, nvlinks, rx_id)

    load.send(f"p2p {b.args.phase_s + 1.5}")
    load.expect("started", 60)
    time.sleep(0.7)
    f0 = fields()
    pp = collect(b.sampler, b.args.phase_s)
    f1 = fields()
    print("load:", load.expect("done", 60))
    tx0, rx1 = med(pp, 0, "nvlink_tx_bytes_per_s"), med(pp, 1, "nvlink_rx_bytes_per_s")
    b.checks.check("p2p_gpu0_nvlink_tx_gpm", tx0, None if tx0 is None else tx0 > 10e9, "> 10 GB/s")
    b.checks.check("p2p_gpu1_nvlink_rx_gpm", rx1, None if rx1 is None else rx1 > 10e9, "> 10 GB/s")
    for label, a, z in (("p2p_gpu0_nvlink_tx_fields", f0[0], f1[0]), ("p2p_gpu1_nvlink_rx_fields", f0[1], f1[1])):
        if a is None or z is None or z[1] <= a[1]:
            b.checks.set(label, "ABSENT", None, "field counters unsupported on this driver")
        else:
            rate = (z[0] - a[0]) * 1024 * 1e6 / (z[1] - a[1])
            b.checks.check(label, rate, rate > 10e9, "> 10 GB/s")


def _load_phases(b: Bench, pynvml: Any) -> None:
    g0 = b.static[0]
    has_gpm = bool(g0["gpm_supported"])
    nvlinks = int(g0["nvlink_count"] or 0)
    _idle(b, nvlinks)
    load = Load(0)
    try:
        _memory(b, load)
        _matmul(b, load, has_gpm)
        _processes(b, load)
        _copy(b, load, has_gpm)
        _nvlink(b, load, pynvml, nvlinks)
    finally:
        load.close()


def main() -> int:
    args = _args()
    shim = import_shim()
    from lynxtop.agent.gpu import sampler as sampler_mod

    if args.self_check:
        print(json.dumps({"shim": str(shim), "sampler": str(Path(sampler_mod.__file__).resolve())}))
        return 0
    try:
        import pynvml
    except ImportError:
        print(json.dumps({"error": "nvidia-ml-py (pynvml) is not installed"}))
        return 2
    factory, raw_target = _backend(args, pynvml)
    b = _open(args, sampler_mod.GpuSampler, factory)
    if b is None:
        return 2
    _cost(b, sampler_mod.GpuSampler, factory, raw_target, pynvml)
    if args.fake:
        for name in ("idle_sm_active", "matmul_sm_active", "matmul_tensor_active", "copy_tensor_active",
                     "copy_dram_bw", "memory_accounting"):
            b.checks.set(name, "SKIP", None, "real GPU load (not with --fake)")
        return b.finish()
    try:
        import torch  # noqa: F401  (only to fail early with a clear message; the load runs in a child)
    except ImportError:
        print("torch is not installed: only the cost was measured", file=sys.stderr)
        b.out["error"] = "torch is not installed: load phases skipped"
        return b.finish()
    _load_phases(b, pynvml)
    return b.finish()


def finish(out: dict, checks: Checks, sampler: Any, events: list, t_start: float) -> int:
    sampler.close()
    out["checks"] = checks.results
    out["values"] = checks.values
    out["events"] = [f"{s}: {m}" for _, s, m in events]
    out["runtime_s"] = round(time.monotonic() - t_start, 1)
    failed = [k for k, v in checks.results.items() if v == "FAIL"]
    out["failed"] = failed
    print(json.dumps(out, default=str), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
