"""`vllm bench serve --save-result` files from `lynxtop bench` (docs/bench.md): one file per level, with vLLM's
key names, types and file name, so vLLM's own comparison and plotting scripts load them.

Shapes follow vllm/benchmarks/serve.py (0.32): the run's set-up keys (`date`, `backend`, `label`, `model_id`,
`request_rate`, `burstiness`, `max_concurrency`...), the metrics, the per-request arrays that `--save-detailed`
keeps (`input_lens`, `output_lens`, `ttfts`, `itls`, `errors`...), and the speculative-decoding keys when the
server drafts tokens (DeepSeek's MTP). Where vLLM writes 0.0 for a statistic of no samples, so does this file
(lynxtop's own table and history keep "none"). lynxtop's extra keys (`bench_id`, `partial`, `failures`...) carry
names vLLM does not use.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lynxtop.cli.bench_load import COUNT_LIMIT, LevelRun, metrics_page
from lynxtop.cli.bench_stats import METRICS, percentile
from lynxtop.cli.bench_sweep import LevelHook

PERCENTILES = (50, 90, 99)  # vLLM writes the ones asked with --metric-percentiles (default 99): a superset
LYNXTOP_KEYS = ("bench_id", "name", "input_len", "output_len", "partial", "failures")


@dataclass
class SpecCounters:
    """vLLM's speculative-decoding counters on /metrics, summed over engines (what its client reads)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: dict[int, int] = field(default_factory=dict)


def spec_counters(page: str) -> SpecCounters | None:
    """The counters of a /metrics page; None when the server does no speculative decoding."""
    out, found = SpecCounters(), False
    for line in page.splitlines():
        if not line.startswith("vllm:spec_decode"):
            continue
        if "{" in line:  # label values may hold spaces: the value follows the closing brace
            name, rest = line[: line.index("{")], line[line.rfind("}") + 1:]
        else:
            name, _, rest = line.partition(" ")
        if not name.endswith("_total") or not rest.split():
            continue  # the _created gauges
        try:
            number = float(rest.split()[0])  # a timestamp may follow the value
        except ValueError:
            continue
        if not math.isfinite(number) or not 0 <= number < COUNT_LIMIT:
            continue  # no count (vLLM's client skips a NaN too); a 1e300 would become a 300-digit int
        value = int(number)
        found = True
        if name == "vllm:spec_decode_num_drafts_total":
            out.drafts += value
        elif name == "vllm:spec_decode_num_draft_tokens_total":
            out.draft_tokens += value
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            pos = _label(line, "position")
            if pos is not None and pos.isascii() and pos.isdigit() and len(pos) <= 6:  # int("²") raises
                out.per_pos[int(pos)] = out.per_pos.get(int(pos), 0) + value
        elif name == "vllm:spec_decode_num_accepted_tokens_total":
            out.accepted += value
    if max(out.drafts, out.draft_tokens, out.accepted, *out.per_pos.values()) >= COUNT_LIMIT:
        return None  # summed past a count: absent, not a guess
    return out if found else None


def _label(line: str, key: str) -> str | None:
    start = line.find(f'{key}="')
    if start < 0:
        return None
    start += len(key) + 2
    end = line.find('"', start)
    return line[start:end] if end > start else None


def spec_keys(before: SpecCounters | None, after: SpecCounters | None) -> dict[str, Any]:
    """vLLM's `spec_decode_*` keys over a level (the counters' difference); {} when nothing was drafted."""
    if before is None or after is None:
        return {}
    drafts, tokens = after.drafts - before.drafts, after.draft_tokens - before.draft_tokens
    accepted = after.accepted - before.accepted
    if tokens <= 0:  # vLLM's client writes the keys only when tokens were drafted in its window
        return {}
    per_pos = [(after.per_pos.get(p, before.per_pos.get(p, 0)) - before.per_pos.get(p, 0)) / drafts
               for p in sorted(set(before.per_pos) | set(after.per_pos))] if drafts > 0 else []
    return {"spec_decode_acceptance_rate": accepted / tokens * 100,
            "spec_decode_acceptance_length": 1 + accepted / drafts if drafts > 0 else 0.0,
            "spec_decode_num_drafts": drafts, "spec_decode_draft_tokens": tokens,
            "spec_decode_accepted_tokens": accepted, "spec_decode_per_position_acceptance_rates": per_pos}


