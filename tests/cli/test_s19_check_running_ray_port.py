"""`lynxtop check` on a Ray head reads Ray's view at the port the running Ray serves it on: a Ray adopted from
before a `[ray] dashboard_port` edit keeps its own port (agent/cluster/raynode.py, the record ray.json in the state
directory), so the config's port found nothing there and the verdict was "unknown"."""

from __future__ import annotations

import os

from support.ports import free_port
from test_check_cluster import FakeRay, check, config, verdicts
from test_check_cluster import ray as ray  # noqa: F401 - the fixture, by name

from lynxtop.agent.serving.launcher import ServerRecord, write_record


def record(tmp_path, port: int) -> None:
    argv = ["/opt/ray/bin/ray", "start", "--block", "--disable-usage-stats", "--head", "--port", "6379",
            "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(port)]
    rec = ServerRecord(run_id=None, profile="ray", pid=os.getpid(), pgid=os.getpgid(0), start_ticks=0, argv=argv,
                       token="0123456789abcdef", log_path=str(tmp_path / "ray.log"), started_ms=0)
    write_record(tmp_path / "ray.json", rec)


def test_the_running_rays_port_is_read_not_the_edited_configs(tmp_path, capsys, ray: FakeRay):
    edited = free_port()  # nothing listens there: the config was edited after Ray started
    record(tmp_path, ray.port)
    rc, out, _ = check(capsys, "--config", config(tmp_path, "head", edited), "--json")
    par = verdicts(out)["parallelism"]
    assert par["level"] == "ok" and "Ray reports 16 GPUs on 2 nodes" in par["reason"], par
    assert ray.paths, "Ray's view was not read at the running Ray's port"
    rc, out, _ = check(capsys, "--config", config(tmp_path, "head", edited))
    assert f"state API 127.0.0.1:{ray.port}, the running Ray's" in out and f"config says {edited}" in out, out


def test_a_stale_record_falls_back_to_the_configs_port(tmp_path, capsys, ray: FakeRay):
    record(tmp_path, free_port())  # a record whose Ray is gone: nothing answers at its port
    rc, out, _ = check(capsys, "--config", config(tmp_path, "head", ray.port), "--json")
    assert verdicts(out)["parallelism"]["level"] == "ok", out


def test_no_record_the_configs_port_as_before(tmp_path, capsys, ray: FakeRay):
    rc, out, _ = check(capsys, "--config", config(tmp_path, "head", ray.port))
    assert f"state API 127.0.0.1:{ray.port})" in out and "running Ray's" not in out, out
