"""Start-up phases of `vllm serve`, read from its log: a 20-minute load should say where it is.

vLLM has no progress endpoint while it loads (the port is closed until the engine is up), so the log lines
it always prints are the only signal. The tracker tails the per-run log file from where it last stopped,
matches the milestones loosely (wording drifts between versions) and only moves forward: several workers
print the same lines, and a phase never goes back within one run.

The log's directory may be writable by others: every read here goes through safefile (a regular file with one
name, never through a symlink), so a link planted at a log's path never feeds its target into the phases or
into an event's log tail.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lynxtop.agent.serving import safefile

PHASES = ("loading weights", "kv cache", "cuda graphs", "api up")

# (pattern, phase entered when the line appears). A line that ends a stage starts the next one.
_MILESTONES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), phase)
    for p, phase in (
        (r"Starting to load model|Loading model weights|Loading safetensors checkpoint", "loading weights"),
        (r"Loading weights took|Model loading took|Memory profiling takes", "kv cache"),
        (r"Available KV cache memory|GPU KV cache size|Maximum concurrency for", "kv cache"),
        (r"Capturing CUDA graph|Capturing cudagraphs|Graph capturing", "cuda graphs"),
        (r"Graph capturing finished|init engine \(profile, create kv cache", "cuda graphs"),
        (r"Starting vLLM (?:API )?server|Application startup complete|Available routes are", "api up"),
    )
)
# The literal start of each milestone's alternatives, lower case: a block of log with none of them (nearly all of a
# serving log) is skipped with a few substring searches instead of six regular expressions per line.
_KEYS = tuple({re.split(r"[\\()\[?*+.]", alt)[0].lower() for p, _ in _MILESTONES for alt in p.pattern.split("|")})
# Lines that finish a stage move to the next one when the next stage prints nothing of its own
# (e.g. --enforce-eager skips graph capture and goes straight to the API server).
_ADVANCE = {"Available KV cache memory": "cuda graphs", "GPU KV cache size": "cuda graphs"}

# vLLM's bar while it reads the weights (tqdm, often with `\r` and no newline between updates):
# `Loading safetensors checkpoint shards:  45% Completed | 27/60 [04:12<05:08, 9.3s/it]`
_PROGRESS_KEY = "checkpoint shards:"
_PROGRESS = re.compile(r"checkpoint shards:\s*(\d{1,3}(?:\.\d+)?)%[^|\r\n]{0,40}\|\s*(\d{1,9})/(\d{1,9})",
                       re.IGNORECASE)
# the prefix of vLLM's log lines: `INFO 12-02 15:40:01 [file.py:12] ...`, local time of the server, no year
_STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")
_STAMP_SLACK_MS = 2000  # a stamp this far before the run's start or after now is not this run's: now is used

_READ_CHUNK = 1 << 20
TAIL_BYTES = 4 << 20  # how much of an adopted loading run's log is read back


@dataclass
class PhaseMark:
    phase: str
    ts_ms: int


class PhaseTracker:
    """Feeds on the log file of one run; `poll()` returns phases entered since the last poll."""

    def __init__(self, log_path: Path | str, started_ms: int, offset: int = 0):
        self.path = Path(log_path)
        self.offset = offset
        self._partial = b""
        self.started_ms = started_ms
        self.marks: list[PhaseMark] = [PhaseMark("loading weights", started_ms)]
        self.progress: tuple[int, int, float] | None = None  # (shards done, total, percent) of the last bar read
        self.grew_ms = started_ms  # when (the caller's clock) the log was last seen growing

    @property
    def phase(self) -> str:
        return self.marks[-1].phase

    @property
    def phase_since_ms(self) -> int:
        return self.marks[-1].ts_ms

    def start_at_end(self) -> None:
        """Read only what is written from now on: an adopted run that was ready has no start-up phase left, and
        its log may be gigabytes of serving (reading it all once took minutes before systemd's READY=1)."""
        try:
            self.offset = os.lstat(self.path).st_size  # never the size of a link's target
        except OSError:
            self.offset = 0
        self._partial = b""

    def start_at_tail(self, max_bytes: int = TAIL_BYTES) -> None:
        """Read from the first whole line of the log's last `max_bytes`: an adopted run still loading has its
        current phase there, and its log is not read whole (a long or noisy load writes a lot)."""
        self._partial = b""
        try:
            with safefile.open_log_read(self.path) as f:
                size = f.seek(0, os.SEEK_END)
                if size <= max_bytes:
                    self.offset = 0
                    return
                f.seek(size - max_bytes - 1)
                f.readline(max_bytes)  # the end of the cut line (only its newline when the tail starts a line)
                self.offset = f.tell()
        except OSError:
            self.offset = 0

    def poll(self, now_ms: int, log_times: bool = False) -> list[PhaseMark]:
        """The phases entered since the last poll, each stamped `now_ms`; with `log_times` (an adopted run catching
        up on a log written while no agent watched) stamped with the time of its line's vLLM prefix instead, where
        that reads as a time of this run, so the phases keep their real durations."""
        new: list[PhaseMark] = []
        offset = self.offset
        for block in self._new_blocks():
            for line in _candidate_lines(block):
                mark = self._match(line, line_ms(line, now_ms, self.started_ms) if log_times else now_ms)
                if mark is not None:
                    new.append(mark)
            self._read_progress(block)
        self._read_progress(self._partial.decode("utf-8", "replace"))  # a bar redrawn with `\r` only, no newline
        if self.offset != offset:
            self.grew_ms = now_ms
        return new

    def catch_up(self, now_ms: int) -> list[PhaseMark]:
        """Read an adopted run's log to its end: phases stamped from their lines (`poll(log_times=True)`), and its
        growth dated by the file's modification time, so a load that went silent before this agent came is not
        taken for one that just wrote."""
        marks = self.poll(now_ms, log_times=True)
        try:
            age_ms = int((time.time() - os.lstat(self.path).st_mtime) * 1000)
        except OSError:
            return marks
        if age_ms >= 0:
            self.grew_ms = max(self.started_ms, now_ms - age_ms)
        return marks

    def _read_progress(self, text: str) -> None:
        """The last checkpoint shards' bar in `text`, if any (found from the end: a load draws hundreds)."""
        low = text.lower()
        i = low.rfind(_PROGRESS_KEY)
        while i != -1:
            m = _PROGRESS.match(low, i)  # digits only are read: the lower-cased text has them where they were
            if m is not None:
                done, total = int(m.group(2)), int(m.group(3))
                if total > 0 and done <= total:
                    self.progress = (done, total, min(float(m.group(1)), 100.0))
                    return
            i = low.rfind(_PROGRESS_KEY, 0, i)

    def _match(self, line: str, now_ms: int) -> PhaseMark | None:
        for pattern, phase in _MILESTONES:
            if pattern.search(line):
                target = phase
                for key, nxt in _ADVANCE.items():
                    if key.lower() in line.lower():
                        target = nxt
                if PHASES.index(target) > PHASES.index(self.phase):
                    mark = PhaseMark(target, max(now_ms, self.marks[-1].ts_ms))  # never before the phase it ends
                    self.marks.append(mark)
                    return mark
                return None
        return None

    def _new_blocks(self) -> Iterator[str]:
        """The complete lines written since the last read, one block of them per chunk read: a log is never held
        whole in memory."""
        try:
            with safefile.open_log_read(self.path) as f:
                if os.fstat(f.fileno()).st_size < self.offset:  # truncated or replaced: start over
                    self.offset, self._partial = 0, b""
                f.seek(self.offset)
                while chunk := f.read(_READ_CHUNK):
                    self.offset += len(chunk)
                    complete, sep, self._partial = (self._partial + chunk).rpartition(b"\n")
                    if sep:
                        yield complete.decode("utf-8", "replace")
        except OSError:
            return


def line_ms(line: str, now_ms: int, started_ms: int | None) -> int:
    """When `line` was written, on the caller's clock (`now_ms`, read now): from its vLLM prefix `INFO 12-02
    15:40:01` (local time of this host, no year: the latest such time not after now), the middle of its second.
    `now_ms` when the line has no prefix or its time cannot be this run's (before its start, in the future: another
    time zone, a clock stepped, a log copied from elsewhere)."""
    m = _STAMP.search(line)
    if m is None:
        return now_ms
    month, day, hour, minute, sec = (int(g) for g in m.groups())
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and sec < 62):
        return now_ms  # no time (mktime would roll 13-45 99:99:99 into some other day)
    wall = time.time()
    year = time.localtime(wall).tm_year
    try:
        t = time.mktime((year, month, day, hour, minute, sec, 0, 0, -1))
        if t > wall + 86400:  # December's line read in January
            t = time.mktime((year - 1, month, day, hour, minute, sec, 0, 0, -1))
    except (OverflowError, ValueError):
        return now_ms
    at = now_ms - int((wall - t) * 1000) + 500
    if at > now_ms + _STAMP_SLACK_MS or (started_ms is not None and at < started_ms - _STAMP_SLACK_MS):
        return now_ms
    return min(at, now_ms)


