"""Every alert in contrib/prometheus has a `promtool test rules` case where it fires and one where it does not.

promtool runs the cases (test_io_prometheus.py::test_alert_rules_pass_their_unit_tests) but says nothing about an
alert no case mentions: an alert added without a case, or one that was only ever shown firing (so a rule that
fires on everything would pass), is caught here.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
PROM_DIR = ROOT / "contrib" / "prometheus"


def rule_alerts(rule_file: Path) -> list[str]:
    doc = yaml.safe_load(rule_file.read_text()) or {}
    return [r["alert"] for g in doc.get("groups") or () for r in g.get("rules") or () if "alert" in r]


def rule_files(prom_dir: Path) -> list[Path]:
    """The rule files of a contrib directory: its YAML files with rule groups (prometheus.yml has none)."""
    return [p for p in sorted(prom_dir.glob("*.yml")) if "groups" in (yaml.safe_load(p.read_text()) or {})]


def cases(test_files: list[Path]) -> dict[tuple[Path, str], set[str]]:
    """(rule file, alert) -> the kinds of case a test file loading that rule file has: "firing" (exp_alerts listed)
    and "not firing" (exp_alerts empty or left out, which promtool reads as none)."""
    out: dict[tuple[Path, str], set[str]] = {}
    for tf in test_files:
        doc = yaml.safe_load(tf.read_text()) or {}
        loaded = [(tf.parent / r).resolve() for r in doc.get("rule_files") or ()]
        for group in doc.get("tests") or ():
            for case in group.get("alert_rule_test") or ():
                kind = "firing" if case.get("exp_alerts") else "not firing"
                for rf in loaded:
                    out.setdefault((rf, case["alertname"]), set()).add(kind)
    return out


def missing_cases(prom_dir: Path) -> list[str]:
    """One line per alert of prom_dir's rule files that lacks a firing or a not-firing case in prom_dir/tests/."""
    have = cases(sorted((prom_dir / "tests").glob("*.yml")))
    out = []
    for rf in rule_files(prom_dir):
        for alert in rule_alerts(rf):
            lacks = {"firing", "not firing"} - have.get((rf.resolve(), alert), set())
            if lacks:
                out.append(f"{rf.name}: {alert} has no {' and no '.join(sorted(lacks))} case")
    return out


def test_every_contrib_alert_has_a_firing_and_a_not_firing_case():
    assert rule_alerts(PROM_DIR / "lynxtop-rules.yml"), "no alert found: the parsing here is wrong"
    assert not missing_cases(PROM_DIR), "\n".join(missing_cases(PROM_DIR))


def test_an_alert_without_its_cases_is_named(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "prometheus.yml").write_text("rule_files: [rules.yml]\n")
    (tmp_path / "rules.yml").write_text("""
groups:
  - name: g
    rules:
      - record: r:x
        expr: x
      - alert: Covered
        expr: x == 1
      - alert: OnlyFiring
        expr: y == 1
      - alert: New
        expr: z == 1
""")
    (tmp_path / "other.yml").write_text("groups: [{name: h, rules: [{alert: Covered, expr: w == 1}]}]\n")
    (tmp_path / "tests" / "t.test.yml").write_text("""
rule_files: [../rules.yml]
tests:
  - input_series: []
    alert_rule_test:
      - {eval_time: 1m, alertname: Covered, exp_alerts: [{exp_labels: {}}]}
      - {eval_time: 1m, alertname: Covered}
      - {eval_time: 1m, alertname: OnlyFiring, exp_alerts: [{exp_labels: {}}]}
""")
    assert missing_cases(tmp_path) == [
        "other.yml: Covered has no firing and no not firing case",  # a case for rules.yml's Covered is not one
        "rules.yml: OnlyFiring has no not firing case",
        "rules.yml: New has no firing and no not firing case",
    ]
