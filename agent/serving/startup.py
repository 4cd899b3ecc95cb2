"""Start-up phases of `vllm serve`, read from its log: a 20-minute load should say where it is.

vLLM has no progress endpoint while it loads (the port is closed until the engine is up), so the log lines
it always prints are the only signal. The tracker tails the per-run log file from where it last stopped,
matches the milestones loosely (wording drifts between versions) and only moves forward: several workers
print the same lines, and a phase never goes back within one run.
"""

from __future__ import annotations

import os
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

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
# Lines that finish a stage move to the next one when the next stage prints nothing of its own
# (e.g. --enforce-eager skips graph capture and goes straight to the API server).
_ADVANCE = {"Available KV cache memory": "cuda graphs", "GPU KV cache size": "cuda graphs"}

_READ_CHUNK = 1 << 20


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

    def poll(self, now_ms: int) -> list[PhaseMark]:
        new: list[PhaseMark] = []
        for line in self._new_lines():
            for pattern, phase in _MILESTONES:
                if pattern.search(line):
                    target = phase
                    for key, nxt in _ADVANCE.items():
                        if key.lower() in line.lower():
                            target = nxt
                    if PHASES.index(target) > PHASES.index(self.phase):
                        mark = PhaseMark(target, now_ms)
                        self.marks.append(mark)
                        new.append(mark)
                    break
        return new

    def _new_lines(self) -> list[str]:
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return []
        if size < self.offset:  # truncated or replaced: start over
            self.offset, self._partial = 0, b""
        lines: list[str] = []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                while True:
                    chunk = f.read(_READ_CHUNK)
                    if not chunk:
                        break
                    self.offset += len(chunk)
                    data = self._partial + chunk
                    *complete, self._partial = data.split(b"\n")
                    lines.extend(c.decode("utf-8", "replace") for c in complete)
        except OSError:
            return []
        return lines


def tail_lines(path: Path | str | None, n: int = 20, max_bytes: int = 256 * 1024) -> list[str]:
    """The last `n` lines of a log, reading at most `max_bytes` from its end (logs can be gigabytes)."""
    if path is None or n <= 0:
        return []
    try:
        with open(path, "rb") as f:
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
