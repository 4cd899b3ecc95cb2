"""The agent under a real Prometheus: promtool on its page and on contrib/, a Prometheus server scraping a real agent
(SIMULATED vLLM and GPUs) through contrib's own scrape config and rules, and the names contrib uses checked against
what the agent exports.

One agent serves the whole module (these machines are loaded). promtool and prometheus come from the Debian package
`prometheus`; CI installs it and sets LYNXTOP_REQUIRE_REAL=1, so a missing one fails there (support/real.py);
elsewhere the tests that need it skip and say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from agent_io_helpers import FakeController
from prometheus_client.parser import text_string_to_metric_families
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import sim_processes, terminate
from support.ports import free_port, short_dir
from support.real import needs_tools
from support.waits import wait_for

from lynxtop.agent.cluster.view import parse_nodes
from lynxtop.agent.metrics.exporter import MetricsExporter
from lynxtop.contract.status import ClusterNode, ClusterStatus, RayState, Role, ServingState, Status

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[3]
CONTRIB = ROOT / "contrib"
PROM_DIR = CONTRIB / "prometheus"
RULES = PROM_DIR / "lynxtop-rules.yml"
DASHBOARD = CONTRIB / "grafana" / "lynxtop-dashboard.json"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_promtool = needs_tools("promtool")
needs_prometheus = needs_tools("prometheus")
PROFILE = "v4-tp8"
# Names Prometheus makes itself for every target (never on the agent's page)
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added"}
# exported only on a Ray head (lynxtop_cluster_*) or on any Ray node (lynxtop_ray_*), never on a single node:
# tests/agent/io/test_io_exporter_cluster.py checks them there, and the dashboard's cluster row runs on a head's page
# (test_every_cluster_row_query_returns_data_from_a_ray_heads_page)
HEAD_ONLY = {"lynxtop_cluster_gpus", "lynxtop_cluster_gpus_needed", "lynxtop_cluster_nodes", "lynxtop_cluster_node_up",
             "lynxtop_cluster_node_gpus", "lynxtop_cluster_node_gpus_expected", "lynxtop_ray_info", "lynxtop_ray_state",
             "lynxtop_cluster_view_ok"}
CLUSTER_ROW = "Cluster (Ray)"


# ------------------------------------------------------------------------------------------------ the agent


@dataclass
class Node:
    metrics_port: int
    vllm_port: int
    dir: Path
    quiet: threading.Event = field(default_factory=threading.Event)  # set: the module's trickle pauses

    def page(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return r.read().decode()


def _families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _value(text: str, name: str) -> float | None:
    samples = [s for fams in _families(text).values() for s in fams if s.name == name]
    return samples[0].value if samples else None


def _traffic(port: int, stop: threading.Event, quiet: threading.Event) -> None:
    """A trickle of short completions, so latency and throughput have something to show while Prometheus scrapes."""
    body = json.dumps({"model": "deepseek-ai/DeepSeek-V4.1", "prompt": "hello " * 40, "max_tokens": 24}).encode()
    while not stop.is_set():
        if quiet.is_set():
            stop.wait(0.1)
            continue
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with contextlib.suppress(OSError):
            urllib.request.urlopen(req, timeout=10).read()
        stop.wait(0.2)


def _start_agent(d: Path, metrics_port: int, vllm_port: int) -> subprocess.Popen:
    profile = sim_profile(PROFILE, tp=8, startup_s=0.3, port=vllm_port, sim_args=("--sim-speed", "20"))
    cfg = write_agent_config(d / "config.toml", d / "state" / "lynxtop.db", d / "run" / "agent.sock",
                             fake_nvml="sim", sample_interval_s=0.5, live_restore=False, autostart=True,
                             default_profile=PROFILE, metrics_listen=f"127.0.0.1:{metrics_port}",
                             gpu_release_timeout_s=10, sla={"ttft_p99_ms": 2000, "tpot_p99_ms": 150, "window_s": 30},
                             profiles=[profile])
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    env["LYNXTOP_SIM_STATE_DIR"] = str(d / "sim")
    with open(d / "agent.log", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "lynxtop", "agent", "--config", str(cfg)], stdout=log,
                                stderr=subprocess.STDOUT, env=env)


def _serving_page(node: Node) -> str | None:
    """The page once vLLM serves and the agent has latency and throughput from it."""
    try:
        text = node.page()
    except OSError:
        return None
    ttft, gen = _value(text, "lynxtop_serving_ttft_p99_seconds"), _value(text, "lynxtop_serving_generation_tokens_"
                                                                         "per_second")
    return text if ttft and gen else None


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """A real agent serving the simulated vLLM on 8 simulated H200s, with traffic, for the whole module."""
    with short_dir() as d:
        n = Node(free_port(), free_port(), d)
        agent = _start_agent(d, n.metrics_port, n.vllm_port)
        stop = threading.Event()
        load = threading.Thread(target=_traffic, args=(n.vllm_port, stop, n.quiet), daemon=True)
        try:
            wait_for(lambda: agent.poll() is not None or _value(n.page(), "lynxtop_serving_up") == 1, timeout=60,
                     what="the agent serving", ignore=(OSError,))
            assert agent.poll() is None, (d / "agent.log").read_text()[-3000:]
            load.start()
            wait_for(lambda: _serving_page(n), timeout=60, what="latency and throughput on the agent's page")
            yield n
        finally:
            stop.set()
            terminate(agent)
            if load.ident is not None:  # the agent may have died before the traffic started: its error stands
                load.join(15)
            for pid in sim_processes(d / "sim", runs_only=False):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------------------ promtool


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], input=stdin, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_the_live_agents_page(node):
    text = node.page()
    assert "lynxtop_gpu_sm_active_ratio" in text and "lynxtop_serving_ttft_p99_seconds" in text
    p = promtool("check", "metrics", stdin=text)
    assert p.returncode == 0 and not p.stdout.strip(), p.stdout + p.stderr  # lint findings print, even on rc 0


@needs_promtool
def test_contrib_config_and_rules_are_valid():
    p = promtool("check", "config", str(PROM_DIR / "prometheus.yml"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 rule files found" in p.stdout
    p = promtool("check", "rules", str(RULES))
    assert p.returncode == 0, p.stdout + p.stderr


@needs_promtool
def test_alert_rules_pass_their_unit_tests():
    """contrib/prometheus/tests/: each alert fires on what it is for, not before its `for`, not on a flap."""
    tests = sorted((PROM_DIR / "tests").glob("*.test.yml"))
    assert tests
    p = promtool("test", "rules", *map(str, tests))
    assert p.returncode == 0, p.stdout + p.stderr


# ------------------------------------------------------------------------------------------------ names used


_DROP = (
    re.compile(r'"(?:[^"\\]|\\.)*"'),  # strings (label values, $node)
    re.compile(r"\{[^}]*\}"),  # label matchers
    re.compile(r"\[[^\]]*\]"),  # ranges and subqueries
    re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"),  # label lists
)
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right",
             "inf", "nan"}
_IDENT = re.compile(r"(?<![\w.$:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, keywords, labels and strings left out)."""
    for pattern in _DROP:
        expr = pattern.sub(" ", expr)
    return {m for m in _IDENT.findall(expr) if m.lower() not in _KEYWORDS}


