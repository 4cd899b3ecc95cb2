"""`lynxtop demo` and its pieces: config, traffic, status line, teardown; end to end with the real agent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest

from lynxtop.cli.demo import (
    DEMO_TOKEN_ENV,
    PROFILES,
    Demo,
    DemoPaths,
    config_text,
    kill_all,
    processes_of,
    processes_started_by,
    run,
)
from lynxtop.contract.config import parse_config
from lynxtop.contract.status import Status
from lynxtop.sim.flags import parse_serve_args
from lynxtop.sim.loadgen import LoadGenerator, Phase, Stats, bench


def test_config_is_valid_and_its_profiles_run_the_simulator(tmp_path):
    paths = DemoPaths.under(tmp_path)
    text = config_text(paths, port=18555, startup_seconds=2, executable=tmp_path / "lynxtop-sim-vllm")
    cfg = parse_config(text, source="demo.toml")
    assert cfg.agent.fake_nvml == "sim" and cfg.agent.autostart and cfg.agent.default_profile == PROFILES[0]
    assert cfg.agent.database == paths.database and cfg.agent.socket == paths.socket
    assert [p.name for p in cfg.profiles] == list(PROFILES)
    for prof in cfg.profiles:
        assert "SIMULATED" in prof.description
        argv = prof.argv()
        assert argv[0] == str(tmp_path / "lynxtop-sim-vllm") and argv[1] == "serve"
        a = parse_serve_args(argv[2:], env={})
        assert a.port == 18555 and a.tp == 8 and a.host == "127.0.0.1" and a.startup_s == 2
        assert a.state_dir == paths.sim_state
    assert {p.kv_cache_dtype for p in cfg.profiles} == {"auto", "fp8"}


def _kill_leftovers(root: Path) -> None:
    """A failed test's clean-up: what still names the state dir (only the test's own processes do here)."""
    for pid in processes_of(root):
        with contextlib.suppress(OSError):
            os.kill(pid, 9)


def test_kill_all_ends_what_the_demo_started_and_nothing_else(tmp_path):
    root = tmp_path / "demo"
    root.mkdir()
    token = "0123456789abcdef0123456789abcdef"
    env = {**os.environ, DEMO_TOKEN_ENV: token}
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    in_env = subprocess.Popen(sleeper, env=env, start_new_session=True)
    ignores_term = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                     "signal.SIG_IGN); print('armed', flush=True); time.sleep(60)"],
                                    env=env, stdout=subprocess.PIPE)
    assert ignores_term.stdout.readline() == b"armed\n"  # SIGTERM is ignored from here on
    # names the state dir in its argv and environment, leads its own group, and even has a similar token
    names_dir = subprocess.Popen([*sleeper, str(root / "config.toml")], start_new_session=True,
                                 env={**os.environ, "LYNXTOP_SIM_STATE_DIR": str(root / "sim"),
                                      DEMO_TOKEN_ENV: token + "0"})
    try:
        deadline = time.monotonic() + 30  # python starts slowly on a loaded machine
        while len(processes_started_by(token)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(processes_started_by(token)) == {in_env.pid, ignores_term.pid}
        victims = kill_all(token, grace_s=0.5)
        assert set(victims) == {in_env.pid, ignores_term.pid}
        assert in_env.wait(5) is not None and ignores_term.wait(5) == -9
        assert names_dir.poll() is None  # before: killed (with its group) for naming the state dir
        assert processes_started_by(token) == []
    finally:
        for p in (in_env, ignores_term, names_dir):
            p.kill()
            p.wait()
        ignores_term.stdout.close()


def test_status_line_says_simulated_and_shows_missing_values_as_na(tmp_path):
    demo = Demo(tmp_path, startup_seconds=1, keep=True)
    line = demo.status_line(Status.from_json({
        "serving": {"state": "starting", "phase": "loading weights", "profile": PROFILES[0]},
        "serving_metrics": {"requests_running": None, "generation_tokens_per_s": 12.345},
        "gpus": [{"util_gpu_pct": 40, "mem_used_bytes": 2**40, "power_w": 300}] * 8,
        "sla": {"state": "unknown"}}))
    assert line.startswith("[SIMULATED]")
    assert "serving=starting (loading weights)" in line and "run N/A" in line and "gen 12.3 tok/s" in line
    assert "util 40%" in line and "mem 8192 GiB" in line and "power 2400 W" in line


def test_bad_demo_arguments_are_refused_before_anything_starts(tmp_path, capsys):
    assert run(Namespace(duration=0.0, state_dir=None, startup_seconds=1.0, no_tui=True)) == 2
    assert "--duration must be > 0" in capsys.readouterr().err
    f = tmp_path / "file"
    f.write_text("x")
    assert run(Namespace(duration=5.0, state_dir=str(f), startup_seconds=1.0, no_tui=True)) == 2
    assert "is not a directory" in capsys.readouterr().err


async def _drive(gen: LoadGenerator, seconds: float) -> Stats:
    """Runs the generator for a while, then stops it the way the demo does and returns its stats."""
    stop = asyncio.Event()
    task = asyncio.create_task(gen.run(stop))
    await asyncio.sleep(seconds)
    stop.set()
    return await asyncio.wait_for(task, 10)


def test_load_generator_drives_varied_traffic_and_bench_reports_vllm_keys(start_sim):
    sp = start_sim(speed=20.0)
    sp.wait_ready()
    pattern = (Phase("burst", 1.0, 6, (20, 60), (8, 16)), Phase("quiet", 0.5, 0, (1, 1), (1, 1)),
               Phase("single", 1.0, 1, (20, 60), (8, 16)))
    gen = LoadGenerator(sp.url, pattern=pattern, seed=3)
    stats = asyncio.run(_drive(gen, 3.0))
    assert stats.completed >= 6 and stats.failed == 0
    assert stats.phase in ("burst", "quiet", "single")
    assert min(stats.ttft_s) > 0 and len(stats.tpot_s) == stats.completed
    result = asyncio.run(bench(sp.url, concurrency=4, requests=8, prompt_tokens=32, output_tokens=16))
    assert result["completed"] == 8 and result["failed"] == 0 and result["max_concurrency"] == 4
    for key in ("request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "duration"):
        assert result[key] is not None and result[key] > 0, key


def test_load_generator_counts_an_absent_server_as_unavailable(kit):
    gen = LoadGenerator(f"http://127.0.0.1:{kit.free_port()}", pattern=(Phase("p", 1.0, 1, (5, 5), (2, 2)),))
    stats = asyncio.run(_drive(gen, 1.2))
    assert stats.unavailable >= 1 and stats.completed == 0 and stats.failed == 0


def test_demo_end_to_end_leaves_no_process_behind(tmp_path):
    root = tmp_path / "demo-state"
    proc = subprocess.run([sys.executable, "-m", "lynxtop", "demo", "--no-tui", "--duration", "14",
                           "--state-dir", str(root), "--startup-seconds", "1"],
                          capture_output=True, text=True, timeout=90)
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SIMULATED" in out.splitlines()[0]
    assert "serving=ready" in out, out + (root / "agent.log").read_text()
    assert "Traceback" not in proc.stderr
    logs = list((root / "logs").glob("*.log"))
    assert logs and "Application startup complete." in logs[0].read_text()
    assert processes_of(root) == []  # nothing whose command line or environment names the state dir
    for name in os.listdir("/proc"):  # and no simulator process of this demo under any name
        if name.isdigit():
            try:
                env = Path(f"/proc/{name}/environ").read_bytes()
            except OSError:
                continue
            assert str(root).encode() not in env, name


def test_the_demo_leaves_an_operators_processes_naming_its_state_dir_alone(tmp_path):
    """A `sleep` whose argv names the state dir (leading its own group) and a `tail -f DIR/agent.log` outlive the
    demo; before, its shutdown SIGTERMed and SIGKILLed both, with their process groups."""
    import shutil

    root = tmp_path / "demo-bystanders"
    root.mkdir()
    (root / "agent.log").touch()
    sleep, tail = shutil.which("sleep"), shutil.which("tail")
    assert sleep and tail
    bystanders = [subprocess.Popen([str(root / "logs" / "watching"), "300"], executable=sleep,
                                   start_new_session=True, env={**os.environ, "WATCH": str(root)}),
                  subprocess.Popen([tail, "-f", str(root / "agent.log")], stdout=subprocess.DEVNULL)]
    try:
        proc = subprocess.run([sys.executable, "-m", "lynxtop", "demo", "--no-tui", "--duration", "6",
                               "--state-dir", str(root), "--startup-seconds", "0.5"],
                              capture_output=True, text=True, timeout=90)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "serving=" in proc.stdout  # it did run: the agent answered
        assert [b.poll() for b in bystanders] == [None, None]
        assert set(processes_of(root)) == {b.pid for b in bystanders}  # and nothing of the demo is left
    finally:
        for b in bystanders:
            b.kill()
            b.wait()
        _kill_leftovers(root)


def _demo_until_ready(root, inherit_ignored_sigint: bool = False) -> tuple[subprocess.Popen, bytes]:
    """Start `lynxtop demo --no-tui` and read its output until serving is ready."""
    import selectors
    import signal

    def ignore_sigint() -> None:  # as a parent that ignores SIGINT leaves it to its children
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen([sys.executable, "-m", "lynxtop", "demo", "--no-tui", "--state-dir", str(root),
                             "--startup-seconds", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=ignore_sigint if inherit_ignored_sigint else None)
    seen = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 45
        while b"serving=ready" not in seen and time.monotonic() < deadline and proc.poll() is None:
            if sel.select(0.5):
                seen += os.read(proc.stdout.fileno(), 65536)
    return proc, seen


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_stops_the_demo_and_leaves_no_process_behind(tmp_path, inherited):
    """Also when SIGINT came in ignored (a harness or a script's background job): Ctrl-C is how a demo ends."""
    import signal

    root = tmp_path / "demo-ctrl-c"
    proc, seen = _demo_until_ready(root, inherit_ignored_sigint=inherited == "ignored")
    try:
        try:
            assert b"serving=ready" in seen, seen.decode(errors="replace")
            proc.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal delivers
            try:
                rest, _ = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired as exc:  # say where it hung: the demo's lines, the agent's log
                log = root / "agent.log"
                tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no agent log)"
                alive = processes_of(root)
                pytest.fail(f"the demo did not stop within 60 s of SIGINT; still running: {alive}\n--- demo output:\n"
                            f"{(exc.output or b'')[-3000:].decode(errors='replace')}\n--- agent log:\n{tail}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, (seen + rest).decode(errors="replace")
        assert b"stopped; database, config and logs kept" in rest
        assert processes_of(root) == []
    finally:
        _kill_leftovers(root)  # checked above; a failed run must not leave its agent and servers either


def test_terminal_gone_sighup_still_leaves_no_process_behind(tmp_path):
    """An SSH session that drops: SIGHUP, and every later write to the terminal fails."""
    import signal

    root = tmp_path / "demo-hup"
    proc, seen = _demo_until_ready(root)
    try:
        try:
            assert b"serving=ready" in seen, seen.decode(errors="replace")
            proc.stdout.close()  # the terminal is gone: the demo's writes now fail with EPIPE
            proc.send_signal(signal.SIGHUP)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert processes_of(root) == []
    finally:
        _kill_leftovers(root)


async def test_a_phase_of_no_length_lasts_until_stop_without_spinning():
    gen = LoadGenerator("http://127.0.0.1:9", pattern=(Phase("forever", 0, 0, (1, 1), (1, 1)),))
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(1.0, stop.set)
    cpu = time.process_time()
    await gen.run(stop)
    assert time.process_time() - cpu < 0.3  # waited for stop; before, it looped on a 0 s timeout for the whole second
