"""--config, --socket and --database are honoured wherever they are written, or refused where they do not apply;
every numeric argument of every command refuses what is out of range with a usage error (exit 2, no traceback).

Before, the subcommands declared the same options with a None default, which overwrote the value parsed before
the command: `lynxtop --socket A stop -y` stopped the agent of the default config.
"""

from __future__ import annotations

import argparse

import pytest

from lynxtop.cli.parser import TAKES, build_parser

# every command (as argv, where the target options go after it), and the handler argparse must pick
COMMANDS = {
    "dashboard": (["dashboard"], "lynxtop.cli.dashboard_cmd:run"),
    "demo": (["demo"], "lynxtop.cli.demo:run"),
    "agent": (["agent"], "lynxtop.cli.agent_cmd:run"),
    "status": (["status"], "lynxtop.cli.ctl:status"),
    "start": (["start"], "lynxtop.cli.ctl:start"),
    "stop": (["stop", "-y"], "lynxtop.cli.ctl:stop"),
    "restart": (["restart", "-y"], "lynxtop.cli.ctl:restart"),
    "switch": (["switch", "p2", "-y"], "lynxtop.cli.ctl:switch"),
    "ray start": (["ray", "start"], "lynxtop.cli.ctl:ray_start"),
    "ray stop": (["ray", "stop", "-y"], "lynxtop.cli.ctl:ray_stop"),
    "runs": (["runs"], "lynxtop.cli.store_cli:runs"),
    "events": (["events"], "lynxtop.cli.events_cmd:run"),
    "export": (["export", "--run", "1"], "lynxtop.cli.store_cli:export"),
    "check": (["check"], "lynxtop.cli.check_cmd:run"),
    "bench": (["bench"], "lynxtop.cli.bench:run"),
    "bench compare": (["bench", "compare", "a", "b"], "lynxtop.cli.bench:compare"),
    "bench list": (["bench", "list"], "lynxtop.cli.bench:list_sweeps"),
    "config check": (["config", "check"], "lynxtop.cli.config_cli:check"),
}
OPTIONS = ("config", "socket", "database")


def _positions(argv: list[str], option: list[str]) -> dict[str, list[str]]:
    """The option before the command, right after the command word(s), and at the end."""
    words = 2 if argv[0] in ("ray", "bench", "config") and len(argv) > 1 and argv[1] in (
        "start", "stop", "compare", "list", "check") else 1
    out = {"before": [*option, *argv], "after": [*argv[:words], *option, *argv[words:]], "end": [*argv, *option]}
    if words == 2:
        out["between"] = [argv[0], *option, *argv[1:]]  # `lynxtop bench --database X list`
    return out


def _cases():
    for cmd, (argv, handler) in COMMANDS.items():
        for name in OPTIONS:
            for where, full in _positions(argv, [f"--{name}", f"/given/{name}"]).items():
                yield pytest.param(cmd, handler, name, full, id=f"{cmd}-{name}-{where}")


def _parse_exit(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    return exc.value.code, capsys.readouterr().err


def test_the_table_names_every_handler():
    assert {h for _, h in COMMANDS.values()} == set(TAKES)


@pytest.mark.parametrize(("cmd", "handler", "name", "argv"), list(_cases()))
def test_an_option_is_honoured_in_every_position_or_refused(cmd, handler, name, argv, capsys):
    if name in TAKES[handler]:
        args = build_parser().parse_args(argv)
        assert args.handler == handler
        assert getattr(args, name) == f"/given/{name}"
        for other in OPTIONS:  # and the others stay unset: the command falls back to the config for them
            if other != name:
                assert getattr(args, other) is None
    else:
        code, err = _parse_exit(argv, capsys)
        assert code == 2
        assert f"--{name} does not apply to `lynxtop {cmd}`" in err and "Traceback" not in err


def test_no_command_is_the_dashboard_and_takes_all_three():
    args = build_parser().parse_args(["--socket", "/s", "--database", "/d", "--config", "/c"])
    assert (args.handler, args.socket, args.database, args.config) == (
        "lynxtop.cli.dashboard_cmd:run", "/s", "/d", "/c")


def test_the_same_option_twice_with_different_values_is_refused(capsys):
    code, err = _parse_exit(["--socket", "/a.sock", "stop", "-y", "--socket", "/b.sock"], capsys)
    assert code == 2 and "--socket given twice with different values ('/a.sock' and '/b.sock')" in err
    args = build_parser().parse_args(["--socket", "/a.sock", "stop", "--socket", "/a.sock"])
    assert args.socket == "/a.sock"  # the same value twice is no contradiction


# ---------------------------------------------------------------------------------------------- numbers

BAD_NUMBERS = ("99999999999999999999", "-99999999999999999999", "-1", "nan", "inf", "-inf", "1e400", "12abc", "")


def _numeric_options():
    """(argv of the command, option) for every option anywhere in the tree whose value is a number."""
    def walk(parser: argparse.ArgumentParser, path: list[str]):
        for action in parser._actions:  # noqa: SLF001 - walking argparse's tree
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                for name, sub in action.choices.items():
                    yield from walk(sub, [*path, name])
            elif action.type is not None and action.option_strings:
                yield path, action

    return list(walk(build_parser(), []))


def test_no_numeric_argument_is_an_unbounded_int_or_float():
    """argparse's bare int/float take 10**20, -5, nan and inf; every number goes through a bounded type."""
    found = _numeric_options()
    assert len(found) >= 15
    for path, action in found:
        assert action.type not in (int, float), f"{' '.join(path)} {action.option_strings[0]} is unbounded"


@pytest.mark.parametrize("value", BAD_NUMBERS)
def test_every_numeric_argument_refuses_nonsense_with_a_usage_error(value, capsys):
    for path, action in _numeric_options():
        option = action.option_strings[-1]
        extra = ["--run", "1"] if path == ["export"] and option != "--run" else []
        code, err = _parse_exit([*path, *extra, f"{option}={value}"], capsys)
        assert code == 2, (path, option, value)
        assert f"argument {option}" in err and "Traceback" not in err, err


@pytest.mark.parametrize(("argv", "attr", "value"), [
    (["runs", "--limit", "1"], "limit", 1), (["export", "--run", "9223372036854775807"], "run", 2**63 - 1),
    (["bench", "--warmup", "0", "--seed", "0"], "warmup", 0),
    (["demo", "--startup-seconds", "0"], "startup_seconds", 0),
    (["bench", "--request-rate", "0.5"], "request_rate", [0.5]), (["bench", "list", "--limit", "3"], "limit", 3),
])
def test_numbers_in_range_still_pass(argv, attr, value):
    assert getattr(build_parser().parse_args(argv), attr) == value
