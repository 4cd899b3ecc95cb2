"""The tail of a run's log, read in bounded blocks: `GET /v1/logs` streams it rather than building it whole.

Why: the answer used to be built in memory (the lines, the JSON text, its bytes, and the transport's copy of
them: about 20 MB for a 4 MB tail) and held until the client read it; 50 clients that opened the stream and
never read took the agent from 54 MB to 1.9 GB. Here each connection holds one block and one line at a time,
and the API writes each block only once the client has taken the previous ones.

The lines are those of `startup.tail_lines`: the last `n` non-blank lines within the last `max_bytes`, the
first (cut) line dropped when the file is longer, decoded as UTF-8 with replacement, '\\r' stripped. A line
longer than LINE_CAP is cut there and says how much was left out.

A client that follows the log (the dashboard's Logs view) passes back the `next` offset and `inode` of its
previous answer (`follow()`): it gets only the lines written since, or the new file from its start when the
path now names another file (rotated: renamed and a new one created) or a shorter one (truncated). A last line
not yet ended by a newline is served with `partial` and read again from its start next time, so it is never
shown cut in two.

The log's directory may be writable by others (a configured log_dir, the service user vLLM runs as): the file
is only read when it is a regular file with one name, opened without following a symlink (safefile). Anything
else (a link planted there to a 0600 file was once served as the run's log lines) gives no lines and `error`
says why.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from lynxtop.agent.serving import safefile

BLOCK = 64 * 1024  # read and written at a time
LINE_CAP = 64 * 1024  # a longer line is cut: one connection never holds more than this of one line


def _lines(f: object, start: int, end: int, skip_first: bool) -> Iterator[tuple[int, bytes, int]]:
    """(offset, line, bytes cut) of every line in [start, end) of an open binary file, in order."""
    pos = start
    line_at, carry, cut = start, bytearray(), 0
    skipping = skip_first
    f.seek(start)  # type: ignore[attr-defined]
    while pos < end:
        block = f.read(min(BLOCK, end - pos))  # type: ignore[attr-defined]
        if not block:
            break
        i = 0
        while i < len(block):
            nl = block.find(b"\n", i)
            stop = len(block) if nl < 0 else nl
            if not skipping:
                room = LINE_CAP - len(carry)
                piece = block[i:stop]
                carry += piece[:room]
                cut += max(0, len(piece) - room)
            if nl < 0:
                break
            if skipping:
                skipping = False
            else:
                yield line_at, bytes(carry), cut
            carry, cut = bytearray(), 0
            i = nl + 1
            line_at = pos + i
        pos += len(block)
    if carry and not skipping:
        yield line_at, bytes(carry), cut


def _open(path: str) -> BinaryIO:
    """The log for reading: a regular file with one name, never through a symlink (safefile.StateFileError)."""
    return safefile.open_log_read(path, refused="no lines are served from it")


def _text(line: bytes, cut: int) -> str | None:
    """The line as served, or None for a blank one (not counted, not served)."""
    text = line.decode("utf-8", "replace")
    if not text.strip():
        return None
    text = text.rstrip("\r")
    return f"{text} [... {cut} more bytes of this line not shown]" if cut else text


@dataclass
class LogTail:
    """The last `lines` non-blank lines of `path` within its last `max_bytes`, found by `locate()` and then
    read by `blocks()` as JSON-encoded pieces of the answer's array (both in a thread: the disk may be slow)."""

    path: str | None
    lines: int
    max_bytes: int
    start: int = 0
    end: int = 0
    skip_first: bool = False
    inode: int | None = None  # of the file read: a follower passes it back to notice a rotation
    next: int = 0  # where a follower's next read starts (the partial last line's start, else the end)
    partial: bool = False  # the last line served has no newline yet: it comes again, longer, next time
    reset: str | None = None  # "rotated" or "truncated": a follower's file was replaced, read from its start
    skipped: int = 0  # bytes since the follower's offset left out by the limits (more than `lines`/`max_bytes`)
    error: str | None = None  # why the log is not read: something other than a regular file stands at its path

    def follow_info(self) -> dict[str, int | bool | str | None]:
        """What a follower passes back (`next`, `inode`) and what happened to its file, for the answer."""
        return {"inode": self.inode, "next": self.next, "partial": self.partial, "reset": self.reset,
                "skipped": self.skipped, "error": self.error}

    def locate(self) -> None:
        """Find where the tail starts, keeping offsets only (one int per wanted line)."""
        self._find(None, None)

    def follow(self, after: int, inode: int | None) -> None:
        """Find the lines written after byte `after` of file `inode` (a previous answer's `next` and `inode`)."""
        self._find(after, inode)

    def _find(self, after: int | None, inode: int | None) -> None:
        self.start = self.end = self.next = self.skipped = 0
        self.partial, self.reset, self.inode, self.error = False, None, None, None
        if self.path is None or self.lines <= 0:
            return
        try:
            with _open(self.path) as f:
                st = os.fstat(f.fileno())
                self.inode = st.st_ino
                end = f.seek(0, os.SEEK_END)
                if after is not None and inode is not None and inode != st.st_ino:
                    self.reset, after = "rotated", 0
                elif after is not None and after > end:
                    self.reset, after = "truncated", 0
                since = after or 0
                first = max(since, end - self.max_bytes)
                starts: deque[int] = deque(maxlen=self.lines)
                served = 0
                last_at = None  # start of the last piece, blank or not
                for at, line, cut in _lines(f, first, end, skip_first=first > since):
                    last_at = at
                    if _text(line, cut) is not None:
                        starts.append(at)
                        served += 1
                unterminated = end > first and f.seek(end - 1) >= 0 and f.read(1) != b"\n"
        except safefile.StateFileError as exc:
            self.error = f"the run's log cannot be read: {exc}"
            return
        except OSError:
            return
        self.next = last_at if unterminated and last_at is not None else end
        self.partial = bool(unterminated and starts and starts[-1] == last_at)
        if starts:
            self.start, self.end = starts[0], end
            if after is not None and (first > since or served > len(starts)):
                self.skipped = starts[0] - since

    def reader(self) -> Iterator[str]:
        """JSON pieces of the array's items (", "-joined, each at most about one BLOCK); call from a thread,
        one `next()` at a time. An unreadable file, or one that is no longer the file located, ends the array
        early."""
        if self.end <= self.start or self.path is None:
            return
        try:
            with _open(self.path) as f:
                if os.fstat(f.fileno()).st_ino != self.inode:  # replaced since `locate`: its offsets are not ours
                    return
                piece: list[str] = []
                size = 0
                first = True
                for _at, line, cut in _lines(f, self.start, self.end, skip_first=False):
                    text = _text(line, cut)
                    if text is None:
                        continue
                    item = json.dumps(text)
                    piece.append(item if first else ", " + item)
                    first = False
                    size += len(item)
                    if size >= BLOCK:
                        yield "".join(piece)
                        piece, size = [], 0
                if piece:
                    yield "".join(piece)
        except OSError:
            return
