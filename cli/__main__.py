"""Entry point of the `lynxtop` console script and of `python -m lynxtop`."""

from __future__ import annotations

import gc
import importlib
import sys

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
    return rc


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
