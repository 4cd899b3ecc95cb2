"""Session 25 walk-through (H8), the CLI beside the dashboard: what `lynxtop stop --yes` prints after ending a
server the agent holds. Its "which agent, which profile" line said `profile (the default)`, a profile no stop acts
on, while it had just ended the held server of profile dsv41: the line names the held server's profile.

Against the real API server on a real unix socket (a fake controller behind it), as tests/cli/test_s25_held_cli.py.
"""

from __future__ import annotations

from support.cli import run_cli
from test_s25_held_cli import agent  # noqa: F401 - the fixture, used by name


def test_stop_yes_of_a_held_server_names_its_profile_not_the_default(agent, capsys):  # noqa: F811
    fake, path = agent
    code, out, _ = run_cli(capsys, "stop", "--yes", "--socket", path)
    assert code == 0 and [c[0] for c in fake.calls] == ["stop"], out
    line = next(ln for ln in out.splitlines() if ln.startswith("agent: "))
    assert "(the default)" not in line and line.endswith("profile dsv41"), out


def test_stop_yes_with_no_profile_anywhere_names_none(agent, capsys):  # noqa: F811
    """Nothing says which profile (an older agent's held server without one): `-`, never `(the default)`."""
    fake, path = agent
    fake.serving["held"] = {"run_id": 12, "profile": "", "pid": 4242}
    code, out, _ = run_cli(capsys, "stop", "--yes", "--socket", path)
    assert code == 0, out
    line = next(ln for ln in out.splitlines() if ln.startswith("agent: "))
    assert "(the default)" not in line and line.endswith("profile -"), out
