"""`lynxtop bench`, `lynxtop bench compare A B` and `lynxtop bench list` (docs/bench.md).

The sweep talks to the served model directly (the URL from the agent's status, or --url); each finished level
goes to the agent (`POST /v1/bench`), the database's one writer, tied to the run that served it. Reading the
stored sweeps back (compare, list) opens the database read-only, like `lynxtop runs`.
Exit codes: 0 every level complete without failures; 1 failures, a partial level or the server gone; 2 usage
(no such model, a bad option); 3 neither the agent nor --url gives a server; 130 stopped by Ctrl-C. The model's
API key: --api-key, else VLLM_API_KEY, else OPENAI_API_KEY (a command line is every local user's to read); the
model refusing it (HTTP 401/403) is exit 1 with its own message, not 3.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import stat
import sys
import tempfile
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

from lynxtop.cli import bench_result, bench_traffic, bench_view
from lynxtop.cli.bench_load import Level, ServerError, Workload, served_models, session
from lynxtop.cli.bench_stats import db_row, from_db_row
from lynxtop.cli.bench_sweep import ProgressLine, SweepResult, sweep
from lynxtop.contract.client import AgentClient, AgentRefused, AgentUnreachable
from lynxtop.contract.jsonsafe import finite, strict_dumps
from lynxtop.contract.loop import run_loop
from lynxtop.contract.terminal import terminal_safe

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)


class BenchError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def _err(msg: str) -> None:
    print(terminal_safe(f"lynxtop bench: {msg}", lines=True), file=sys.stderr)


def _config(args: Namespace) -> Any:
    from lynxtop.cli.config_cli import load_or_exit

    return load_or_exit(args)


# ---------------------------------------------------------------------------------------------- the API key

# where the key comes from without --api-key: vLLM serve's own variable, then the one `vllm bench serve` and
# OpenAI clients read
KEY_ENV = ("VLLM_API_KEY", "OPENAI_API_KEY")
# served_models' message for an HTTP answer: 401 (no or wrong key, vLLM's --api-key) and 403 refuse the key
_REFUSED = re.compile(r"answered HTTP (401|403)\b")


def api_key(args: Namespace) -> tuple[str | None, str]:
    """The served model's API key and where it came from (an option, else a variable); (None, "") without one.
    The environment is the better way: /proc/PID/cmdline, where --api-key sits for the whole sweep, is every
    local user's to read, and a shell's history keeps it."""
    if args.api_key is not None:
        return args.api_key, "--api-key"
    for var in KEY_ENV:
        value = os.environ.get(var)
        if value:
            return value, var
    return None, ""


def _key_refused(exc: ServerError, source: str) -> BenchError | None:
    """A clear error (exit 1: the server is there, it refuses the key) for a 401 or 403, else None."""
    if getattr(exc, "status", None) not in (401, 403) and not _REFUSED.search(str(exc)):
        return None
    given = f"the API key from {source} was refused" if source else "no API key was given"
    return BenchError(f"{exc}: {given}; give the key the model serves with (vLLM's --api-key) in VLLM_API_KEY or "
                      "OPENAI_API_KEY (or --api-key, which every local user sees in ps)", EXIT_FAILED)


# ---------------------------------------------------------------------------------------------- the target

def _agent(args: Namespace, cfg: Any) -> AgentClient | None:
    path = getattr(args, "socket", None) or (str(cfg.agent.socket) if cfg else None)
    return AgentClient(path) if path else None


def _serving(client: AgentClient | None) -> dict[str, Any]:
    """What the agent says serves now ({} without an agent): url, model, run id, profile, version, flags."""
    if client is None:
        return {}
    try:
        st = client.status()
    except (AgentUnreachable, AgentRefused):
        return {}
    s = st.serving
    meta: dict[str, Any] = {"url": s.url, "model": s.model, "run_id": s.run_id, "profile": s.profile,
                            "vllm_version": s.vllm_version, "state": str(s.state)}
    with contextlib.suppress(AgentUnreachable, AgentRefused, KeyError, TypeError):
        run = next((r for r in client.runs(limit=5) if r.id == s.run_id), None)
        meta |= {"flags": run.flags if run else None, "simulated": int(bool(run and run.simulated))}
    return meta


def _target(args: Namespace, serving: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The base URL and the run facts that belong to it (none when --url points elsewhere)."""
    url = (args.url or serving.get("url") or "").rstrip("/")
    if not url:
        why = "the agent serves nothing now" if serving else "the agent is unreachable"
        raise BenchError(f"no server to benchmark: {why}; give --url http://HOST:PORT", EXIT_UNREACHABLE)
    if args.url and serving.get("url") and args.url.rstrip("/") != serving["url"].rstrip("/"):
        serving = {}
    return url, serving