def rule_exprs() -> tuple[list[str], set[str]]:
    """The rules file's expressions and the names of its recording rules (read as text: no YAML parser needed;
    an expression goes on over the lines indented deeper than its `expr:`)."""
    exprs, records = [], set()
    lines = RULES.read_text().splitlines()
    for i, line in enumerate(lines):
        key, _, rest = line.strip().partition(":")
        if key == "- record":
            records.add(rest.strip())
        if key != "expr":
            continue
        indent = len(line) - len(line.lstrip())
        parts = [] if rest.strip() in (">-", ">", "|") else [rest.strip()]
        for more in lines[i + 1:]:
            if more.strip() and len(more) - len(more.lstrip()) <= indent:
                break
            parts.append(more.strip())
        exprs.append(" ".join(parts))
    return exprs, records


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    out = []

    def walk(panels: list) -> None:
        for p in panels:
            out.extend(t["expr"] for t in p.get("targets", ()) if t.get("expr"))
            walk(p.get("panels", ()))

    walk(dash["panels"])
    for var in dash["templating"]["list"]:
        q = var.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.match(r"label_values\((.*),\s*\w+\)\s*$", q or "")
        if m:
            out.append(m.group(1))
    return out


def test_metric_name_extraction():
    assert metric_names('max by (node) (rate(lynxtop_a_total{node=~"$node", x="a b"}[$__rate_interval])) > 0.5 '
                        "and on(job, instance) lynxtop_b == 1 or vector(0) * up offset 5m") == \
        {"lynxtop_a_total", "lynxtop_b", "up"}
    assert metric_names("lynxtop_x * on(job) group_left(profile, run) lynxtop_y_info unless lynxtop:z:by_run") == \
        {"lynxtop_x", "lynxtop_y_info", "lynxtop:z:by_run"}
    assert metric_names("histogram_quantile(0.99, sum by (le) (x_bucket)) / 1e3") == {"x_bucket"}