# ---------------------------------------------------------------------------------------------- the file

def _stats(name: str, xs: Sequence[float]) -> dict[str, float]:
    """mean, median, std and the percentiles in ms; 0.0 for no samples, as numpy gives vLLM (`np.mean(xs or 0)`)."""
    ms = [x * 1000 for x in xs] or [0.0]
    out = {f"mean_{name}_ms": statistics.fmean(ms), f"median_{name}_ms": percentile(ms, 50) or 0.0,
           f"std_{name}_ms": statistics.pstdev(ms)}
    return out | {f"p{p}_{name}_ms": percentile(ms, p) or 0.0 for p in PERCENTILES}


def head(meta: dict[str, Any], summary: dict[str, Any], date: str) -> dict[str, Any]:
    """The set-up keys vLLM writes before the metrics, in its order."""
    rate = summary.get("request_rate", "inf")
    return {"date": date, "endpoint_type": "openai", "backend": "openai", "label": meta.get("label"),
            "model_id": meta.get("model_id") or meta.get("model"),
            "tokenizer_id": meta.get("model_id") or meta.get("model"),
            "num_prompts": summary["completed"] + summary["failed"],
            "request_rate": float(rate) if isinstance(rate, int | float) else "inf", "burstiness": 1.0,
            "max_concurrency": summary.get("max_concurrency")}


def level_json(summary: dict[str, Any], meta: dict[str, Any], date: str) -> dict[str, Any]:
    """A level without its per-request arrays: vLLM's set-up and metric keys (0.0, not null, for no samples),
    then lynxtop's own. `--json` writes these as an array."""
    out = head(meta, summary, date) | {k: v for k, v in summary.items() if k not in ("partial", "failures")}
    out["rtfx"] = 0.0  # audio models only
    for key in [k for k in out if k.endswith("_ms")]:
        if out[key] is None:
            out[key] = 0.0
    return out | {k: meta.get(k) for k in LYNXTOP_KEYS[:4]} | {"partial": bool(summary.get("partial")),
                                                                 "failures": summary.get("failures") or {}}