async def _model(url: str, wanted: str | None, hint: str | None, api_key: str | None) -> tuple[str, str]:
    """The model to request and its root (vLLM's model_id in --save-result files)."""
    async with session(4, 30) as sess:
        names = await served_models(sess, url, api_key)
    if not names:
        raise BenchError(f"{url}/v1/models lists no model", EXIT_FAILED)
    if wanted and wanted not in names:
        raise BenchError(f"model {wanted!r} is not served at {url} (served: {', '.join(names)})", EXIT_USAGE)
    name = wanted or (hint if hint in names else next(iter(names)))
    return name, names[name]


# ---------------------------------------------------------------------------------------------- the levels

def levels_of(args: Namespace) -> list[Level]:
    """The sweep: concurrency levels (closed loop), or request rates (open loop, capped by --max-concurrency)."""
    if args.request_rate:
        return [Level(concurrency=args.max_concurrency, rate=r, requests=0 if args.duration else args.requests or 64,
                      duration_s=args.duration) for r in args.request_rate]
    return [Level(concurrency=c, requests=0 if args.duration else _requests(args, c), duration_s=args.duration)
            for c in args.concurrency or DEFAULT_CONCURRENCY]


def _requests(args: Namespace, concurrency: int) -> int:
    if args.requests:
        return args.requests
    return args.rounds * concurrency if args.rounds else max(4 * concurrency, 8)


MAX_PROMPTS_FILE = 256 << 20


def _prompts(path: str | None) -> tuple[str, ...]:
    """Text prompts from a file: JSON lines with "prompt" (vLLM's custom dataset) or one prompt a line. Read
    before the server is asked anything; a bad file is exit 2 naming the file and the line."""
    if not path:
        return ()
    raw = _read_prompts_file(path)
    out = []
    for n, line in enumerate(raw.split(b"\n"), 1):
        try:
            text = line.decode("utf-8").removesuffix("\r")
        except UnicodeDecodeError as exc:
            raise BenchError(f"--prompts {path}:{n}: not UTF-8 (byte {exc.start + 1} of the line)", EXIT_USAGE) \
                from None
        if text.strip():
            out.append(_prompt(text, f"--prompts {path}:{n}") if text.lstrip().startswith("{") else text)
    if not out:
        raise BenchError(f"--prompts {path} holds no prompt", EXIT_USAGE)
    return tuple(out)


