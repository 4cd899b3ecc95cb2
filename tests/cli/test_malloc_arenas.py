"""The agent bounds glibc's malloc arenas before its threads start (issue 29.1, the soak's RSS).

Each case runs in a fresh interpreter (arenas are per process and never go away): eight threads allocate
and hold memory at once, then glibc's malloc_info() lists the arenas. Without the bound each thread gets its
own; with `bound_malloc_arenas()` there are at most two.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

_CHILD = textwrap.dedent("""
    import ctypes, sys, threading
    if sys.argv[1] == "bound":
        from lynxtop.cli.agent_cmd import bound_malloc_arenas
        assert bound_malloc_arenas()
    held, barrier = [], threading.Barrier(8)
    def work():
        barrier.wait()
        held.append([bytes(20_000 + i) for i in range(200)])
        barrier.wait()
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    f = libc.fopen(sys.argv[2].encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(f))
    libc.fclose(ctypes.c_void_p(f))
""")


def _arenas(tmp_path, mode: str) -> int:
    out = tmp_path / f"{mode}.xml"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    subprocess.run([sys.executable, "-c", _CHILD, mode, str(out)], check=True, env=env, timeout=60)
    return len(re.findall(r'<heap nr="\d+">', out.read_text()))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_threads_share_two_malloc_arenas_once_bounded(tmp_path):
    try:
        unbounded = _arenas(tmp_path, "free")
    except subprocess.CalledProcessError:
        pytest.skip("no glibc malloc_info here")
    assert unbounded > 2  # the workload does spread over arenas when nothing bounds them
    assert _arenas(tmp_path, "bound") <= 2
