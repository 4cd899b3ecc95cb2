"""Another node's history read over TCP takes the Events, History and Compare views' filters (s21).

`GET /v1/history?read=events` took no kind, severity or text, `read=bench_results` no run ids and `read=runs` no
filter, so another node's views searched only the newest rows: three errors behind 2,000 newer info events were
"no events match", and a run older than the newest 200 was not found. The filters go to the store reader as its
parameters (never into the SQL text); a bad value is a 400 naming the parameter, lists and text are bounded.

A real agent (its `metrics_listen` on loopback with `[agent] tcp_reads` and a token) over a history database
written beforehand by the store's own writer.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.agent_config import sim_profile, write_agent_config
from support.agent_proc import Agent, reap_sims
from support.ports import free_port, short_dir

from lynxtop.contract.client import AgentClient, AgentRefused
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.store.writer import StoreWriter

pytestmark = pytest.mark.timeout(180)

TOKEN = "tcp-filter-token-8c2e4a6f1b3d5079"
INFOS = 2_000


def seed_history(db: Path) -> dict[str, int]:
    """3 errors, then INFOS info events newer than all of them; runs `old-unique` (oldest), `a_b`, `axb`, and two
    with bench results behind a flood of a third run's. Returns the run ids by name."""
    now = int(time.time() * 1000)
    base = now - 3_600_000
    w = StoreWriter(db)
    w.start()
    ids: dict[str, int] = {}
    for i, profile in enumerate(("old-unique", "a_b", "axb", "bench-a", "bench-b", "flood")):
        ids[profile] = w.create_run(profile=profile, argv=["vllm", "serve", "m"], model="m", host="h",
                                    started_ms=base + i * 1000, pid=100 + i, log_path="", simulated=True)
        w.update_run(ids[profile], ended_ms=base + i * 1000 + 500, exit_code=0, end_reason="switch")
    for i in range(3):
        w.record(Event(EventKind.GPU_XID, Severity.ERROR, f"GPU {i} XID 79: fell off the bus", ts_ms=base + 10 + i))
    for i in range(INFOS):
        w.record(Event(EventKind.SCRAPE_COUNTER_RESET, Severity.INFO, f"counter reset {i}",
                       ts_ms=base + 1_000 + i * 100))
        if i % 500 == 0:
            assert w.flush(30)
    for name in ("bench-a", "bench-b"):
        w.add_bench_result({"run_id": ids[name], "name": "sharegpt", "concurrency": 8, "ts_ms": base + 5_000,
                            "bench_id": f"sweep-{name}", "output_tokens_per_s": 800.0, "num_prompts": 40})
    for i in range(60):
        w.add_bench_result({"run_id": ids["flood"], "name": "sharegpt", "concurrency": 1, "ts_ms": base + 6_000 + i,
                            "bench_id": f"flood-{i}", "output_tokens_per_s": 90.0})
    w.close()
    return ids


async def start_reading_agent(tmp: Path, d: Path) -> tuple[Agent, int]:
    """A real agent with TCP reads on (token TOKEN) over the seeded history; no run started."""
    port = free_port()
    token = tmp / "read.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    cfg = write_agent_config(tmp / "config.toml", tmp / "state" / "lynxtop.db", d / "a.sock", fake_nvml="sim",
                             sample_interval_s=0.5, default_profile="sim", autostart=False,
                             metrics_listen=f"127.0.0.1:{port}",
                             extra=f'tcp_reads = true\ntcp_token_file = "{token}"\n',
                             profiles=[sim_profile("sim", startup_s=0.3, stop_grace_s=5)])
    agent = Agent(tmp, cfg, sock=d / "a.sock")
    await agent.wait_notify("READY=1", timeout=60)
    return agent, port


@pytest.fixture
async def reading_agent(tmp_path):
    (tmp_path / "state").mkdir()
    ids = seed_history(tmp_path / "state" / "lynxtop.db")
    with short_dir() as d:
        agent, port = await start_reading_agent(tmp_path, d)
        try:
            yield AgentClient(f"http://127.0.0.1:{port}", token=TOKEN, timeout_s=30), ids
        finally:
            agent.stop()
            reap_sims(tmp_path / "sim-state")


def _history(tcp: AgentClient, read: str, **params: object) -> dict:
    return tcp.request("GET", "/v1/history", {"read": read, **params})


def _refused(tcp: AgentClient, read: str, **params: object) -> AgentRefused:
    with pytest.raises(AgentRefused) as bad:
        _history(tcp, read, **params)
    return bad.value


async def test_filters_are_read_in_the_database_over_tcp(reading_agent):
    tcp, ids = reading_agent
    newest = _history(tcp, "events", limit=1000)["events"]
    assert len(newest) == 1000 and not [e for e in newest if e["severity"] == "error"]  # behind the flood

    errors = _history(tcp, "events", limit=1000, severities="error,critical")["events"]
    assert [e["message"] for e in errors] == [f"GPU {i} XID 79: fell off the bus" for i in range(3)]
    assert len(_history(tcp, "events", limit=1000, kinds="gpu.xid")["events"]) == 3
    assert len(_history(tcp, "events", limit=1000, kinds="xid")["events"]) == 3  # the older name, as the store's
    assert len(_history(tcp, "events", limit=1000, kind_family="gpu.")["events"]) == 3
    assert len(_history(tcp, "events", limit=1000, text="FELL OFF")["events"]) == 3
    assert _history(tcp, "events", limit=1000, text="%' OR 1=1 --")["events"] == []  # a value, never SQL
    assert _history(tcp, "events", limit=1000, text="100%")["events"] == []  # % is itself

    bench = _history(tcp, "bench_results", limit=10, run_ids=f"{ids['bench-a']},{ids['bench-b']}")["results"]
    assert sorted(r["run_id"] for r in bench) == sorted([ids["bench-a"], ids["bench-b"]])
    assert {r["run_id"] for r in _history(tcp, "bench_results", limit=10)["results"]} == {ids["flood"]}

    assert [r["id"] for r in _history(tcp, "runs", text="OLD-uni")["runs"]] == [ids["old-unique"]]
    assert [r["profile"] for r in _history(tcp, "runs", text="a_b")["runs"]] == ["a_b"]  # _ is itself


async def test_bad_filters_are_refused_naming_the_parameter(reading_agent):
    tcp, _ = reading_agent
    bad = _refused(tcp, "events", severities="error,fatal")
    assert bad.status == 400 and "'severities'" in bad.message and "fatal" in bad.message
    assert "warning" in bad.message  # the choices said
    for params, name in (({"severities": ",".join(["error"] * 65)}, "severities"),
                         ({"kinds": "gpu.xid;DROP TABLE events"}, "kinds"),
                         ({"kinds": "x" * 65}, "kinds"),
                         ({"kind_family": "gpu.%"}, "kind_family"),
                         ({"text": "x" * 201}, "text")):
        bad = _refused(tcp, "events", **params)
        assert bad.status == 400 and f"'{name}'" in bad.message, (params, bad.message)
    bad = _refused(tcp, "bench_results", run_ids="1,two")
    assert bad.status == 400 and "'run_ids'" in bad.message and "'two'" in bad.message
    bad = _refused(tcp, "bench_results", run_ids=",".join(["1"] * 101))
    assert bad.status == 400 and "'run_ids'" in bad.message
    bad = _refused(tcp, "runs", text="y" * 201)
    assert bad.status == 400 and "'text'" in bad.message
    bad = _refused(tcp, "runs", kinds="gpu.xid")  # a filter of another read: the accepted ones named
    assert bad.status == 400 and bad.code == "unknown_parameter" and "text" in bad.message