def _read_prompts_file(path: str) -> bytes:
    """The file's bytes: a regular file (a FIFO would block, /dev/zero never end) of at most MAX_PROMPTS_FILE."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO opens at once, then is refused
    except FileNotFoundError:
        raise BenchError(f"--prompts {path}: no such file", EXIT_USAGE) from None
    except OSError as exc:
        raise BenchError(f"--prompts {path}: {exc.strerror or exc}", EXIT_USAGE) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BenchError(f"--prompts {path} is not a regular file", EXIT_USAGE)
    with os.fdopen(fd, "rb") as f:
        try:
            raw = f.read(MAX_PROMPTS_FILE + 1)
        except OSError as exc:
            raise BenchError(f"--prompts {path}: {exc.strerror or exc}", EXIT_USAGE) from None
    if len(raw) > MAX_PROMPTS_FILE:
        raise BenchError(f"--prompts {path} is over {MAX_PROMPTS_FILE >> 20} MiB", EXIT_USAGE)
    return raw


def _prompt(text: str, where: str) -> str:
    """The "prompt" of one JSON line: a non-empty string."""
    try:
        obj = json.loads(text)
    except RecursionError:
        raise BenchError(f"{where}: not JSON: nested too deep", EXIT_USAGE) from None
    except ValueError as exc:
        raise BenchError(f"{where}: not JSON: {exc}", EXIT_USAGE) from None
    if not isinstance(obj, dict) or "prompt" not in obj:
        raise BenchError(f'{where}: no "prompt" in the JSON line', EXIT_USAGE)
    if not isinstance(obj["prompt"], str) or not obj["prompt"]:
        raise BenchError(f'{where}: "prompt" is not a non-empty string', EXIT_USAGE)
    return obj["prompt"]


def _check(args: Namespace, key_source: str = "--api-key") -> None:
    """Every option checked before the server is asked anything (exit 2, nothing sent, nothing written)."""
    bad = [f"{name} must be at least 1" for name, v in (("--input-len", args.input_len),
                                                          ("--output-len", args.output_len)) if v < 1]
    bad += _api_key_problem(args.api_key, key_source)
    bad += _json_problem(args.json) if args.json else []
    bad += ["--rounds must be at least 1"] if args.rounds is not None and args.rounds < 1 else []
    bad += ["--concurrency levels must be at least 1"] if any(c < 1 for c in args.concurrency or ()) else []
    bad += ["--request-rate must be above 0"] if any(r <= 0 for r in args.request_rate or ()) else []
    if args.save_result:
        bad += _result_dir_problem(Path(args.result_dir or "."))
    elif args.result_dir or args.label:
        bad.append("--result-dir and --label go with --save-result")
    if bad:
        raise BenchError("; ".join(bad), EXIT_USAGE)


def _api_key_problem(key: str | None, source: str = "--api-key") -> list[str]:
    """An HTTP header carries printable ASCII only: anything else failed late and unclearly (a UnicodeEncodeError
    per request), and a CR LF would add headers of its own. The key itself is never printed, only its source."""
    bad = next((i for i, c in enumerate(key or "", 1) if not " " <= c <= "~"), None)
    return [f"{source} must be printable ASCII (character {bad} is not)"] if bad else []


def _json_problem(path: str) -> list[str]:
    """Why --json could not write `path` when the sweep ends (checked now: the sweep must not run for nothing).
    An existing file is never replaced: it may be an earlier sweep's, or anyone's."""
    p = Path(path)
    if p.is_dir():
        return [f"--json {path} is a directory"]
    if p.exists() or p.is_symlink():
        return [f"--json {path} exists; give a new file name (bench never writes over a file)"]
    parent = p.parent
    if not parent.is_dir():
        return [f"--json {path}: no directory {parent}"]
    if not os.access(parent, os.W_OK | os.X_OK):
        return [f"--json {path}: the directory {parent} is not writable"]
    return []


def _result_dir_problem(d: Path) -> list[str]:
    """Why --save-result could not write into `d` (checked before the sweep, not after its first level)."""
    if d.exists() and not d.is_dir():
        return [f"--result-dir {d} is not a directory"]
    parent = d if d.exists() else next((p for p in d.parents if p.exists()), Path("."))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return [f"--result-dir {d}: {parent} is not writable"]
    return []


# ---------------------------------------------------------------------------------------------- storing

class Store:
    """Hands each level to the agent; remembers why not when it cannot (the results stay in --json)."""

    def __init__(self, client: AgentClient | None, meta: dict[str, Any]):
        self.client, self.meta = client, meta
        self.stored, self.problem = 0, "" if client else "no agent (--no-store or no config)"

    def __call__(self, summary: dict[str, Any]) -> None:
        print(f"  {bench_view.level_label(summary)}: {summary['completed']} ok, {summary['failed']} failed, "
              f"{summary['output_throughput']:.1f} output tok/s", file=sys.stderr)
        if self.client is None or self.problem:
            return
        try:
            self.client.request("POST", "/v1/bench", body={"result": db_row(summary, self.meta)})
            self.stored += 1
        except AgentUnreachable as exc:
            self.problem = f"agent unreachable: {exc}"
        except AgentRefused as exc:
            self.problem = f"agent refused ({exc.code}): {exc.message}"


def _json_levels(result: SweepResult, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """--json: one object a level with vLLM's set-up and metric keys and types (bench_result.level_json)."""
    date = bench_result.now()
    return [bench_result.level_json(s, meta, date) for s in result.levels]


# ---------------------------------------------------------------------------------------------- run