def _candidate_lines(block: str) -> Iterator[str]:
    """The lines of `block` that hold a milestone's literal start, in order: found by substring search (fast), as
    most of a serving log (access and stats lines) holds none."""
    low = block.lower()
    if len(low) != len(block):  # a case mapping changed the length: positions differ, try every line
        yield from block.split("\n")
        return
    starts: set[int] = set()
    for key in _KEYS:
        i = low.find(key)
        while i != -1:
            starts.add(block.rfind("\n", 0, i) + 1)
            i = low.find(key, i + 1)
    for start in sorted(starts):
        end = block.find("\n", start)
        yield block[start:] if end == -1 else block[start:end]


def tail_lines(path: Path | str | None, n: int = 20, max_bytes: int = 256 * 1024) -> list[str]:
    """The last `n` lines of a log, reading at most `max_bytes` from its end (logs can be gigabytes)."""
    if path is None or n <= 0:
        return []
    try:
        with safefile.open_log_read(path) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines: deque[str] = deque(maxlen=n)
    text = data.decode("utf-8", "replace")
    parts = text.split("\n")
    if size > max_bytes:
        parts = parts[1:]  # the first one is probably cut
    for line in parts:
        if line.strip():
            lines.append(line.rstrip("\r"))
    return list(lines)
