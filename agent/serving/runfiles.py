"""Files a vLLM run leaves outside its log: `/dev/shm/psm_*` segments and the `vllm_dist_*` rendezvous file.

vLLM removes both itself on a clean SIGTERM. After a SIGKILL (of the API server, or of stragglers at the end
of the grace period) nobody does: the segments hold RAM (tmpfs) until the node reboots, and they pile up
with every crash. The agent therefore records, *before* it signals anything, exactly which files belong to
the run: the segments from /proc/<pid>/maps of every process of the run, and the rendezvous file from the
run's own log line `distributed_init_method=file:///tmp/vllm_dist_<hex>`. Once every process of the run is
gone it unlinks those that still exist. It never globs /dev/shm or /tmp: another run's (or another
service's) files look the same. A file is removed only if it is still a regular file owned by the run's uid.
The run's own TMPDIR (agent/serving/runtmp.py) goes last, with whatever vLLM left in it.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field

from lynxtop.agent.serving import procs, runtmp

# vLLM: distributed_init_method = f"file://{tempfile.mktemp(prefix='vllm_dist_')}" style names, <32 hex> here;
# TMPDIR may move it out of /tmp, so any absolute directory is accepted, but only this basename.
_DIST_RE = re.compile(rb"distributed_init_method=file://(/[^\s'\",]*/vllm_dist_[0-9A-Za-z_]+)")
LOG_SCAN_BYTES = 16 << 20  # the line is written during start-up; never read a multi-GB log to find it


def dist_files_in_log(log_path: str | os.PathLike[str], limit: int = LOG_SCAN_BYTES) -> set[str]:
    """The `vllm_dist_*` rendezvous files named in the first `limit` bytes of a run log."""
    try:
        with open(log_path, "rb") as f:
            head = f.read(limit)
    except OSError:
        return set()
    return dist_files_in(head)


def dist_files_in(head: bytes) -> set[str]:
    """The `vllm_dist_*` rendezvous files named in `head` (the start of a run log)."""
    found = set()
    for m in _DIST_RE.finditer(head):
        path = m.group(1).decode("utf-8", "surrogateescape")
        if os.path.normpath(path) == path:  # no "..", no "//": the log names the file, not a path trick
            found.add(path)
    return found


def dist_note(paths: set[str]) -> bytes:
    """The line logcap writes at the start of a log it truncated, naming the rendezvous files the dropped start-up
    lines named (`dist_files_in` finds them there): the file is still removed when the run ends."""
    named = " ".join(f"distributed_init_method=file://{p}" for p in sorted(paths))
    return f"[lynxtop] kept from the start of this log when it was capped: {named}\n".encode(
        "utf-8", "surrogateescape")


@dataclass
class RunFiles:
    """What a run made, with the uid of the run process it was found in (the only owner we will unlink)."""

    paths: dict[str, int] = field(default_factory=dict)
    tmp_dir: str | None = None  # the run's TMPDIR the agent made (kept in the state file); None: none
    _looked_at: set[int] = field(default_factory=set)

    def add_segments_of(self, pid: int, again: bool = False) -> None:
        """Record `pid`'s mapped segments (once per pid unless `again`: maps of a big Worker are long)."""
        if pid in self._looked_at and not again:
            return
        self._looked_at.add(pid)
        owner = procs.uid(pid)
        if owner is None:
            return
        for path in procs.shm_segments(pid):
            self.paths.setdefault(path, owner)

    def add_recorded(self, path: str, owner: int) -> None:
        """A segment path kept in the state file (checked again: the file is not to be trusted blindly)."""
        if procs.SHM_SEGMENT.fullmatch(path):
            self.paths.setdefault(path, owner)

    def segments(self) -> list[str]:
        return sorted(p for p in self.paths if procs.SHM_SEGMENT.fullmatch(p))

    def add_from_log(self, log_path: str, owner: int) -> None:
        for path in dist_files_in_log(log_path):
            self.paths.setdefault(path, owner)

    def remove(self) -> tuple[list[str], list[str]]:
        """Unlink the recorded files that still exist and remove the run's TMPDIR: (removed, not removed with the
        reason)."""
        removed: list[str] = []
        refused: list[str] = []
        for path, owner in sorted(self.paths.items()):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # vLLM cleaned it up itself (a clean SIGTERM)
            except OSError as exc:
                refused.append(f"{path} ({exc.strerror})")
                continue
            if not stat.S_ISREG(st.st_mode):
                refused.append(f"{path} (not a regular file)")
            elif st.st_uid != owner:
                refused.append(f"{path} (owned by uid {st.st_uid}, the run ran as uid {owner})")
            else:
                try:
                    os.unlink(path)
                    removed.append(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    refused.append(f"{path} ({exc.strerror})")
        if self.tmp_dir and (why := runtmp.remove(self.tmp_dir)):
            refused.append(why)  # its removal is expected, like the state file's: only a refusal is news
        return removed, refused

    def every_path(self) -> list[str]:
        """What `remove` would look at: the files, then the run's TMPDIR."""
        return sorted(self.paths) + ([self.tmp_dir] if self.tmp_dir else [])