def run(args: Namespace) -> int:
    cfg = _config(args) if not args.url or not args.no_store else None
    client = None if args.no_store else _agent(args, cfg)
    args.api_key, key_source = api_key(args)
    try:
        _check(args, key_source)
        prompts = _prompts(args.prompts)
        url, serving = _target(args, _serving(client))
        model, model_id = asyncio.run(_model(url, args.model, serving.get("model"), args.api_key))
        wl = Workload(url, model, args.input_len, args.output_len, args.seed, args.api_key, prompts,
                      keep_text=bool(args.save_result))
    except ServerError as exc:
        refused = _key_refused(exc, key_source)
        _err(str(refused or exc))
        return refused.code if refused else EXIT_UNREACHABLE
    except BenchError as exc:
        _err(str(exc))
        return exc.code
    bench_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.getpid() % 1000:03d}"
    meta = serving | {"bench_id": bench_id, "model": model, "model_id": model_id, "name": args.name,
                      "label": args.label, "input_len": args.input_len, "output_len": args.output_len}
    sla = (cfg.sla.ttft_p99_ms, cfg.sla.tpot_p99_ms) if cfg else (None, None)
    store = Store(client, meta)
    saver = bench_result.Saver(url, Path(args.result_dir or "."), meta) if args.save_result else None
    print(terminal_safe(f"lynxtop bench {bench_id}: {url} model {model}, input {args.input_len} / output "  # served
                        f"{args.output_len} tokens" + (f", run {meta['run_id']} ({meta.get('profile')})"
                                                       if meta.get("run_id") else "")),
          file=sys.stderr)
    try:
        result = run_loop(_sweep(wl, levels_of(args), args, store, sla, saver))
    except asyncio.CancelledError:  # a second Ctrl-C: the level in flight is dropped, the finished ones stay
        kept = f"{store.stored} finished level(s) stored as sweep {meta['bench_id']}" if store.stored else \
            "no level had finished"
        print(f"lynxtop bench: aborted; {kept}", file=sys.stderr)
        return 130
    return _report(result, meta, store, args, saver)


async def _sweep(wl: Workload, levels: list[Level], args: Namespace, store: Store,
                 sla: tuple[float | None, float | None], saver: bench_result.Saver | None) -> SweepResult:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    presses = {"n": 0}

    def on_sigint() -> None:  # first: stop cleanly; second: cancel at once
        presses["n"] += 1
        if presses["n"] == 1:
            print("\nstopping: Ctrl-C again to abort at once", file=sys.stderr)
            stop.set()
        elif main is not None:
            main.cancel()

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # redraws only when both streams are a terminal: `bench > log` (stderr still a terminal) or `2>&1` to a
    # file would otherwise fill the log with the bar's redraws; off a terminal, plain lines
    progress = ProgressLine(tty=sys.stdout.isatty() and sys.stderr.isatty())
    try:
        watch = bench_traffic.TrafficWatch(wl.url, wl.api_key)  # first: the level's key goes in its file too
        hook = bench_traffic.Hooks([watch] + ([saver] if saver else []))
        return await sweep(wl, levels, warmup=args.warmup, stop=stop, sink=store, sla=sla,
                           progress=progress, timeout_s=args.timeout, hook=hook)
    finally:
        progress.close()  # however the sweep ends (a second Ctrl-C too): the terminal clean, every row kept
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)


def _write_json(result: SweepResult, meta: dict[str, Any], wanted: str) -> tuple[Path | None, str]:
    """--json, written before anything is printed (the results first) and never over a file: one that appeared
    during the sweep is kept and the levels go beside it (`-2`); a directory gone or a full disk sends them to
    the temporary directory instead. Returns where they went and what to say about it ("" when as asked)."""
    data = (json.dumps(_json_levels(result, meta), indent=2) + "\n").encode()
    try:
        path = bench_result.write_new(Path(wanted), data)
    except OSError as exc:
        why = f"cannot write --json {wanted}: {exc.strerror or exc}"
        try:
            path = bench_result.write_new(Path(tempfile.gettempdir()) / f"lynxtop-bench-{meta['bench_id']}.json",
                                          data)
        except OSError:
            return None, f"{why}; the levels are only in the table below"
        return path, f"{why}; the levels went to {path} instead"
    if path != Path(wanted):
        return path, f"--json {wanted} appeared during the sweep and is kept; the levels went to {path}"
    return path, ""


