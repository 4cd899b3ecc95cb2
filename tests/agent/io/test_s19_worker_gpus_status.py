"""`lynxtop status` on a Ray worker names the processes that hold its GPUs and are not Ray's
(`cluster.gpus_taken`): through the real API socket and the CLI, escaped as every answer is."""

from __future__ import annotations

import io
import sys
from dataclasses import replace

import pytest
from support.status import T0, make_status
from test_io_ctl_cluster import run, serve, worker_cluster

from lynxtop.cli import ctl
from lynxtop.contract.status import GpuTaker, RayState

TAKERS = (GpuTaker(pid=4242, name="python", gpus=(3,), used_mem_bytes=20 * 2**30),
          GpuTaker(pid=5151, name="?", gpus=(), used_mem_bytes=None))


@pytest.fixture(autouse=True)
def _no_tty(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))


def test_status_over_the_socket_names_each_holder(capsys):
    with serve(worker_cluster(gpus_taken=TAKERS, gpus_taken_since_ms=T0 - 90_000)) as (_, path):
        code, out, _ = run(capsys, "status", "--socket", path)
    assert code == 0, out
    lines = out.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.startswith("ray      RUNNING worker of 10.0.0.1:6379"))
    held = lines[i + 1]
    assert held.startswith(ctl.INDENT + "! GPUs HELD by 2 process(es) not Ray's"), held
    assert "pid 4242 (python) GPU 3 using 20.0 GiB" in held and "pid 5151 (?)" in held, held
    assert "vLLM's ranks placed here run out of GPU memory" in out, out


def test_a_name_with_a_control_character_is_escaped():
    taker = GpuTaker(pid=7, name="ev\x1b[2Jil", gpus=(0,))
    st = make_status(state="stopped", profile=None, run_id=None, pid=None, model=None, vllm_version=None)
    text = ctl.format_status(replace(st, cluster=worker_cluster(gpus_taken=(taker,), gpus_taken_since_ms=T0)))
    assert "pid 7 (ev" in text  # format_status shows it; `status` prints it through terminal_safe (above)


def test_no_holders_no_line_and_shown_with_ray_stopped_too():
    st = make_status(state="stopped", profile=None, run_id=None, pid=None, model=None, vllm_version=None)
    assert "HELD" not in ctl.format_status(replace(st, cluster=worker_cluster()))
    stopped = worker_cluster(ray_state=RayState.STOPPED, ray_pid=None, gpus_taken=TAKERS[:1],
                             gpus_taken_since_ms=T0 - 5_000)
    assert "! GPUs HELD by 1 process(es) not Ray's for 5s: pid 4242 (python) GPU 3" in \
        ctl.format_status(replace(st, cluster=stopped))
