"""The processes real vLLM runs beside its EngineCores with data parallelism or several API servers.

With `--api-server-count N` above 1 (vLLM 0.32's default is the DP size) the `vllm serve` process keeps its
command line and starts N `VLLM::APIServer_<i>` processes that share the listening socket; with DP above 1 it
also starts a `VLLM::DPCoordinator`. The simulator serves HTTP from its one process, so these stand-ins only
carry the titles (the process shape lynxtop's host sampler and the agent's tree walk see), idle, and die with
the server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from lynxtop.sim.proctitle import die_with_parent, set_title


def helper_titles(api_servers: int, dp: int) -> list[str]:
    """The titles of the helper processes vLLM 0.32 starts for this shape, in its start order."""
    titles = ["VLLM::DPCoordinator"] if dp > 1 else []
    if api_servers > 1:
        titles += [f"VLLM::APIServer_{i}" for i in range(api_servers)]
    return titles


def start_helpers(titles: list[str]) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-m", "lynxtop.sim.frontends", title, str(os.getpid())],
                             stdin=subprocess.DEVNULL) for title in titles]


def main(title: str, parent: int) -> int:
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:  # the server died before the link was made
        return 0
    set_title(title)
    for sig in (signal.SIGTERM, signal.SIGINT):  # a group signal ends it quietly
        signal.signal(sig, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
