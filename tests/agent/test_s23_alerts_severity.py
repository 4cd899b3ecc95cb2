"""Session 23: the alerts' severities and the docs that tell them agree, and the alerts the events had no page for
are there (a GPU whose readings fail, a /health failing for minutes, NVML failing told apart from no driver).

The rules are read as Prometheus reads them (YAML); their behaviour is promtool's unit tests
(contrib/prometheus/tests/lynxtop-rules.test.yml, run by tests/agent/io/test_io_prometheus.py)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "contrib" / "prometheus" / "lynxtop-rules.yml"
DOCS = ROOT / "docs" / "prometheus.md"


def _alerts() -> dict[str, dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def _table(header: str) -> list[list[str]]:
    """The rows of the docs table whose header line starts with `header`, cells stripped."""
    lines = DOCS.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def test_every_alert_is_in_the_docs_with_its_severity_and_for():
    alerts = _alerts()
    rows = {r[0].strip("`"): r for r in _table("| alert | expression | for | severity |")}
    assert rows.keys() == alerts.keys()
    for name, rule in alerts.items():
        assert rows[name][3] == rule["labels"]["severity"], name
        if "for" in rule:
            assert rows[name][2] == rule["for"], name


def test_the_severity_story_names_each_alert_with_the_rules_severity():
    alerts = _alerts()
    story = _table("| alert | severity | event behind it")
    assert {"LynxtopGpuUnreadable", "LynxtopServingHealthFailing", "LynxtopNvmlDown", "LynxtopNvmlNoDriver",
            "LynxtopGpuLost"} <= {r[0].strip("`") for r in story}
    for name, sev, event in story:
        assert alerts[name.strip("`")]["labels"]["severity"] == sev, name
        # critical or error events behind a critical alert, warning behind a warning one, but the two named
        want = "critical" if re.search(r"\((critical|error)", event) else "warning"
        if name.strip("`") not in ("LynxtopGpuXid", "LynxtopClusterViewDown"):
            assert sev == want, (name, event)
