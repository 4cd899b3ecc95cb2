"""`lynxtop status|start|stop|ray` on a Ray head and worker, against the real API server and a fake controller that
acts like agent/node.py's roles: the status lines, `stop --cluster`, refusals, and --wait on Ray's state."""

from __future__ import annotations

import io
import sys
import time
from dataclasses import replace
from typing import Any

import pytest
from agent_io_helpers import FakeController, ThreadedApi
from support.ports import short_dir
from support.status import T0, make_status

from lynxtop.__main__ import main
from lynxtop.agent.api.control import ActionError
from lynxtop.cli import ctl
from lynxtop.contract.status import ClusterNode, ClusterStatus, RayState, Role

LOST = "Unexpected termination: health check failed due to missing too many heartbeats"


def head_cluster(**over: Any) -> ClusterStatus:
    nodes = (ClusterNode("a" * 56, ip="10.0.0.1", name="10.0.0.1", head=True, gpus=8.0, start_ms=T0 - 600_000),
             ClusterNode("b" * 56, ip="10.0.0.2", name="10.0.0.2", gpus=8.0, start_ms=T0 - 590_000))
    base = dict(role=Role.HEAD, ray_state=RayState.RUNNING, ray_reason="running as head (10.0.0.1:6379)",
                ray_since_ms=T0 - 120_000, ray_pid=5151, address="10.0.0.1:6379", nodes=nodes, view_ms=T0,
                gpus_needed=16)
    return ClusterStatus(**(base | over))


def worker_cluster(**over: Any) -> ClusterStatus:
    base = dict(role=Role.WORKER, ray_state=RayState.RUNNING, ray_since_ms=T0 - 60_000, ray_pid=777,
                address="10.0.0.1:6379")
    return ClusterStatus(**(base | over))


class RoleController(FakeController):
    """A node of a role: stop(cluster=True), ray/start and ray/stop as agent/node.py and roles.py answer them;
    `script` entries may also change `ray` (ClusterStatus fields) on the server's loop."""

    def __init__(self, cluster: ClusterStatus) -> None:
        super().__init__()
        self.cluster = cluster
        if cluster.role == Role.WORKER:
            self.serving.update(state="stopped", profile=None, run_id=None, pid=None, model=None)

    def status(self):
        return replace(super().status(), cluster=self.cluster)

    def _apply(self, change: dict[str, Any]) -> None:
        ray = change.pop("ray", None)
        if ray:
            self.cluster = replace(self.cluster, **ray)
        super()._apply(change)

    async def start(self, profile: str | None, by: str, expect_run: Any = None) -> str:
        if self.cluster.role == Role.WORKER:
            if profile:
                raise ActionError("role", f"this node is a Ray worker: it serves no vLLM (profile {profile!r} runs "
                                          "on the head, 10.0.0.1:6379); `lynxtop start` here starts Ray", 409)
            return await self.ray_start(by)
        return await super().start(profile, by)

    async def stop(self, by: str, cluster: bool = False, expect_run: Any = None) -> str:
        if cluster:
            if self.cluster.role != Role.HEAD:
                raise ActionError("role", f"this node is a {self.cluster.role} node: `lynxtop stop --cluster` runs "
                                          "on the head", 409)
            await self._act("stop-cluster", None, by)
            return "stopping the cluster: serving, then every worker's Ray, then this head's Ray"
        if self.cluster.role == Role.WORKER:
            return await self.ray_stop(by, None)
        return await super().stop(by)

    async def ray_start(self, by: str) -> str:
        await self._act("ray/start", None, by)
        return "starting Ray on this node"

    async def ray_stop(self, by: str, reason: str | None) -> str:
        if self.cluster.role == Role.HEAD:
            raise ActionError("role", "this is the Ray head: its Ray stops with `lynxtop stop --cluster`", 409)
        await self._act("ray/stop", reason, by)
        return "stopping Ray on this node; it stays stopped until `lynxtop start` here"


