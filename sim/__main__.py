"""`lynxtop-sim-vllm serve MODEL [vllm flags]` / `python -m lynxtop.sim serve ...`: the simulated vLLM.

A profile whose executable is this script behaves like `vllm serve` (argv = [exe, "serve", MODEL, flags…]).
"""

from __future__ import annotations

import sys

from lynxtop.sim.flags import DEFAULT_VERSION, SimUsageError, parse_serve_args

USAGE = ("usage: lynxtop-sim-vllm serve MODEL [vllm serve flags] [--sim-* switches]\n"
         "A SIMULATED vLLM server (no GPU, synthetic tokens). `lynxtop-sim-vllm serve x --help` lists the flags.")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--version", "-v"):
        print(f"{DEFAULT_VERSION}+sim")
        return 0
    if not argv or argv[0] != "serve":
        print(USAGE, file=sys.stderr)
        return 2
    try:
        args = parse_serve_args(argv[1:])
    except SimUsageError as exc:
        print(f"vllm serve: error: {exc}", file=sys.stderr)
        return 2
    from lynxtop.sim.server import serve  # aiohttp only once the flags are good

    return serve(args, argv[1:])


if __name__ == "__main__":
    sys.exit(main())
