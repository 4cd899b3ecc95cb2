"""Multi-node roles without a cluster: Ray's state API page, the head's cluster watch, the supervisor's gate,
and the Ray supervision state machine against a stand-in `ray` (real processes and signals).

The two-host test with real Ray is tests/cluster/test_two_hosts.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from support.agent_config import agent_toml, profile
from support.waits import holds_async
from support.waits import wait_for_async as wait_for

from lynxtop.agent.cluster import raynode
from lynxtop.agent.cluster.raynode import RayNode, ray_argv
from lynxtop.agent.cluster.view import ClusterViewError, ClusterWatch, parse_nodes
from lynxtop.agent.serving.check import ClusterFacts, Level, check_profile, facts_from_info
from lynxtop.contract.config import ConfigError, parse_config
from lynxtop.contract.events import EventKind
from lynxtop.contract.status import ClusterNode, RayState, Role, ServingState, Status

pytestmark = pytest.mark.timeout(60)

PAGE = Path(__file__).parent / "io" / "pages" / "ray-2.60-nodes-one-dead.json"


def node(i: int, alive: bool = True, gpus: float = 8, head: bool = False, msg: str | None = None) -> ClusterNode:
    return ClusterNode(node_id=f"n{i}", ip=f"10.0.0.{i}", name=f"10.0.0.{i}", head=head, alive=alive, gpus=gpus,
                       state_message=msg)


class FakeSource:
    def __init__(self, nodes: list[ClusterNode]):
        self.answer: list[ClusterNode] | str = nodes

    async def nodes(self) -> list[ClusterNode]:
        if isinstance(self.answer, str):
            raise ClusterViewError(self.answer)
        return list(self.answer)


def make_watch(nodes: list[ClusterNode], running: list[str | None] | None = None):
    events = []
    src = FakeSource(nodes)
    state = running if running is not None else [None]
    w = ClusterWatch(src, events.append, interval_s=0.05, ray_running=lambda: state[0])
    return w, src, events, state


def pp2(**keys) -> object:
    text = agent_toml("/tmp/x.db", "/tmp/x.sock", role="head") + profile(
        "pp2", sys.executable, tensor_parallel_size=8, pipeline_parallel_size=2,
        distributed_executor_backend="ray", **keys)
    return parse_config(text).profiles[0]


# ------------------------------------------------------------------------------------------ Ray's page


def test_parse_nodes_reads_a_real_ray_page_with_a_dead_worker():
    nodes = parse_nodes(json.loads(PAGE.read_text()))
    assert [n.head for n in nodes] == [True, False]
    head, dead = nodes
    assert head.alive and head.gpus == 8.0 and head.end_ms is None
    assert not dead.alive and dead.gpus == 8.0 and dead.end_ms and dead.end_ms > dead.start_ms
    assert dead.state_message == "Unexpected termination: health check failed due to missing too many heartbeats"


@pytest.mark.parametrize("body, words", [
    ({"result": False, "msg": "Failed to retrieve nodes"}, "refused: Failed to retrieve nodes"),
    ({"result": True, "data": {}}, "unexpected shape"),
    ([1, 2], "unexpected shape"),
])
def test_parse_nodes_names_what_is_wrong(body, words):
    with pytest.raises(ClusterViewError, match=words):
        parse_nodes(body)


# ------------------------------------------------------------------------------------------ the watch


async def test_watch_records_a_lost_node_with_rays_reason_and_its_return():
    w, src, events, _ = make_watch([node(1, head=True), node(2)])
    await w.poll()
    assert events == [] and w.gpus_alive == 16  # the first view is the baseline
    src.answer = [node(1, head=True), node(2, alive=False, msg="health check failed")]
    await w.poll()
    [lost] = events
    assert lost.kind == EventKind.CLUSTER_NODE_LOST and "10.0.0.2 (8 GPUs)" in lost.message
    assert "health check failed" in lost.message and "1 node(s), 8 GPUs left" in lost.message
    assert lost.details["ip"] == "10.0.0.2"
    await w.poll()
    assert len(events) == 1  # still dead: said once
    src.answer = [node(1, head=True), node(2, alive=False), node(3)]  # the worker's Ray is back: a new node id
    await w.poll()
    assert [e.kind for e in events[1:]] == [EventKind.CLUSTER_NODE_JOINED]
    assert "10.0.0.3 (8 GPUs) joined" in events[1].message and "16 GPUs" in events[1].message


async def test_watch_a_vanished_node_is_lost_and_a_new_head_is_a_new_cluster():
    w, src, events, _ = make_watch([node(1, head=True), node(2)])
    await w.poll()
    src.answer = [node(1, head=True)]
    await w.poll()
    assert [e.kind for e in events] == [EventKind.CLUSTER_NODE_LOST]
    assert "no longer in Ray's view" in events[0].message
    src.answer = [node(9, head=True), node(8)]  # the head's Ray restarted: every id is new
    await w.poll()
    assert len(events) == 1


async def test_watch_read_failures_are_one_event_per_episode_and_nothing_while_ray_is_down():
    w, src, events, running = make_watch([node(1, head=True)], running=["starting: agent started"])
    src.answer = "connection refused"
    for _ in range(10):
        await w.poll()
    assert events == [] and "not running" in w.view_error  # no Ray here: nothing to complain about
    running[0] = None
    for _ in range(4):
        await w.poll()
    assert events == [] and w.view_error == "connection refused"  # the dashboard needs a few seconds
    for _ in range(5):
        await w.poll()
    assert [e.kind for e in events] == [EventKind.CLUSTER_VIEW_FAILED] and "connection refused" in events[0].message
    src.answer = [node(1, head=True)]
    await w.poll()
    assert [e.kind for e in events] == [EventKind.CLUSTER_VIEW_FAILED, EventKind.CLUSTER_VIEW_RESTORED]
    assert w.view_error is None and w.nodes


async def test_missing_says_what_the_profile_needs_and_which_node_is_lost():
    w, src, _, running = make_watch([node(1, head=True), node(2, alive=False, msg="health check failed")],
                                    running=["backoff: retry in 5 s"])
    prof = pp2()
    assert "waiting for this node's Ray (backoff: retry in 5 s)" in w.missing(prof)
    running[0] = None
    assert "not read yet" in w.missing(prof)
    await w.poll()
    text = w.missing(prof)
    assert "16 GPUs (TP 8 x PP 2 x DP 1)" in text and "it has 8 on 1 node(s) [10.0.0.1 (8 GPUs, head)]" in text
    assert "8 missing" in text and "lost: 10.0.0.2 (8 GPUs): health check failed" in text
    src.answer = [node(1, head=True), node(3)]
    await w.poll()
    assert w.missing(prof) is None


async def test_the_gate_and_lynxtop_check_say_what_is_missing_in_the_same_words():
    nodes = [node(1, head=True), node(2, alive=False, msg="health check failed")]
    w, *_ = make_watch(nodes)
    await w.poll()
    prof = pp2()
    gate = w.missing(prof)
    assert gate == ("waiting for Ray to report 16 GPUs (TP 8 x PP 2 x DP 1): it has 8 on 1 node(s) "
                    "[10.0.0.1 (8 GPUs, head)]; 8 missing; lost: 10.0.0.2 (8 GPUs): health check failed")  # docs/api.md
    facts = facts_from_info([{"index": i, "name": "NVIDIA H200", "cc_major": 9} for i in range(8)], "570.86",
                            ray_installed=True)
    report = check_profile(prof, replace(facts, cluster=ClusterFacts(tuple(nodes))), None)
    [par] = [v for v in report.verdicts if v.check == "parallelism"]
    shortfall = gate.split(": it has ", 1)[1]
    assert par.level == Level.WARNING and par.reason.endswith(f"; Ray reports {shortfall}"), par.reason
    assert w.gpus_alive == ClusterFacts(tuple(nodes)).gpus_alive == 8


# ------------------------------------------------------------------------------------------ the gate


class Gate:
    address = "10.0.0.1:6379"

    def __init__(self, text: str | None):
        self.text = text
        self.changed = asyncio.Event()

    def missing(self, prof) -> str | None:
        return self.text

    async def wait_change(self, timeout_s: float) -> None:
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), timeout_s)
        except TimeoutError:
            pass

    def set(self, text: str | None) -> None:
        self.text = text
        self.changed.set()


def ray_profiles(h) -> str:
    from support.agent_config import profile as prof

    return prof("pp2", h.STANDIN, model="m", tensor_parallel_size=2, pipeline_parallel_size=2,
                distributed_executor_backend="ray", readiness_timeout_s=20, stop_grace_s=3, shutdown_timeout_s=1)


async def test_a_ray_profile_waits_for_the_cluster_then_starts(make_sup, h, store):
    gate = Gate("waiting for Ray to report 4 GPUs: 2 missing")
    sup = make_sup(profiles=ray_profiles(h), cluster=gate)
    await sup.start("pp2", by="test")
    await wait_for(lambda: sup.state == ServingState.WAITING, 30, what="waiting")
    assert sup.proc is None and "2 missing" in sup.reason
    gate.set("waiting for Ray to report 4 GPUs: 1 missing")
    await wait_for(lambda: "1 missing" in sup.reason, 30, what="reason follows the view")
    gate.set(None)
    await wait_for(lambda: sup.state == ServingState.READY, 20, what="ready")
    store.flush()
    kinds = [e["kind"] for e in h.db_rows(store.path, "SELECT kind FROM events ORDER BY id")]
    assert kinds.index("cluster.waiting") < kinds.index("cluster.whole") < kinds.index("serving.starting")
    assert "serving.backoff" not in kinds  # waiting is not a failure
    env = Path(f"/proc/{sup.proc.pid}/environ").read_bytes().split(b"\0")
    assert b"RAY_ADDRESS=10.0.0.1:6379" in env  # vLLM joins this cluster, not whichever Ray started last
    await sup.stop("test")
    await wait_for(lambda: sup.state == ServingState.STOPPED and sup.action is None, 15, what="stopped")


async def test_stop_ends_the_wait_and_nothing_starts(make_sup, h):
    gate = Gate("2 missing")
    sup = make_sup(profiles=ray_profiles(h), cluster=gate)
    await sup.start("pp2", by="test")
    await wait_for(lambda: sup.state == ServingState.WAITING, 30, what="waiting")
    assert "stopping" in await sup.stop("test")
    await wait_for(lambda: sup.state == ServingState.STOPPED and sup.action is None, 30, what="stopped")
    gate.set(None)
    await holds_async(lambda: sup.proc is None and sup.state == ServingState.STOPPED, 0.3,
                      what="a stopped run staying stopped when the cluster gate opens")


async def test_a_profile_without_ray_never_waits(make_sup):
    sup = make_sup(cluster=Gate("never whole"))
    await sup.start("beta", by="test")
    await wait_for(lambda: sup.state == ServingState.READY, 20, what="ready")
    await sup.stop("test")
    await wait_for(lambda: sup.state == ServingState.STOPPED and sup.action is None, 15, what="stopped")


# ------------------------------------------------------------------------------------------ config


def test_config_roles_are_validated_in_one_pass():
    with pytest.raises(ConfigError) as err:
        parse_config('[agent]\nrole = "worker"\ndefault_profile = "x"\n[ray]\nextra_args = ["--num-gpus=2"]\n'
                     'head_address = "0.0.0.0:6379"\n')
    text = "\n".join(err.value.problems)
    assert "ray.extra_args: --num-gpus=2 is set by the agent or by a typed [ray] key" in text
    assert "ray.head_address: '0.0.0.0:6379' names no particular host" in text
    with pytest.raises(ConfigError, match="ray.head_address: is required on a worker"):
        parse_config('[agent]\nrole = "worker"\n')
    with pytest.raises(ConfigError, match="agent.role: 'leader' is not one of: single, head, worker"):
        parse_config('[agent]\nrole = "leader"\n')


def test_ray_argv_per_role_binds_the_dashboard_to_loopback():
    head = parse_config('[agent]\nrole = "head"\n[ray]\nexecutable = "/opt/ray/bin/ray"\nport = 6380\n'
                        'node_ip_address = "10.0.0.1"\nnum_gpus = 8\nextra_args = ["--object-store-memory", "1e9"]\n')
    argv = ray_argv(head)
    assert argv[:4] == ["/opt/ray/bin/ray", "start", "--block", "--disable-usage-stats"]
    assert argv[argv.index("--dashboard-host") + 1] == "127.0.0.1" and "--head" in argv
    assert argv[argv.index("--port") + 1] == "6380" and argv[-2:] == ["--object-store-memory", "1e9"]
    worker = parse_config('[agent]\nrole = "worker"\n[ray]\nexecutable = "/opt/ray/bin/ray"\n'
                          'head_address = "10.0.0.1:6380"\n')
    argv = ray_argv(worker)
    assert "--head" not in argv and argv[argv.index("--address") + 1] == "10.0.0.1:6380"
    assert "--num-gpus" not in argv  # unset: Ray counts the node's GPUs itself


def test_status_round_trips_the_cluster_and_a_single_node_reads_as_before():
    st = Status.from_json({"cluster": {"role": "head", "ray_state": "running", "nodes": [
        {"node_id": "a", "ip": "10.0.0.1", "gpus": 8, "head": True}, {"node_id": "b", "alive": False, "gpus": 8}]}})
    assert st.cluster.role == Role.HEAD and st.cluster.ray_state == RayState.RUNNING
    assert st.cluster.gpus_alive == 8 and [n.node_id for n in st.cluster.alive_nodes] == ["a"]
    assert Status.from_json(st.to_json()) == st
    old = Status.from_json({"serving": {"state": "ready"}})  # an agent from before roles
    assert old.cluster.role == Role.SINGLE and old.cluster.ray_state == RayState.OFF


# ------------------------------------------------------------------------------------------ Ray supervision

FAKE_RAY = textwrap.dedent("""\
    #!{python}
    # a stand-in for `ray start --block`: says it started, then blocks; SIGTERM ends it cleanly
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    with open(os.environ["FAKE_RAY_STARTS"], "a") as f:
        f.write(" ".join(sys.argv[1:]) + "\\n")
    time.sleep(float(os.environ.get("FAKE_RAY_DELAY", "0.1")))
    print("Ray runtime started.", flush=True)
    while True:
        time.sleep(1)
