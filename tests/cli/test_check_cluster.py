"""`lynxtop check` on a Ray head: the parallelism verdict from Ray's own view of the cluster, read from a fake of
Ray's state API that serves the page real Ray 2.60 answered (tests/agent/io/pages), with no agent running."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.ports import free_port

from lynxtop.__main__ import main
from lynxtop.agent.cluster.view import parse_nodes
from lynxtop.agent.serving.check import ClusterFacts, Level, check_profile, facts_from_info
from lynxtop.contract.config import parse_config

PAGE = Path(__file__).resolve().parents[1] / "agent" / "io" / "pages" / "ray-2.60-nodes-one-dead.json"
LOST = "Unexpected termination: health check failed due to missing too many heartbeats"


def one_dead() -> dict[str, Any]:
    """Ray 2.60's page after a worker's raylet was killed: the head alive (8 GPUs), the worker DEAD."""
    return json.loads(PAGE.read_text())


def whole() -> dict[str, Any]:
    """The same page with the worker alive on its own host: 16 GPUs on 2 nodes."""
    page = copy.deepcopy(one_dead())
    worker = next(r for r in page["data"]["result"]["result"] if not r["is_head_node"])
    worker.update(state="ALIVE", state_message=None, end_time_ms=0, node_ip="192.0.2.3", node_name="192.0.2.3")
    return page


class FakeRay:
    """GET /api/v0/nodes answers `page` (JSON) with `status`; every path asked is kept."""

    def __init__(self) -> None:
        self.page: Any = whole()
        self.status = 200
        self.paths: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                fake.paths.append(self.path)
                body = fake.page.encode() if isinstance(fake.page, str) else json.dumps(fake.page).encode()
                self.send_response(fake.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]


@pytest.fixture
def ray() -> Iterator[FakeRay]:
    fake = FakeRay()
    thread = threading.Thread(target=fake.server.serve_forever, daemon=True)
    thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()
    thread.join(10)


PROFILE = """
[[profile]]
name = "v4-tp8pp2-ray"
executable = "/opt/vllm/bin/vllm"
model = "deepseek-ai/DeepSeek-V4.1"
tensor_parallel_size = 8
pipeline_parallel_size = 2
distributed_executor_backend = "ray"
kv_cache_dtype = "fp8"
max_model_len = 32768
"""


def config(tmp_path: Path, role: str, port: int) -> str:
    ray = f'\n[ray]\ndashboard_port = {port}\nnode_ip_address = "192.0.2.2"\n' if role == "head" else ""
    path = tmp_path / "config.toml"
    path.write_text(f'[agent]\ndatabase = "{tmp_path}/l.db"\nsocket = "{tmp_path}/a.sock"\nfake_nvml = "h200x8"\n'
                    f'role = "{role}"\n{ray}{PROFILE}')
    return str(path)


def check(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def verdicts(out: str) -> dict[str, dict[str, Any]]:
    return {v["check"]: v for v in json.loads(out)["reports"][0]["verdicts"]}


def test_whole_cluster_is_ok_from_rays_count(tmp_path, capsys, ray):
    rc, out, err = check(capsys, "--config", config(tmp_path, "head", ray.port), "--json")
    data = json.loads(out)
    par = verdicts(out)["parallelism"]
    assert par["level"] == "ok" and "Ray reports 16 GPUs on 2 nodes" in par["reason"], par
    assert par["numbers"]["gpus_cluster"] == 16 and par["numbers"]["nodes_alive"] == 2
    assert data["role"] == "head" and data["cluster"]["gpus_alive"] == 16 and data["cluster"]["error"] is None
    assert ray.paths == ["/api/v0/nodes?detail=1&limit=10000"]  # once, whatever the number of profiles
    rc, out, err = check(capsys, "--config", config(tmp_path, "head", ray.port))
    assert "role: Ray head (GCS 192.0.2.2:6379" in out
    assert "cluster: Ray reports 16 GPUs on 2 node(s): 192.0.2.2 (8 GPUs, head), 192.0.2.3 (8 GPUs)" in out
    assert "ok       parallelism profile v4-tp8pp2-ray needs 16 GPUs" in out


def test_a_lost_worker_is_a_warning_naming_what_is_missing(tmp_path, capsys, ray):
    ray.page = one_dead()
    rc, out, _ = check(capsys, "--config", config(tmp_path, "head", ray.port))
    assert rc == 1
    assert "WARNING  parallelism" in out and "Ray reports 8 on 1 node(s) [192.0.2.2 (8 GPUs, head)]; 8 missing" in out
    assert f"lost: 192.0.2.2 (8 GPUs): {LOST}" in out  # the worker beside the head on one host, as captured
    assert 'agent.role = "worker"' in out  # the fix


@pytest.mark.parametrize(("page", "status", "why"), [
    ({"result": False, "msg": "state API overloaded", "data": {}}, 200, "refused: state API overloaded"),
    ("<html>dashboard starting</html>", 200, "not JSON"),
    ({"error": "x"}, 500, "answered HTTP 500"),
])
def test_an_unreadable_view_is_unknown_with_the_reason(tmp_path, capsys, ray, page, status, why):
    ray.page, ray.status = page, status
    rc, out, _ = check(capsys, "--config", config(tmp_path, "head", ray.port), "--json")
    par = verdicts(out)["parallelism"]
    assert rc == 1 and par["level"] == "unknown" and why in par["reason"], par
    assert why in json.loads(out)["cluster"]["error"]


def test_no_ray_on_the_head_is_unknown_and_no_traceback(tmp_path, capsys):
    rc, out, err = check(capsys, "--config", config(tmp_path, "head", free_port()))
    assert rc == 1 and err == ""
    assert "cluster: unknown: Ray's state API at http://127.0.0.1:" in out and "did not answer" in out
    assert "unknown  parallelism" in out and "`lynxtop ray start`" in out


def test_single_node_does_not_ask_ray_and_says_no_role(tmp_path, capsys, ray):
    rc, out, _ = check(capsys, "--config", config(tmp_path, "single", ray.port), "--json")
    data = json.loads(out)
    assert data["role"] == "single" and data["cluster"] is None and ray.paths == []
    assert verdicts(out)["parallelism"]["level"] == "warning"  # the rest must come from a Ray cluster: as before
    _, text, _ = check(capsys, "--config", config(tmp_path, "single", ray.port))
    assert "role:" not in text and "cluster:" not in text


def test_verdict_from_parsed_nodes_and_cluster_none_is_unchanged():
    cfg = parse_config(PROFILE)
    [prof] = cfg.profiles
    node = facts_from_info([{"index": i, "name": "NVIDIA H200", "cc_major": 9, "mem_total_bytes": 141 * 2**30}
                            for i in range(8)], "570.86", ray_installed=True)
    plain = {v.check: v for v in check_profile(prof, node, None).verdicts}
    assert plain["parallelism"].level == Level.WARNING and "Ray cluster" in plain["parallelism"].reason
    ok = {v.check: v for v in check_profile(prof, replace(node, cluster=ClusterFacts(tuple(parse_nodes(whole())))),
                                            None).verdicts}
    assert ok["parallelism"].level == Level.OK and "head" in ok["ray"].reason


def test_rays_words_reach_the_terminal_escaped(tmp_path, capsys, ray):
    """Issue 25.3: a node name and a state message from Ray's page are printed escaped, one line each."""
    evil = "\x1b[2J\x1b]0;owned\x07\u202e\nforged: line"
    ray.page = one_dead()
    nodes = ray.page["data"]["result"]["result"]
    dead = next(r for r in nodes if not r["is_head_node"])
    dead["state_message"] = "lost" + evil
    next(r for r in nodes if r["is_head_node"])["node_name"] = "head" + evil
    rc, out, err = check(capsys, "--config", config(tmp_path, "head", ray.port))
    assert rc == 1 and "Traceback" not in err
    assert not any(c in out for c in "\x1b\x07\u202e"), repr(out)
    assert out.count("\\x1b[2J\\x1b]0;owned\\x07\\u202e\\nforged: line") >= 2
    assert not any(line.startswith("forged") for line in out.splitlines())
