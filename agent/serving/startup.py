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
        self.marks: list[PhaseMark] = [PhaseMark("loading weights", started_ms)]

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

    def poll(self, now_ms: int) -> list[PhaseMark]:
        new: list[PhaseMark] = []
        for block in self._new_blocks():
            for line in _candidate_lines(block):
                mark = self._match(line, now_ms)
                if mark is not None:
                    new.append(mark)
        return new

    def _match(self, line: str, now_ms: int) -> PhaseMark | None:
        for pattern, phase in _MILESTONES:
            if pattern.search(line):
                target = phase
                for key, nxt in _ADVANCE.items():
                    if key.lower() in line.lower():
                        target = nxt
                if PHASES.index(target) > PHASES.index(self.phase):
                    mark = PhaseMark(target, now_ms)
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
