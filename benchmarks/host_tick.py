"""The clock thread's host side per 1 Hz tick: CPU of `HostSampler.sample` on a vLLM-sized process tree.

A tree like the DP8 server's (a leader and `--procs - 1` children: API server, engine cores, workers) is started,
then `ticks` samples are taken with a simulated clock one second apart, as at 1 Hz sampling: every tick reads the
whole row (host counters and the tree's usage), every 5th re-walks the tree, as the agent does. With `--members`
the node's look for the run's other processes (ProcTable.members, every 5 s) is added: from the tree's first
tick, as in the agent, or with `--out-of-step` from the tick after (the two 5 s clocks out of step).
Figures are the thread's CPU (time.thread_time) per tick in microseconds: medians of `--rounds` rounds; and, robust
to a loaded machine's bursts, the median of the ticks that walk the tree (a /proc listing: every 5th) and of the
others, each tick timed on its own (`us_per_tick_from_medians` weighs them as they came). `fds_held`: descriptors
the sampler and table keep open at the end (the kept /proc files). The database file exists, as in the agent. Ticks
back to back read /proc files that have not changed since the tick before; `--spacing-ms 20` lets them move. To compare
with older code, run it with PYTHONPATH pointing at a directory whose `lynxtop` package is that checkout (the
`code` key says which ran): a `lynxtop/` of links to the checkout's root/ files and its agent/, contract/, ...
folders, as the editable install maps them. Last line: one JSON object.
Usage: python benchmarks/host_tick.py [--ticks 2000] [--rounds 5] [--procs 10] [--members [--out-of-step]]
                                     [--spacing-ms 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from lynxtop.agent import host
from lynxtop.agent.host import HostSampler
from lynxtop.agent.serving import procs
from lynxtop.agent.serving.proctable import ProcTable


def _tree(n: int) -> subprocess.Popen:
    """A leader with n - 1 sleeping children (its own process group)."""
    script = f"for i in $(seq {n - 1}); do sleep 1000 & done; wait"
    return subprocess.Popen(["sh", "-c", script], start_new_session=True)


def _median_us(ns: list[int]) -> float:
    return round(statistics.median(ns) / 1e3, 1) if ns else 0.0


def run(ticks: int, rounds: int, n: int, members: bool, out_of_step: bool, spacing_s: float) -> dict:
    listings = [0]
    all_pids = procs.all_pids

    def counted() -> list[int]:
        listings[0] += 1
        return all_pids()

    procs.all_pids = counted  # type: ignore[assignment]  # listings of /proc, by old and new code alike
    fds0 = len(os.listdir("/proc/self/fd"))
    leader = _tree(n)
    try:
        time.sleep(0.5)  # the children started
        pgid = os.getpgid(leader.pid)
        t = [1000.0]
        clock = lambda: t[0]  # noqa: E731 - a simulated clock: one second a tick
        table = ProcTable(clock=clock)
        with tempfile.TemporaryDirectory() as tmp:
            db = os.path.join(tmp, "db.sqlite")
            open(db, "wb").close()  # as in the agent, the database exists (its disk is looked up once)
            sampler = HostSampler(db, clock=clock, table=table)
            members_at = -1e9
            if members and not out_of_step:  # as in the agent: both start on the run's first tick
                table.members(None, pgid, [leader.pid], 0)
                members_at = t[0]
            sampler.sample(leader.pid)
            procs_seen = len(sampler.tree_pids)
            per_round = []
            kinds: dict[str, list[int]] = {"walk": [], "plain": []}  # each tick's ns, by whether /proc was listed
            listings[0] = 0
            for _ in range(rounds):
                c0 = time.thread_time()
                for _ in range(ticks):
                    k0, n0 = time.thread_time_ns(), listings[0]
                    t[0] += 1.0 + 1e-6  # a tick's jitter: never exactly one second
                    if members and t[0] - members_at > 5.0:  # as Node._run_members, ahead of the sample
                        table.members(None, pgid, [leader.pid], 0)
                        members_at = t[0]
                    sampler.sample(leader.pid)
                    kinds["walk" if listings[0] != n0 else "plain"].append(time.thread_time_ns() - k0)
                    if spacing_s:
                        time.sleep(spacing_s)  # not in the thread's CPU time
                per_round.append((time.thread_time() - c0) / ticks * 1e6)
            fds_held = len(os.listdir("/proc/self/fd")) - fds0  # kept /proc descriptors at the end
    finally:
        os.killpg(leader.pid, 15)
        leader.wait()
    return {"bench": "host_tick", "code": host.__file__.rsplit("/agent/", 1)[0], "procs": procs_seen,
            "members": members, "out_of_step": out_of_step, "ticks": ticks,
            "spacing_ms": spacing_s * 1000,
            "proc_listings_per_5_ticks": round(listings[0] / (ticks * rounds) * 5, 2),
            "fds_held": fds_held,
            "rounds": [round(x, 1) for x in per_round],
            "us_per_tick_median": round(statistics.median(per_round), 1),
            # per-tick medians: robust to a loaded machine's bursts (a round's mean is not)
            "us_walk_tick_median": _median_us(kinds["walk"]),
            "us_plain_tick_median": _median_us(kinds["plain"]),
            "us_per_tick_from_medians": round(sum(_median_us(v) * len(v) for v in kinds.values())
                                              / (ticks * rounds), 1),
            "pct_of_core_at_1hz": round(statistics.median(per_round) / 1e4, 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--procs", type=int, default=10)
    ap.add_argument("--members", action="store_true")
    ap.add_argument("--spacing-ms", type=float, default=0.0,
                    help="wall time between ticks: /proc counters move between reads, as they do a second apart")
    ap.add_argument("--out-of-step", action="store_true", help="the members' look starts a tick after the tree's")
    a = ap.parse_args()
    print(json.dumps(run(a.ticks, a.rounds, a.procs, a.members, a.out_of_step, a.spacing_ms / 1000)), file=sys.stdout)


if __name__ == "__main__":
    main()
