#!/usr/bin/env python3
"""Time the whole real-vLLM stage (prepare + the pytest module) against its budget: 13.5 min with a cold cache,
7.5 min with a warm one, on the 2-core machine. Prints ONE JSON object on its last line.

    .venv/bin/python tests/real_vllm/measure_stage.py [--rebuild]

The test outcome is reported, not judged here: the stage's own exit code is pytest's.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BUDGET_S = {"cold": 810, "warm": 450}  # +90 s each for the two-node Ray test (test_real_vllm_ray.py)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rebuild", action="store_true", help="time a cold cache (deletes and rebuilds it)")
    args = ap.parse_args()
    t0 = time.monotonic()
    prep = subprocess.run([sys.executable, str(HERE / "prepare.py"), *(["--rebuild"] if args.rebuild else [])],
                          capture_output=True, text=True, timeout=1800)
    prep_s = time.monotonic() - t0
    try:
        info = json.loads(prep.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        info = {"ok": False}
    t1 = time.monotonic()
    tests = subprocess.run([sys.executable, "-m", "pytest", "-m", "real_vllm", str(HERE), "-q", "-p",
                            "no:cacheprovider"], capture_output=True, text=True, cwd=REPO, timeout=3600)
    tests_s = time.monotonic() - t1
    tail = tests.stdout.strip().splitlines()[-1] if tests.stdout.strip() else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)", tail)}
    total = time.monotonic() - t0
    kind = "warm" if info.get("warm") else "cold"
    log = Path("/tmp") / f"lynxtop-real-vllm-stage-{int(time.time())}.log"
    log.write_text(tests.stdout + tests.stderr)
    sys.stdout.write(tests.stdout[-2000:] + f"\n(full pytest output: {log})\n")
    print(json.dumps({
        "stage": "real_vllm", "cache": kind, "prepare_ok": bool(info.get("ok")), "prepare_s": round(prep_s, 1),
        "tests_s": round(tests_s, 1), "total_s": round(total, 1), "budget_s": BUDGET_S[kind],
        "within_budget": total <= BUDGET_S[kind], "pytest_rc": tests.returncode,
        "passed": counts.get("passed", 0), "failed": counts.get("failed", 0),
        "errors": counts.get("error", 0) + counts.get("errors", 0), "skipped": counts.get("skipped", 0),
        "log": str(log),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