@pytest.fixture(autouse=True)
def _no_tty(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    monkeypatch.setattr(ctl, "POLL_S", 0.05)


def serve(cluster: ClusterStatus):
    class _Node:
        def __enter__(self):
            self._dir = short_dir()
            d = self._dir.__enter__()
            self.fake = RoleController(cluster)
            self.path = str(d / "agent.sock")
            self._api = ThreadedApi(self.fake, d / "agent.sock").__enter__()
            return self.fake, self.path

        def __exit__(self, *exc):
            self._api.__exit__(*exc)
            self._dir.__exit__(*exc)

    return _Node()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------------------------------------- status lines


def test_single_node_status_has_no_ray_or_cluster_line():
    text = ctl.format_status(make_status())
    assert "ray " not in text and "cluster" not in text
    assert text == ctl.format_status(replace(make_status(), cluster=ClusterStatus()))


def test_head_status_shows_ray_cluster_and_each_node():
    text = ctl.format_status(replace(make_status(), cluster=head_cluster()))
    lines = text.splitlines()
    assert "ray      RUNNING head 10.0.0.1:6379 pid 5151 for 2m00s" in lines
    i = lines.index("cluster  2 nodes, 16 GPUs (needs 16)")
    assert lines[i + 1].split() == ["10.0.0.1", "8", "GPUs", "head", "ALIVE"]
    assert lines[i + 2].split() == ["10.0.0.2", "8", "GPUs", "worker", "ALIVE"]
    assert lines.index("ray      RUNNING head 10.0.0.1:6379 pid 5151 for 2m00s") < i < \
        next(n for n, line in enumerate(lines) if line.startswith("SLA "))


def test_head_with_a_lost_worker_says_what_is_missing_and_why():
    dead = ClusterNode("b" * 56, ip="10.0.0.2", name="10.0.0.2", alive=False, gpus=8.0, state_message=LOST,
                       end_ms=T0 - 30_000)
    old = ClusterNode("c" * 56, ip="10.0.0.3", alive=False, gpus=8.0, state_message="old entry")  # it rejoined:
    back = ClusterNode("d" * 56, ip="10.0.0.3", gpus=8.0)  # its new node id
    cl = head_cluster(nodes=(head_cluster().nodes[0], dead, old, back), gpus_needed=24)
    st = make_status(state="waiting", reason="waiting for Ray to report 24 GPUs (TP 8 x PP 3 x DP 1): it has 16 on "
                                             "2 node(s) [...]; 8 missing", run_id=None, pid=None)
    text = ctl.format_status(replace(st, cluster=cl))
    assert "serving  WAITING for 1h02m (waiting for Ray to report 24 GPUs" in text
    assert "cluster  2 of 3 nodes alive, 16 GPUs (needs 24: 8 missing)" in text
    dead_line = next(line for line in text.splitlines() if "10.0.0.2" in line)
    assert "DEAD since " in dead_line and LOST in dead_line and "worker" in dead_line
    assert "old entry" not in text  # a dead entry of a worker alive again at its address is history


def test_head_without_a_view_and_ray_in_backoff():
    cl = head_cluster(ray_state=RayState.BACKOFF, ray_reason="Ray exited with status 1 while running", ray_pid=None,
                      ray_next_retry_ms=T0 + 20_000, ray_failures=2, nodes=(), view_ms=None,
                      view_error="this node's Ray is not running (backoff)")
    text = ctl.format_status(replace(make_status(), cluster=cl))
    assert "ray      BACKOFF head 10.0.0.1:6379 for 2m00s (Ray exited with status 1 while running)" in text
    assert "next retry in 20s, 2 failures in the window" in text
    assert "cluster  unknown: this node's Ray is not running (backoff) (needs 16)" in text


def test_worker_status_names_its_head_and_no_serving():
    st = make_status(state="stopped", profile=None, run_id=None, pid=None, model=None, vllm_version=None)
    text = ctl.format_status(replace(st, cluster=worker_cluster()))
    assert "serving  none on this node: a Ray worker (vLLM runs on the head, 10.0.0.1:6379)" in text
    assert "ray      RUNNING worker of 10.0.0.1:6379 pid 777 for 1m00s" in text
    assert "cluster " not in text  # only the head reads Ray's view
    held = ctl.format_status(replace(st, cluster=worker_cluster(ray_state=RayState.STOPPED, ray_pid=None,
                                                                ray_reason="stopped by uid 0 (root)")))
    assert "ray      STOPPED worker of 10.0.0.1:6379 for 1m00s (stopped by uid 0 (root))" in held
    assert "start it with `lynxtop ray start` (or `lynxtop start`)" in held


# ---------------------------------------------------------------------------------------------- actions


def test_status_over_the_socket_shows_the_head(capsys):
    with serve(head_cluster()) as (_, path):
        code, out, _ = run(capsys, "status", "--socket", path)
    assert code == 0 and "ray      RUNNING head 10.0.0.1:6379 pid 5151" in out
    assert "cluster  2 nodes, 16 GPUs (needs 16)" in out


def test_stop_cluster_needs_yes_then_sends_cluster_true(capsys):
    with serve(head_cluster()) as (fake, path):
        code, _, err = run(capsys, "stop", "--cluster", "--socket", path)
        assert code == 2 and "stop --cluster interrupts Ray" in err and fake.calls == []
        code, out, _ = run(capsys, "stop", "--cluster", "--yes", "--socket", path)
    assert code == 0 and "stopping the cluster: serving, then every worker's Ray" in out
    assert [c[0] for c in fake.calls] == ["stop-cluster"]


@pytest.mark.parametrize("cluster", [ClusterStatus(), worker_cluster()], ids=["single", "worker"])
def test_stop_cluster_refused_off_a_head_is_a_clear_error(capsys, cluster):
    with serve(cluster) as (fake, path):
        code, out, err = run(capsys, "stop", "--cluster", "--yes", "--socket", path)
    assert code == 1 and "lynxtop: role: " in err and "runs on the head" in err
    assert "Traceback" not in err + out and fake.calls == []


def test_stop_cluster_wait_ends_when_serving_and_ray_are_stopped(capsys):
    with serve(head_cluster()) as (fake, path):
        fake.script["stop-cluster"] = [
            (0.05, {"state": "stopping"}),
            (0.20, {"state": "stopped", "run_id": None, "ray": {"ray_state": RayState.STOPPING}}),
            (0.40, {"ray": {"ray_state": RayState.STOPPED, "ray_pid": None, "nodes": ()}}),
        ]
        t0 = time.monotonic()
        code, out, _ = run(capsys, "stop", "--cluster", "--yes", "--wait", "--socket", path)
    assert code == 0 and out.rstrip().endswith("cluster stopped")
    assert time.monotonic() - t0 >= 0.4  # neither serving stopped nor Ray stopping was taken for done
    assert "serving stopped, ray stopping" in out


def test_worker_start_and_stop_act_on_ray(capsys):
    with serve(worker_cluster(ray_state=RayState.STOPPED, ray_pid=None)) as (fake, path):
        fake.script["ray/start"] = [(0.05, {"ray": {"ray_state": RayState.STARTING}}),
                                    (0.2, {"ray": {"ray_state": RayState.RUNNING, "ray_pid": 778}})]
        code, out, _ = run(capsys, "start", "--wait", "--socket", path)
        assert code == 0 and "starting Ray on this node" in out and out.rstrip().endswith(
            "Ray running (worker, 10.0.0.1:6379)")
        for argv in (["start", "v4-tp8pp2-ray"], ["switch", "v4-tp8pp2-ray", "--yes"]):  # not even in its config
            code, _, err = run(capsys, *argv, "--socket", path)
            assert code == 1 and "this node is a Ray worker" in err and "runs on the head, 10.0.0.1:6379" in err
        code, _, err = run(capsys, "stop", "--socket", path)  # Ray runs: stopping it breaks the head's model
        assert code == 2 and "interrupts Ray" in err
        fake.script["ray/stop"] = [(0.1, {"ray": {"ray_state": RayState.STOPPED, "ray_pid": None}})]
        code, out, _ = run(capsys, "stop", "--yes", "--wait", "--socket", path)
        assert code == 0 and "it stays stopped until" in out and out.rstrip().endswith("Ray stopped")
    assert [c[0] for c in fake.calls] == ["ray/start", "ray/stop"]


def test_worker_start_wait_reports_a_crash_loop(capsys):
    with serve(worker_cluster(ray_state=RayState.STOPPED, ray_pid=None)) as (fake, path):
        fake.script["ray/start"] = [(0.05, {"ray": {"ray_state": RayState.STARTING}}),
                                    (0.15, {"ray": {"ray_state": RayState.CRASH_LOOP,
                                                    "ray_reason": "crash loop: 5 failures"}})]
        code, _, err = run(capsys, "start", "--wait", "--socket", path)
    assert code == 1 and "Ray did not start (state crash-loop): crash loop: 5 failures" in err


def test_ray_commands(capsys):
    with serve(head_cluster(ray_state=RayState.CRASH_LOOP, ray_pid=None)) as (fake, path):
        code, out, _ = run(capsys, "ray", "start", "--socket", path)
        assert code == 0 and "starting Ray on this node" in out
        code, _, err = run(capsys, "ray", "stop", "--socket", path)  # a head: the agent refuses, nothing asked
        assert code == 1 and "stop --cluster" in err
    with serve(worker_cluster()) as (fake, path):
        code, out, _ = run(capsys, "ray", "stop", "--yes", "--reason", "kernel update", "--socket", path)
        assert code == 0 and fake.calls[-1][:2] == ("ray/stop", "kernel update")