def test_every_metric_contrib_names_is_exported(node):
    """The rules and the dashboard read only what the agent exports (or rules record, or Prometheus adds)."""
    exported = set()
    for fam in text_string_to_metric_families(_serving_page(node) or node.page()):
        exported |= {s.name for s in fam.samples}
    exprs, records = rule_exprs()
    assert len(exprs) >= 11 and records
    dash = dashboard_exprs()
    assert len(dash) >= 30
    used = {name for e in exprs + dash for name in metric_names(e)}
    assert {"lynxtop_sla_breach", "lynxtop_gpu_lost", "lynxtop_serving_state", "lynxtop_gpu_xid_errors_total",
            "lynxtop_serving_degraded", "lynxtop_gpu_sm_active_ratio", "lynxtop_serving_ttft_p99_seconds"} <= used
    missing = used - exported - records - SYNTHETIC - HEAD_ONLY
    assert not missing, f"named in contrib/ but not exported by the agent: {sorted(missing)}"


# ------------------------------------------------------------------------------------------------ Prometheus


def _contrib_config(tmp: Path, groups: list[dict]) -> Path:
    """contrib's prometheus.yml, rules and file-SD layout, with the intervals cut to one second and `groups` as the
    target file (a group without a node label: the relabelling must make one from the address)."""
    text = (PROM_DIR / "prometheus.yml").read_text()
    for old, new in (("evaluation_interval: 15s", "evaluation_interval: 1s"), ("scrape_interval: 5s",
                     "scrape_interval: 1s"), ("scrape_timeout: 4s", "scrape_timeout: 1s")):
        assert text.count(old) == 1, f"contrib/prometheus/prometheus.yml no longer says {old!r}: adapt this test"
        text = text.replace(old, new)
    (tmp / "targets").mkdir()
    (tmp / "targets" / "test.yml").write_text(json.dumps(groups))
    shutil.copy(RULES, tmp / RULES.name)
    cfg = tmp / "prometheus.yml"
    cfg.write_text(text)
    return cfg


class PromApi:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> dict:
        url = f"{self.base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())

    def query(self, expr: str) -> list[dict]:
        body = self.get("/api/v1/query", query=expr)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/-/ready", timeout=5) as r:
                return r.status == 200
        except (OSError, urllib.error.HTTPError):
            return False


