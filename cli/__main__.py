"""Entry point of the `lynxtop` console script and of `python -m lynxtop`."""

from __future__ import annotations

import gc
import importlib
import io
import sys
from typing import Any

from lynxtop.cli.parser import build_parser


def main(argv: list[str] | None = None) -> int:
    # No garbage collection while the command's modules import: they allocate much and free little, and the passes
    # are start-up time (the dashboard keeps it paused until its first frame: cli/dashboard_cmd.py)
    gc.disable()
    try:
        parser = build_parser()
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)  # relative times joined by the parser
        module_name, func_name = args.handler.split(":")
        try:
            handler = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as exc:
            print(f"lynxtop: this command is not available in this build ({exc})", file=sys.stderr)
            return 2
    finally:
        gc.enable()
    if sys.stdout is None and args.handler in WRITES_STDOUT and not getattr(args, "output", None):
        # `lynxtop runs >&-` (a cron line): what it reads would go nowhere; say so rather than exit 0 or crash
        print(f"lynxtop {getattr(args, 'command', None) or 'dashboard'}: stdout is closed: nothing can be written "
              "(run it with stdout open, or give -o FILE to export)", file=sys.stderr)
        return 1
    if args.handler in WRITES_STDOUT:
        _guard_stdout()
    _escape_unencodable()
    try:
        rc = int(handler(args) or 0)
        if sys.stdout is not None and not sys.stdout.closed:
            sys.stdout.flush()  # what is still buffered: a closed pipe shows here, not in the interpreter's exit
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        if not _stdout_gone():  # another pipe or socket (the agent's): a real error
            raise
        _discard_stdout()  # `lynxtop runs | head`: the reader has what it wanted; normal use, not an error
        return 0
    except OSError as exc:
        if not getattr(exc, "lynxtop_stdout", False):  # another file or socket: not ours to explain here
            raise
        # `lynxtop events >> log` on a full disk: one line naming stdout, not a traceback
        _discard_stdout()
        print(f"lynxtop: cannot write to stdout: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return rc


# The commands that print what they read on stdout: with no stdout at all (`>&-`), their output is lost. The
# dashboard, agent and demo have other ways out (a terminal, a log); export with -o writes a file.
WRITES_STDOUT = frozenset({"lynxtop.cli.ctl:status", "lynxtop.cli.store_cli:runs", "lynxtop.cli.store_cli:export",
                           "lynxtop.cli.events_cmd:run", "lynxtop.cli.bench:compare",
                           "lynxtop.cli.bench:list_sweeps", "lynxtop.cli.check_cmd:run",
                           "lynxtop.cli.config_cli:check"})


def _escape_unencodable() -> None:
    """On a stdout/stderr that is not UTF-8 (LC_ALL=C with Python's coercion off, PYTHONIOENCODING=ascii), a
    character it cannot encode is written as a \\x escape instead of raising UnicodeEncodeError in the middle
    of a status: a profile or event text from the server must not cost the operator the whole output."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
        if stream is None or encoding == "utf8" or not hasattr(stream, "reconfigure"):
            continue
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):  # not a text stream we may change: leave it as it is
            pass


class _StdoutRaw(io.FileIO):
    """stdout's file descriptor, marking the error of a write to it: main() tells a failed write to stdout (a full
    disk under `>> log`) from any other OSError of the command (a file it reads, the agent's socket)."""

    def write(self, b: Any) -> int | None:  # type: ignore[override]
        try:
            return super().write(b)
        except OSError as exc:
            exc.lynxtop_stdout = True  # type: ignore[attr-defined]
            raise


def _guard_stdout() -> None:
    """Put stdout (the process's own, not a test's stand-in) on _StdoutRaw, keeping its encoding and buffering."""
    out = sys.stdout
    if out is None or out is not sys.__stdout__ or not isinstance(out, io.TextIOWrapper):
        return
    try:
        fd = out.fileno()
        out.flush()
        raw = _StdoutRaw(fd, "w", closefd=False)
    except (OSError, ValueError):  # closed, or not a file descriptor: leave it as it is
        return
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding=out.encoding, errors=out.errors,
                                  line_buffering=out.line_buffering)


def _stdout_gone() -> bool:
    """Whether stdout is a pipe or socket that nobody reads any more (poll reports an error on its write end)."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no stdout, or not a file descriptor
        return False


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of what is still buffered writes nowhere
    instead of printing a second, raw BrokenPipeError at exit."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