def _report(result: SweepResult, meta: dict[str, Any], store: Store, args: Namespace,
            saver: bench_result.Saver | None = None) -> int:
    json_path, json_problem = _write_json(result, meta, args.json) if args.json else (None, "")
    if json_problem:
        _err(json_problem)
    if result.levels:
        print(bench_view.table(result.levels))
        for line in bench_traffic.warnings(result.levels):  # under the table: its numbers are not bench's alone
            print(line)
        print()
        print(bench_view.chart(result.levels))
    where = f"stored as sweep {meta['bench_id']} ({store.stored} levels)" if store.stored else \
        f"NOT stored: {terminal_safe(store.problem)}"  # the agent's refusal or an unreachable error: foreign text
    print(f"\n{where}" + (f"; JSON in {terminal_safe(json_path)}" if json_path else ""), file=sys.stderr)
    if saver is not None:
        print(terminal_safe(f"{len(saver.paths)} vllm --save-result file(s) in {saver.directory}: "  # file names
                            + ", ".join(p.name for p in saver.paths), lines=True), file=sys.stderr)
    if saver is not None and saver.problem:
        _err(saver.problem)
        return EXIT_FAILED
    if result.server_gone:
        _err(f"the server stopped answering: {result.server_gone}; finished levels are kept")
        return EXIT_FAILED
    if result.interrupted:
        _err("stopped by Ctrl-C; finished levels are kept, the last one is marked partial (*)")
        return EXIT_INTERRUPTED
    if args.json and json_path != Path(args.json):
        return EXIT_FAILED  # not where it was asked: a script reading that file must not take it as the result
    return EXIT_FAILED if any(s["failed"] or s.get("partial") for s in result.levels) else EXIT_OK


# ---------------------------------------------------------------------------------------------- reading back

def _reader(args: Namespace) -> Any:
    from lynxtop.cli.store_cli import _open

    return _open("bench", args)


def sweep_levels(reader: Any, ref: str) -> tuple[str, list[dict[str, Any]]]:
    """A stored sweep by its id, or by a run number (`run:12` or `12`: that run's newest sweep)."""
    rows = reader.bench_results(limit=10_000, bench_id=ref)
    if not rows and ref.removeprefix("run:").isdigit():
        run_id = int(ref.removeprefix("run:"))
        mine = [r for r in reader.bench_results(limit=10_000) if r.get("run_id") == run_id and r.get("bench_id")]
        if mine:
            ref = mine[0]["bench_id"]
            rows = [r for r in mine if r["bench_id"] == ref]
    if not rows:
        raise BenchError(f"no stored sweep {ref!r} (see `lynxtop bench list`)", EXIT_USAGE)
    first = rows[-1]
    name = f"{ref} (run {first.get('run_id')}, {first.get('profile')}, vLLM {first.get('vllm_version')})"
    return name, [from_db_row(r) for r in reversed(rows)]


def compare(args: Namespace) -> int:
    reader = _reader(args)
    if isinstance(reader, int):
        return reader
    try:
        with contextlib.closing(reader):
            name_a, a = sweep_levels(reader, args.run_a)
            name_b, b = sweep_levels(reader, args.run_b)
    except BenchError as exc:
        _err(str(exc))
        return exc.code
    if args.json:
        # stored levels: a NaN read back from the database is null here, never the token `NaN` jq refuses
        print(strict_dumps({"a": {"name": name_a, "levels": a}, "b": {"name": name_b, "levels": b}}, indent=2))
    else:
        print(bench_view.compare(name_a, a, name_b, b))
    return EXIT_OK


def list_sweeps(args: Namespace) -> int:
    reader = _reader(args)
    if isinstance(reader, int):
        return reader
    with contextlib.closing(reader):
        rows = [r for r in reader.bench_results(limit=10_000) if r.get("bench_id")]
    seen: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        seen.setdefault(r["bench_id"], []).append(r)
    sweeps = []
    for bid, levels in list(seen.items())[: args.limit]:
        top = max((finite(lv.get("output_tokens_per_s")) or 0 for lv in levels), default=0)
        first = levels[-1]
        sweeps.append({"bench_id": bid, "run_id": first.get("run_id"), "profile": first.get("profile"),
                       "vllm_version": first.get("vllm_version"), "levels": len(levels),
                       "max_output_tokens_per_s": top, "partial": any(bool(lv.get("partial")) for lv in levels)})
    if getattr(args, "json", False):
        print(strict_dumps(sweeps, indent=2))
        return EXIT_OK
    for sw in sweeps:
        bid, first, top = sw["bench_id"], sw, sw["max_output_tokens_per_s"]
        partial = " (partial)" if sw["partial"] else ""
        print(terminal_safe(f"{bid}  run {first.get('run_id') or '-'}  {first.get('profile') or '-'}  "  # stored
                            f"vLLM {first.get('vllm_version') or '-'}  {sw['levels']} levels  max {top:.1f} out tok/s"
                            f"{partial}"))
    return EXIT_OK