""")


@pytest.fixture
def fake_ray(tmp_path, monkeypatch):
    exe = tmp_path / "bin" / "ray"
    exe.parent.mkdir()
    exe.write_text(FAKE_RAY.format(python=sys.executable))
    exe.chmod(0o755)
    starts = tmp_path / "starts.txt"
    monkeypatch.setenv("FAKE_RAY_STARTS", str(starts))
    return exe, starts


def worker_cfg(tmp_path: Path, exe: Path):
    text = agent_toml(tmp_path / "state" / "lynxtop.db", tmp_path / "run" / "agent.sock", role="worker",
                      backoff_initial_s=0.2, backoff_max_s=0.5, crash_loop_failures=3)
    text += f'\n[ray]\nexecutable = "{exe}"\nhead_address = "10.0.0.1:6379"\nnum_gpus = 2\n'
    return parse_config(text)


async def test_ray_is_started_restarted_with_backoff_and_held_after_an_operator_stop(tmp_path, fake_ray):
    exe, starts = fake_ray
    events = []
    (tmp_path / "state").mkdir()
    rn = RayNode(worker_cfg(tmp_path, exe), events.append, state_dir=tmp_path / "state")
    again = rn
    try:
        await rn.boot()
        await wait_for(lambda: rn.state == RayState.RUNNING, 10, what="running")
        assert "--address 10.0.0.1:6379" in starts.read_text()
        assert os.environ.get(raynode.SOCKET_ENV) is None  # the agent's own environment is untouched
        env = Path(f"/proc/{rn.proc.pid}/environ").read_bytes().split(b"\0")
        assert f"{raynode.SOCKET_ENV}={tmp_path / 'run' / 'agent.sock'}".encode() in env
        first = rn.proc.pid
        os.kill(first, signal.SIGKILL)  # Ray dies under the agent
        await wait_for(lambda: rn.state == RayState.RUNNING and rn.proc.pid != first, 10, what="restarted")
        kinds = [e.kind for e in events]
        assert kinds.count(EventKind.RAY_EXITED) == 1 and EventKind.RAY_BACKOFF in kinds
        exited = next(e for e in events if e.kind == EventKind.RAY_EXITED)
        assert "while running (not requested by anyone)" in exited.message
        await rn.stop("uid 0 (root) pid 1")
        assert rn.state == RayState.STOPPED and not rn.record_path.exists()
        assert len(starts.read_text().splitlines()) == 2
        # a new agent does not bring back a Ray an operator stopped
        again = RayNode(worker_cfg(tmp_path, exe), events.append, state_dir=tmp_path / "state")
        await again.boot()
        assert again.state == RayState.STOPPED and "stopped by uid 0" in again.reason and again.proc is None
        assert "starting Ray" in await again.start("uid 0 (root) pid 2")
        await wait_for(lambda: again.state == RayState.RUNNING, 10, what="started by an operator")
        await again.stop("test")
    finally:
        for r in (rn, again):
            if r.proc is not None and not r.proc.exited:
                r.proc.signal_group(signal.SIGKILL)


async def test_ray_survives_an_agent_restart_and_is_adopted(tmp_path, fake_ray):
    exe, starts = fake_ray
    (tmp_path / "state").mkdir()
    events = []
    rn = RayNode(worker_cfg(tmp_path, exe), events.append, state_dir=tmp_path / "state")
    await rn.boot()
    await wait_for(lambda: rn.state == RayState.RUNNING, 10, what="running")
    pid = rn.proc.pid
    await rn.shutdown(stop_ray=False)  # live restore: the agent goes, Ray stays
    assert os.path.exists(f"/proc/{pid}")
    again = RayNode(worker_cfg(tmp_path, exe), events.append, state_dir=tmp_path / "state")
    try:
        await again.boot()
        assert again.state == RayState.RUNNING and again.proc.pid == pid
        assert len(starts.read_text().splitlines()) == 1
        assert events[-1].kind == EventKind.RAY_ADOPTED
        await again.shutdown(stop_ray=True)
        assert again.state == RayState.STOPPED and again.proc.exited
    finally:
        again.proc.signal_group(signal.SIGKILL)


async def test_ray_that_keeps_dying_is_a_crash_loop(tmp_path, fake_ray, monkeypatch):
    exe, _ = fake_ray
    exe.write_text(f"#!{sys.executable}\nimport sys\nprint('cannot reach the GCS', flush=True)\nsys.exit(1)\n")
    (tmp_path / "state").mkdir()
    events = []
    rn = RayNode(worker_cfg(tmp_path, exe), events.append, state_dir=tmp_path / "state")
    await rn.boot()
    await wait_for(lambda: rn.state == RayState.CRASH_LOOP, 15, what="crash loop")
    loop_ev = events[-1]
    assert loop_ev.kind == EventKind.RAY_CRASH_LOOP and "3 failures" in loop_ev.message
    exited = [e for e in events if e.kind == EventKind.RAY_EXITED]
    assert len(exited) == 3 and "before it was up" in exited[0].message
    assert "cannot reach the GCS" in "\n".join(exited[0].details["log_tail"])


async def test_the_watch_outlives_a_bug_in_one_read_and_logs_it_once(caplog):
    calls = []

    class Flaky:
        async def nodes(self):
            calls.append(1)
            if len(calls) <= 3:
                raise RuntimeError("boom")
            return [node(1, head=True)]

    w = ClusterWatch(Flaky(), [].append, interval_s=0.01, ray_running=lambda: None)
    task = asyncio.create_task(w.run())
    try:
        await wait_for(lambda: w.nodes and w.view_error is None, 30, what="recovered")
    finally:
        task.cancel()
    assert len([r for r in caplog.records if "reading Ray's view" in r.getMessage()]) == 1