@contextlib.contextmanager
def _prometheus(groups: list[dict]) -> Iterator[PromApi]:
    """A real Prometheus with contrib's configuration scraping the target `groups`, after two scrapes of each."""
    with short_dir("lxtprom") as d:
        port = free_port()
        cfg = _contrib_config(d, groups)
        with open(d / "prometheus.log", "wb") as log:
            proc = subprocess.Popen([PROMETHEUS or "prometheus", f"--config.file={cfg}",
                                     f"--storage.tsdb.path={d / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                                     "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT, cwd=d)
        api = PromApi(port)
        try:
            wait_for(lambda: proc.poll() is not None or api.ready(), timeout=60, what="Prometheus ready")
            assert proc.poll() is None, (d / "prometheus.log").read_text()[-3000:]
            # two scrapes of each target, all up
            want = sum(len(g["targets"]) for g in groups)
            wait_for(lambda: len(api.query('count_over_time(up{job="lynxtop"}[1m]) >= 2 and up{job="lynxtop"} == 1'))
                     == want, timeout=60, what="two scrapes of every target")
            yield api
        finally:
            terminate(proc)


@pytest.fixture(scope="module")
def prometheus(node) -> Iterator[PromApi]:
    with _prometheus([{"targets": [f"127.0.0.1:{node.metrics_port}"], "labels": {"cluster": "test"}}]) as api:
        yield api


def _labels(result: list[dict]) -> list[dict]:
    return [{k: v for k, v in r["metric"].items()} for r in result]


@needs_prometheus
def test_prometheus_scrapes_gpus_with_node_gpu_and_uuid_labels(node, prometheus):
    for name in ("lynxtop_gpu_sm_active_ratio", "lynxtop_gpu_memory_used_bytes"):
        got = _labels(prometheus.query(name))
        assert sorted(int(m["gpu"]) for m in got) == list(range(8)), got
        for m in got:
            assert m["node"] == "127.0.0.1"  # from the address: the target file gave no node label
            assert m["job"] == "lynxtop" and m["cluster"] == "test"
            assert re.fullmatch(r"GPU-[0-9a-z-]+", m["uuid"]), m
        assert len({m["uuid"] for m in got}) == 8
    used = prometheus.query('lynxtop_gpu_memory_used_bytes{gpu="0"}')
    assert float(used[0]["value"][1]) > 2**30


@needs_prometheus
def test_prometheus_ties_serving_and_gpus_to_the_profile_and_run(node, prometheus):
    run = str(int(_value(node.page(), "lynxtop_serving_run_id") or 0))
    assert run != "0"
    want = {"node": "127.0.0.1", "profile": PROFILE, "run": run}

    def by_run(expr: str) -> list[dict]:
        return prometheus.query(expr)

    for record in ("lynxtop:serving_ttft_p99_seconds:by_run", "lynxtop:serving_generation_tokens_per_second:by_run"):
        got = wait_for(lambda r=record: by_run(r), timeout=30, what=record)  # noqa: B023
        assert len(got) == 1 and want.items() <= got[0]["metric"].items(), got
        assert got[0]["metric"]["model"] == "deepseek-ai/DeepSeek-V4.1"
    ttft = float(by_run("lynxtop:serving_ttft_p99_seconds:by_run")[0]["value"][1])
    assert 0 < ttft < 60
    gen = by_run("max_over_time(lynxtop:serving_generation_tokens_per_second:by_run[1m])")
    assert float(gen[0]["value"][1]) > 0
    # a GPU series joins the same run the same way (the dashboard and ad-hoc queries do this)
    sm = by_run("lynxtop_gpu_sm_active_ratio * on(job, instance) group_left(profile, run) lynxtop_serving_info")
    assert len(sm) == 8 and all(want.items() <= r["metric"].items() and r["metric"]["uuid"] for r in sm), sm


@needs_prometheus
def test_prometheus_loaded_every_contrib_rule_and_no_alert_fires(node, prometheus):
    groups = prometheus.get("/api/v1/rules")["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) >= 11 and all(r["health"] == "ok" for r in rules), [r for r in rules if r["health"] != "ok"]
    alerts = {r["name"] for r in rules if r["type"] == "alerting"}
    assert {"LynxtopSlaBreach", "LynxtopCrashLoop", "LynxtopGpuLost", "LynxtopServingHung", "LynxtopGpuXid"} <= alerts
    firing = [a for a in prometheus.get("/api/v1/alerts")["data"]["alerts"] if a["state"] == "firing"]
    assert not firing, firing  # a healthy simulated node raises nothing


# ------------------------------------------------------------------------------------------------ the dashboard


def test_dashboard_goes_node_then_gpus_then_serving_latency():
    dash = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert rows == ["Node", "GPUs", "Serving latency and throughput", CLUSTER_ROW]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "node", "gpu"]
    gpu_panels = [p for p in dash["panels"] if any("lynxtop_gpu_" in t["expr"] for t in p.get("targets", ()))]
    assert gpu_panels and all('gpu=~"$gpu"' in t["expr"] for p in gpu_panels for t in p["targets"])


_PANEL_TYPES = {"row", "stat", "timeseries", "gauge", "bargauge", "table", "heatmap", "piechart", "text",
                "state-timeline"}


def test_dashboard_has_the_fields_grafana_import_needs():
    """No maintained Python schema for Grafana dashboards installs here (grafana-foundation-sdk is not on PyPI), so
    the fields an import reads are checked: a uid, a title and a schemaVersion; the datasource input the panels
    name; per panel a known type, an id, a gridPos inside the 24 columns; per query a refId unique in its panel."""
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    assert dash["templating"]["list"][0] == {**dash["templating"]["list"][0], "type": "datasource",
                                             "name": "datasource", "query": "prometheus"}
    panels = [p for top in dash["panels"] for p in (top, *top.get("panels", ()))]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat (a collapsed row's panels included)"
    for p in panels:
        assert p["type"] in _PANEL_TYPES and isinstance(p["id"], int), p
        g = p["gridPos"]
        assert {"h", "w", "x", "y"} <= g.keys() and g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        refs = [t["refId"] for t in p.get("targets", ())]
        assert len(refs) == len(set(refs)), f"{p['title']}: refIds {refs}"
        for t in p.get("targets", ()):
            assert t.get("datasource", {"uid": "${datasource}"})["uid"] == "${datasource}", p["title"]
            assert t["expr"].strip(), p["title"]


# Panel queries (panel title, refId) that are empty on a healthy node, and why. Any other query
# that answers no series, or only NaN, is a blank panel and fails the test.
EMPTY_ON_A_HEALTHY_NODE = {
    ("GPU errors", "C"): "lynxtop_gpu_lost == 1 selects lost GPUs only; none is lost here",
}
# Every query of the cluster row is empty on a single node: it reads what only a Ray head (lynxtop_cluster_*) or a
# Ray node (lynxtop_ray_*) exports. test_every_cluster_row_query_returns_data_from_a_ray_heads_page runs them there.
EMPTY_ON_A_SINGLE_NODE = f"the {CLUSTER_ROW!r} row reads series only a Ray head or worker exports"


def dashboard_targets() -> list[tuple[str, str, str, str]]:
    """(row title, panel title, refId, expr) of every query of every panel, rows' nested (collapsed) panels
    included; a panel's row is the last row above it."""
    out = []
    row = ""
    for top in json.loads(DASHBOARD.read_text())["panels"]:
        if top["type"] == "row":
            row = top.get("title", "")
        for p in (top, *top.get("panels", ())):
            out.extend((row, p.get("title", ""), t.get("refId", ""), t["expr"]) for t in p.get("targets", ())
                       if t.get("expr"))
    return out


def _grafana_all(values: list[str]) -> str:
    """A multi-value variable set to "All" (no allValue), as Grafana writes it into a Prometheus regex matcher:
    every value regex-escaped, the backslashes doubled for the PromQL string, joined as (a|b)."""
    return "(" + "|".join(re.escape(v).replace("\\", "\\\\") for v in values) + ")"


def _answer(prometheus: PromApi, expr: str) -> tuple[str | None, list[dict]]:
    """(error, result) of an instant query: Prometheus' own error text for a query it refuses."""
    try:
        return None, prometheus.query(expr)
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError):
            body = json.loads(body).get("error", body)
        return f"HTTP {exc.code}: {body}", []


def _variables(prometheus: PromApi, gpus: int) -> dict[str, str]:
    """The dashboard's variables as Grafana substitutes them for "All": node and gpu from their own label_values
    queries (`gpus` GPUs expected), $__rate_interval as Grafana's default 15 s scrape interval makes it."""
    nodes = prometheus.get("/api/v1/label/node/values", **{"match[]": "lynxtop_agent_simulated"})["data"]
    assert nodes, "the node variable's query (label_values(lynxtop_agent_simulated, node)) answers nothing"
    node_re = _grafana_all(nodes)
    gpu = prometheus.get("/api/v1/label/gpu/values",
                         **{"match[]": f'lynxtop_gpu_memory_total_bytes{{node=~"{node_re}"}}'})["data"]
    assert len(gpu) == gpus, gpu
    return {"$node": node_re, "$gpu": _grafana_all(gpu), "$__rate_interval": "1m"}


def _run_panel_queries(prometheus: PromApi, targets: list[tuple[str, str, str, str]], subs: dict[str, str],
                       empty_ok: dict[tuple[str, str], str]) -> None:
    """Each query of `targets`, variables substituted, on `prometheus`: none refused, each answers a series with a
    number, except those of `empty_ok` (panel title, refId), which must answer none."""
    refused, blank, filled = [], [], []
    for _, title, ref, expr in targets:
        q = expr
        for var, value in subs.items():
            q = q.replace(var, value)
        assert "$" not in q, f"{title} {ref}: a variable the test does not substitute: {expr}"
        error, result = _answer(prometheus, q)
        has_data = any(r["value"][1] not in ("NaN", "+Inf", "-Inf") for r in result)
        if error:
            refused.append(f"{title} {ref}: {error}\n    {q}")
        elif (title, ref) in empty_ok:
            if has_data:
                filled.append(f"{title} {ref}")
        elif not has_data:
            blank.append(f"{title} {ref}: {len(result)} series, none with a number\n    {q}")
    assert not refused, "Prometheus refuses dashboard queries:\n" + "\n".join(refused)
    assert not blank, "dashboard queries without data:\n" + "\n".join(blank)
    assert not filled, f"listed as empty, yet answered: {filled} (update the list of exceptions)"


@needs_prometheus
def test_every_dashboard_panel_query_returns_data_from_a_serving_node(node, prometheus):
    """Every panel's PromQL, with the variables substituted as Grafana does for "All", runs on the real Prometheus
    scraping a serving node with traffic: no query is refused, and each answers at least one series with a number,
    except the few listed in EMPTY_ON_A_HEALTHY_NODE with their reason, and the cluster row (EMPTY_ON_A_SINGLE_NODE),
    which the next test runs on a Ray head's page."""
    targets = dashboard_targets()
    assert {(t, r) for _, t, r, _ in targets} >= set(EMPTY_ON_A_HEALTHY_NODE), "a listed exception names no query"
    single = [t for t in targets if t[0] != CLUSTER_ROW]
    assert len(single) > len(targets) - 12, f"more than the cluster row left out: {EMPTY_ON_A_SINGLE_NODE}"
    _run_panel_queries(prometheus, single, _variables(prometheus, 8), EMPTY_ON_A_HEALTHY_NODE)


@contextlib.contextmanager
def _exporter(snapshot: Status) -> Iterator[int]:
    """The agent's own metrics endpoint (agent/metrics/exporter.py) serving `snapshot`, on a loopback port, its event
    loop in a thread of its own while Prometheus scrapes it; yields the port."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    exp = MetricsExporter("127.0.0.1:0", lambda: snapshot, log=lambda _: None)
    try:
        asyncio.run_coroutine_threadsafe(exp.start(), loop).result(30)
        assert exp.bound_port
        yield exp.bound_port
    finally:
        asyncio.run_coroutine_threadsafe(exp.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _ray_nodes() -> tuple[Status, Status]:
    """A head short of GPUs (Ray 2.60's captured page: its worker DEAD, plus a second worker alive; 16 of the 24
    GPUs the profile needs), waiting to serve, and a worker whose Ray runs."""
    page = json.loads((Path(__file__).resolve().parent / "pages" / "ray-2.60-nodes-one-dead.json").read_text())
    base = FakeController().status()
    head = replace(base, serving=replace(base.serving, state=ServingState.WAITING), cluster=ClusterStatus(
        role=Role.HEAD, ray_state=RayState.RUNNING, address="192.0.2.2:6379", gpus_needed=24,
        nodes=(*parse_nodes(page), ClusterNode("e" * 56, ip="192.0.2.3", gpus=8.0)), view_ms=base.ts_ms))
    worker = replace(base, serving=replace(base.serving, state=ServingState.STOPPED), cluster=ClusterStatus(
        role=Role.WORKER, ray_state=RayState.RUNNING, address="192.0.2.2:6379"))
    return head, worker


@needs_prometheus
def test_every_cluster_row_query_returns_data_from_a_ray_heads_page():
    """The cluster row's queries, which a single node leaves empty, on a real Prometheus scraping the agent's
    exporter on a Ray head (one worker lost, GPUs short) and on a worker: none refused, each answers a number; the
    GPUs short and the per-node states are what those pages say."""
    targets = [t for t in dashboard_targets() if t[0] == CLUSTER_ROW]
    assert len(targets) >= 5, "the dashboard has no cluster row"
    head, worker = _ray_nodes()
    with _exporter(head) as head_port, _exporter(worker) as worker_port, _prometheus([
            {"targets": [f"127.0.0.1:{head_port}"], "labels": {"cluster": "ray", "node": "head-1"}},
            {"targets": [f"127.0.0.1:{worker_port}"], "labels": {"cluster": "ray", "node": "worker-1"}}]) as prom:
        subs = _variables(prom, 8)  # the same 8 GPU indexes on both nodes
        _run_panel_queries(prom, targets, subs, {})
        by_title = {(title, ref): expr for _, title, ref, expr in targets}

        def answer(title: str, ref: str = "A") -> dict[str, float]:
            q = by_title[(title, ref)]
            for var, value in subs.items():
                q = q.replace(var, value)
            return {" ".join(r["metric"][k] for k in ("node", "role", "state") if k in r["metric"]):
                    float(r["value"][1]) for r in prom.query(q)}

        assert answer("GPUs short") == {"head-1": 8}
        assert answer("Serving and Ray state per node", "A") == {"head-1 head waiting": 1, "worker-1 worker stopped": 1}
        assert answer("Serving and Ray state per node", "B") == {"head-1 head running": 1,
                                                                  "worker-1 worker running": 1}
        assert answer("Ray nodes") == {"head-1 alive": 2, "head-1 dead": 1}


_QUANTILES = {"0.5", "0.9", "0.95", "0.99"}


def test_dashboard_has_what_the_vllm_and_dcgm_dashboards_have():
    """Parity with vLLM's example dashboard (P50/P90/P95/P99 latency, TTFT and ITL heatmaps, finish reason, prefill
    and decode time, preemptions, prefix-cache hit rate) and dcgm-exporter's (SM clock, throttle reasons), plus the
    cluster row: each found by the series its queries read, so a renamed title does not hide a lost panel."""
    dash = json.loads(DASHBOARD.read_text())
    panels = [p for top in dash["panels"] for p in (top, *top.get("panels", ()))]

    def reading(fragment: str, kind: str | None = None) -> list[dict]:
        return [p for p in panels if any(fragment in t["expr"] for t in p.get("targets", ()))
                and (kind is None or p["type"] == kind)]

    for series in ("ttft", "tpot", "itl", "e2e"):
        qs = {m for p in reading(f"lynxtop_serving_{series}_seconds_bucket", "timeseries") for t in p["targets"]
              for m in re.findall(r"histogram_quantile\(([0-9.]+),", t["expr"])}
        assert qs >= _QUANTILES, f"{series}: quantiles {sorted(qs)}"
    for series in ("ttft", "itl"):
        heat = reading(f"lynxtop_serving_{series}_seconds_bucket", "heatmap")
        assert heat, f"no {series} heatmap"
        for t in heat[0]["targets"]:  # Grafana reads buckets as a heatmap only so: per `le`, format heatmap
            assert t["format"] == "heatmap" and t["legendFormat"] == "{{le}}" and "sum by (le)" in t["expr"], t
        assert heat[0]["options"]["calculate"] is False  # the buckets are already a histogram
    assert reading("finished_reason") and reading("lynxtop_serving_preemptions_total")
    assert reading("lynxtop_serving_prefix_cache_hit_ratio")
    phases = reading("lynxtop_serving_queue_seconds_sum")
    assert phases and {t["legendFormat"].split()[-1] for t in phases[0]["targets"]} >= {"prefill", "decode"}
    assert reading('lynxtop_gpu_sm_clock_hertz{node=~"$node", gpu=~"$gpu"}')
    assert reading("sum by (node, reason) (lynxtop_gpu_clock_throttle_reasons")
    row = [p for p in dash["panels"] if p["type"] == "row" and p["title"] == CLUSTER_ROW]
    assert row and row[0]["collapsed"] and row[0]["panels"], "the cluster row, collapsed for single nodes"
    cluster = {name for p in row[0]["panels"] for t in p["targets"] for name in metric_names(t["expr"])}
    assert {"lynxtop_cluster_nodes", "lynxtop_cluster_gpus", "lynxtop_cluster_gpus_needed",
            "lynxtop_cluster_node_gpus", "lynxtop_cluster_node_gpus_expected", "lynxtop_serving_state",
            "lynxtop_ray_state"} <= cluster


# ------------------------------------------------------------------------------------------------ histograms


class _UnixHTTP(http.client.HTTPConnection):
    """HTTP over the agent's control socket."""

    def __init__(self, path: Path):
        super().__init__("agent", timeout=30)
        self.sock_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(self.sock_path))