def save_result(run: LevelRun, summary: dict[str, Any], meta: dict[str, Any], date: str,
                spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole `--save-result --save-detailed` object of one level."""
    rs = sorted(run.results, key=lambda r: r.start)  # vLLM lists requests in the order they were sent
    ok = [r for r in rs if r.ok]
    base = level_json(summary, meta, date)
    out = {k: base[k] for k in head(meta, summary, date)}
    out |= {k: summary[k] for k in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                                    "request_throughput", "request_goodput", "output_throughput",
                                    "total_token_throughput")}
    out |= {"input_lens": [r.prompt_tokens for r in rs], "output_lens": [r.output_tokens if r.ok else 0 for r in rs],
            "ttfts": [r.ttft for r in rs], "itls": [list(r.itl) for r in rs],
            "latencies": [r.e2e if r.ok else 0.0 for r in rs], "start_times": [r.start for r in rs],
            "queue_times": [r.queued for r in rs], "generated_texts": [r.text for r in rs],
            "errors": [r.error for r in rs], "max_output_tokens_per_s": float(summary["max_output_tokens_per_s"]),
            "max_concurrent_requests": int(summary["max_concurrent_requests"]), "rtfx": 0.0}
    out |= spec or {}
    tpots = [t for r in ok if (t := r.tpot) is not None]
    for name, xs in zip(METRICS, ([r.ttft for r in ok], tpots, [g for r in ok for g in r.itl], [r.e2e for r in ok]),
                        strict=True):
        out |= _stats(name, xs)
    if summary.get("max_concurrency") is not None:  # vLLM's client-side queue, asked with --percentile-metrics
        out |= _stats("client_queue_time", [r.queued for r in ok])
        if out["request_rate"] != "inf":
            out |= _stats("e2el_including_client_queue", [r.e2e + r.queued for r in ok])
    return out | {k: base[k] for k in LYNXTOP_KEYS}


def file_name(meta: dict[str, Any], summary: dict[str, Any], date: str) -> str:
    """vLLM's name: `{label}-{request_rate}qps[-concurrency{C}]-{model's last path part}-{date}.json`."""
    rate = summary.get("request_rate", "inf")
    qps = str(float(rate)) if isinstance(rate, int | float) else "inf"
    conc = summary.get("max_concurrency")
    model = str(meta.get("model_id") or meta.get("model") or "model").split("/")[-1]
    name = f"{meta.get('label') or 'openai'}-{qps}qps{f'-concurrency{conc}' if conc is not None else ''}-{model}-{date}"
    return "".join(c if c.isalnum() or c in "-_.+" else "_" for c in name) + ".json"


def now() -> str:
    """vLLM's `date`: local time to the second."""
    return time.strftime("%Y%m%d-%H%M%S")


def write(directory: Path, obj: dict[str, Any], name: str) -> Path:
    """Write one level's file (never over an earlier one: a second level of the same name in the same second
    gets a counter before `.json`, `-2`, `-3`...)."""
    directory.mkdir(parents=True, exist_ok=True)
    return write_new(directory / name, (json.dumps(obj) + "\n").encode())


def write_new(path: Path, data: bytes, numbered: bool = True) -> Path:
    """`data` as a new file at `path`, or (`numbered`) at `{stem}-2{suffix}`, `-3`... when the name is taken;
    returns where. Written whole into a temporary file of the same directory, fsynced, then linked to its name:
    link() never replaces a name (checking first, then writing, lost one level of two racing writers), and
    no reader ever sees half a file. FileExistsError when `path` is taken and not `numbered`."""
    tmp = _temporary(path, data)
    try:
        for n in range(1, 10_000):
            target = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
            try:
                _place(tmp, target, data)
            except FileExistsError:
                if not numbered:
                    raise
                continue
            _sync_dir(path.parent)
            return target
        raise FileExistsError(errno.EEXIST, "9999 files of this name already", str(path))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _temporary(path: Path, data: bytes) -> Path:
    """A hidden temporary file beside `path` holding `data`, on disk (created 0666 under the umask, as a plain
    create would be; mkstemp's 0600 would hide results from the operators' group)."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return tmp
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path))


def _place(tmp: Path, target: Path, data: bytes) -> None:
    """Give the written file its name, never replacing one (FileExistsError when taken)."""
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise
    except OSError as exc:  # a file system without hard links: an exclusive create, written in place
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        with open(target, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def _sync_dir(d: Path) -> None:
    """The new name on disk too (a crash after the write must not lose the file's entry)."""
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------------------------- the hook

class Saver(LevelHook):
    """Writes each level's file as soon as the level ends (so Ctrl-C keeps the finished ones), with the
    speculative-decoding counters read from /metrics just before and just after the level, as vLLM's client
    reads them around its run. A file that cannot be written is reported once; the sweep goes on."""

    def __init__(self, url: str, directory: Path, meta: dict[str, Any]):
        self.url, self.directory, self.meta = url, directory, meta
        self.paths: list[Path] = []
        self.problem = ""
        self._before: SpecCounters | None = None

    async def _counters(self) -> SpecCounters | None:
        page = await metrics_page(self.url)  # no page (or one over its cap): no speculative keys, as in vLLM's
        return spec_counters(page) if page is not None else None

    async def before(self) -> None:
        self._before = await self._counters()

    async def after(self, run: LevelRun, summary: dict[str, Any]) -> None:
        spec = spec_keys(self._before, await self._counters())
        date = now()
        if self.problem:
            return
        try:
            self.paths.append(write(self.directory, save_result(run, summary, self.meta, date, spec),
                                    file_name(self.meta, summary, date)))
        except OSError as exc:
            self.problem = f"cannot write a result file in {self.directory}: {exc.strerror or exc}"
            print(f"lynxtop bench: {self.problem}", file=sys.stderr)
