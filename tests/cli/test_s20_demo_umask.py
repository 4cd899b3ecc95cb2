"""The demo's directories pass the agent's directory checks under a user's umask of 0002 (Ubuntu's default for
users with a private group): the agent refuses a state or log directory others may write (session 20)."""

from __future__ import annotations

import os

from lynxtop.agent import dirtrust
from lynxtop.cli.demo import Demo


def test_the_demos_directories_are_private_under_a_umask_of_0002(tmp_path):
    old = os.umask(0o002)
    try:
        demo = Demo(tmp_path / "demo", startup_seconds=1, keep=True)
        demo.write_config()
    finally:
        os.umask(old)
    p = demo.paths
    for d, what in ((p.root, "the state directory"), (p.logs, "the log directory"),
                    (p.sim_state, "the simulated GPUs' directory")):
        assert dirtrust.problem(d, what, "--state-dir") is None, oct(d.stat().st_mode)