def _api(node: Node, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    conn = _UnixHTTP(node.dir / "run" / "agent.sock")
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


_TTFT = 'lynxtop_serving_ttft_seconds_count{model_name="deepseek-ai/DeepSeek-V4.1"}'


def _mixed_requests(port: int, tag: str, n: int) -> int:
    """`n` completions of prompts from a few words to a few thousand tokens (TTFT from tens of ms to over a
    second, several buckets), two at a time; every prompt unique, so no prefix-cache hit. Returns how many
    finished."""
    sizes = (4, 40, 150, 500, 1500)
    done = []

    def worker(k: int) -> None:
        for i in range(k, n, 2):
            prompt = f"{tag} {i} " + "hello " * sizes[i % len(sizes)]
            body = json.dumps({"model": "deepseek-ai/DeepSeek-V4.1", "prompt": prompt, "max_tokens": 4}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
            done.append(i)

    threads = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return len(done)


def _settled(node: Node, prometheus: PromApi, want: float | None = None) -> float | None:
    """The agent's TTFT count once Prometheus holds the same value (and it is `want`, when given)."""
    got = _value(node.page(), "lynxtop_serving_ttft_seconds_count")
    prom = prometheus.query(_TTFT)
    if got is None or not prom or float(prom[0]["value"][1]) != got or (want is not None and got != want):
        return None
    return got


def _steady(node: Node, prometheus: PromApi) -> float | None:
    """The TTFT count once it stayed the same for 3 s, on the agent's page and in Prometheus."""
    first = _settled(node, prometheus)
    time.sleep(3)
    return first if first is not None and _settled(node, prometheus) == first else None


@needs_prometheus
def test_fleet_p99_from_the_histograms_matches_the_agents_own_across_a_vllm_restart(node, prometheus):
    """Prometheus' histogram_quantile over the agent's exported buckets gives the agent's own p99 TTFT (its status,
    the TUI's figure) on the same observations, with a restart of vLLM inside the window; and at that restart the
    agent's lifetime counters neither drop (no reset for Prometheus) nor count anything twice.

    The module's trickle pauses first, so the window [T-W, T] holds: pre-restart samples with nothing new, the
    restart, and the new run's requests, which are exactly what the agent's own window (a new run starts its own)
    holds."""
    try:
        _mixed_requests(node.vllm_port, "warm", 20)  # every bucket the test uses counts something before its window
        node.quiet.set()
        before = wait_for(lambda: _steady(node, prometheus), timeout=60, what="the TTFT count steady",
                          ignore=(OSError,))
        quiet_from = time.time()
        old_run = _api(node, "GET", "/v1/status")[1]["serving"]["run_id"]
        time.sleep(3)  # the restart comes well inside the window
        code, body = _api(node, "POST", "/v1/restart", {})
        assert code in (200, 202), body

        def new_run_scraped() -> bool:
            st = _api(node, "GET", "/v1/status")[1]
            return (st["serving"]["state"] == "ready" and st["serving"]["run_id"] != old_run
                    and st["serving_metrics"].get("scrape_ok") == 1)

        wait_for(new_run_scraped, timeout=90, what="vLLM restarted as a new run and scraped", interval=0.2)
        sent = _mixed_requests(node.vllm_port, "after", 60)
        assert sent == 60
        after = wait_for(lambda: _settled(node, prometheus, before + sent), timeout=30,
                         what=f"the agent and Prometheus counting {before} + {sent} requests", ignore=(OSError,))
        assert after == before + sent  # no drop at the restart, nothing counted twice
        status = _api(node, "GET", "/v1/status")[1]
        window = int(time.time() - quiet_from) - 1
        assert window <= 60, "too slow: the restart took most of a minute"
        own = status["serving_metrics"]["ttft_p99_ms"] / 1000
        res = prometheus.query("histogram_quantile(0.99, sum by (le) "
                               f"(rate(lynxtop_serving_ttft_seconds_bucket[{window}s])))")
        assert len(res) == 1, res
        fleet = float(res[0]["value"][1])
        assert abs(fleet - own) <= 0.05 * own, (fleet, own)
        assert own > 0.1  # the window holds the long prompts too: a quantile over several buckets
        for expr in ("lynxtop_serving_ttft_seconds_bucket", "lynxtop_serving_ttft_seconds_count",
                     "lynxtop_serving_requests_total", "lynxtop_serving_generation_tokens_total",
                     "lynxtop_serving_prompt_tokens_total"):
            resets = prometheus.query(f"max(resets({expr}[{window + 30}s]))")
            assert resets and float(resets[0]["value"][1]) == 0, (expr, resets)
        finished = prometheus.query(f"sum(increase(lynxtop_serving_requests_total[{window}s]))")
        assert float(finished[0]["value"][1]) >= sent
    finally:
        node.quiet.clear()
