"""The simulated vLLM refuses what real vLLM refuses: flags vLLM 0.32 no longer has (its option list:
sim/vllm_options.py) and `--shutdown-timeout` when imitating a vLLM before 0.18, with argparse's error and exit 2, so
a profile that would crash-loop on a GPU node fails the same way on the simulator.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lynxtop.sim.flags import parse_serve_args
from lynxtop.sim.vllm_options import VLLM_SERVE_OPTIONS

SIM = Path(sys.executable).parent / "lynxtop-sim-vllm"
GONE = [("--swap-space", "4"), ("--disable-log-requests",), ("--max-seq-len-to-capture", "8192"),
        ("--tokenizer-pool-size", "2"), ("--cuda-graph-sizes", "8")]


@pytest.mark.parametrize("args", GONE, ids=[a[0] for a in GONE])
def test_a_flag_vllm_032_dropped_is_refused(args, capsys):
    assert args[0] not in VLLM_SERVE_OPTIONS  # what vLLM 0.32 takes, read from its wheel
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(["m", *args], env={})
    assert exc.value.code == 2
    assert f"error: unrecognized arguments: {' '.join(args)}" in capsys.readouterr().err


@pytest.mark.parametrize("version", ["0.10", "0.17.1"])
def test_shutdown_timeout_is_refused_before_018(version, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(["m", "--sim-vllm-version", version, "--shutdown-timeout", "5"], env={})
    assert exc.value.code == 2
    assert "error: unrecognized arguments: --shutdown-timeout 5" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the version from the environment too, and the `=` form
        parse_serve_args(["m", "--shutdown-timeout=5"], env={"LYNXTOP_SIM_VLLM_VERSION": version})
    assert "unrecognized arguments: --shutdown-timeout=5" in capsys.readouterr().err
    assert parse_serve_args(["m", "--sim-vllm-version", version], env={}).shutdown_timeout_s == 0.0


@pytest.mark.parametrize("version", ["0.18", "0.32.0"])
def test_shutdown_timeout_is_taken_from_018(version):
    assert parse_serve_args(["m", "--sim-vllm-version", version, "--shutdown-timeout", "5"],
                            env={}).shutdown_timeout_s == 5.0


def test_the_simulator_process_exits_2_with_argparses_line():
    """The executable itself, as the agent starts it: argparse's line on stderr, status 2, nothing started."""
    p = subprocess.run([str(SIM), "serve", "m", "--swap-space", "4"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == "vllm serve: error: unrecognized arguments: --swap-space 4"
