"""Which board (UUID) was behind each NVML index over time, kept in the `gpus` table.

The sample tables are keyed by NVML index, and NVML numbers the boards present in PCI order: a board replaced
(a new UUID at the same index), a node's boards moved, or one fallen off the bus (the ones after it shift down at
the next driver load) make an index's history continue with another board's readings. The `gpus` table is keyed
by UUID and held one `idx` per board, overwritten when the board moved: index 1's history before a shift then read
as the board now at index 1. Two columns, added in place (no migration, no floor moved: older code upserts the
other columns and leaves these as they were), keep the segments:

- `idx_since_ms`: since when the board is at its current `idx` (NULL in rows from before: `first_seen_ms`);
- `idx_history`: JSON `[[idx, since_ms, until_ms], ...]`, the indices it held before (until: when it moved).

A segment at an index ends where the next board's at that index starts, or where its board moved away. Times are
those of `upsert_gpus` (each NVML (re)initialisation that found the board), so a segment's start is the first
upsert that saw the board there: the readings at that index before it are the previous board's.

A board gone with no other board taking its index (the last of 8 pulled, or off the bus while the node was down:
NVML lists 7) has its row's `idx` set NULL and its segment closed in `idx_history` at its last sample there (`gone`):
it claims no index any more, so the next start does not find it missing again, and the board found there later
(the same one back, or another) is told against it (`vacated`), absent from that last sample on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from lynxtop.store.times import iso

IDENTITY_COLUMNS = ("idx_since_ms", "idx_history")


def _since(row: dict[str, Any]) -> int | None:
    since = row.get("idx_since_ms")
    return since if isinstance(since, int) else row.get("first_seen_ms")


def _history(row: dict[str, Any]) -> list[list[int]]:
    """The row's earlier indices; a value that is no such list (written by hand, damaged) is no history."""
    try:
        got = json.loads(row.get("idx_history") or "[]")
    except (TypeError, ValueError):
        return []
    if not isinstance(got, list):
        return []
    return [h for h in got if isinstance(h, list) and len(h) == 3 and all(isinstance(v, int) for v in h)]


def holders(rows: Iterable[dict[str, Any]]) -> dict[int, str]:
    """The board last recorded at each index (the newest segment start among the rows now at that index)."""
    best: dict[int, tuple[int, str]] = {}
    for r in rows:
        idx, since = r.get("idx"), _since(r) or 0
        if isinstance(idx, int) and (idx not in best or (since, r["uuid"]) > best[idx]):
            best[idx] = (since, r["uuid"])
    return {i: u for i, (_, u) in best.items()}


def vacated(rows: Iterable[dict[str, Any]]) -> dict[int, tuple[str, int]]:
    """The indices whose last board left with none after it ({idx: (uuid, until_ms)}): rows without an `idx` whose
    last segment was there (`gone`), at indices no row holds now."""
    held = holders(rows)
    best: dict[int, tuple[int, int, str]] = {}
    for r in rows:
        hist = _history(r) if r.get("idx") is None else []
        if not hist or hist[-1][0] in held:
            continue
        idx, since, until = hist[-1]
        if idx not in best or (until, since) > best[idx][:2]:
            best[idx] = (until, since, r["uuid"])
    return {i: (u, until) for i, (until, _, u) in best.items()}


def changes(rows: Sequence[dict[str, Any]], found: dict[int, str], enumerated: int | None = None,
            ) -> list[dict[str, Any]]:
    """What changed between the stored holders and the boards `found` now ({idx: uuid}): each index whose board
    is another one (old and new UUID), and each index whose board now answers elsewhere and that nothing with a
    UUID holds now (new None: not enumerated, or lost before NVML gave its UUID).

    An index at or past the `enumerated` count (NVML's; unknown: one past the highest found, as NVML numbers its
    boards 0..count-1) whose board answers nowhere is gone (`seen_until_ms`: None here, the caller fills it in). An
    index below it without a UUID is a board NVML lists but could not read (lost: gpu.lost tells it), not gone.
    A board found at a `vacated` index is told against the one that left (`absent_since_ms`; old == new: back)."""
    held = holders(rows)
    out = [{"gpu": i, "old_uuid": held[i], "new_uuid": u} for i, u in sorted(found.items())
           if held.get(i) not in (None, u)]
    now_at = set(found.values())
    out += [{"gpu": i, "old_uuid": u, "new_uuid": None} for i, u in sorted(held.items())
            if i not in found and u in now_at]
    count = enumerated if enumerated is not None else max(found, default=-1) + 1
    out += [{"gpu": i, "old_uuid": u, "new_uuid": None, "seen_until_ms": None} for i, u in sorted(held.items())
            if i not in found and u not in now_at and i >= count]
    left = vacated(rows)
    out += [{"gpu": i, "old_uuid": left[i][0], "new_uuid": u, "absent_since_ms": left[i][1]}
            for i, u in sorted(found.items()) if i not in held and i in left]
    return sorted(out, key=lambda c: c["gpu"])


def gone(rows: Iterable[dict[str, Any]], idx: int, now_ms: int, seen_until_ms: int | None = None,
         ) -> list[tuple[str | None, str]]:
    """(idx_history, uuid) for each row at `idx` once `changes` found its board gone: each segment closed where
    the next board's there started, the last (the board gone) at `seen_until_ms` (its last sample there: the
    gap a return or the next board is told against starts at its last reading, not at the start `now_ms` that
    found it gone, which may be long after); their `idx` is then set NULL. That time is kept at or before `now_ms`
    (a wall clock stepped back between two agents) and at or after the segment's start; unknown: `now_ms`."""
    at = sorted((r for r in rows if r.get("idx") == idx), key=lambda r: (_since(r) or 0, r["uuid"]))
    out = []
    for r, nxt in zip(at, [*at[1:], None], strict=True):
        since = _since(r)
        if nxt is None:
            until = now_ms if seen_until_ms is None else min(seen_until_ms, now_ms)
            until = max(until, since) if since is not None else until  # never a segment ending before it began
        else:
            until = max(_since(nxt) or 0, since or 0)
        hist = _history(r)
        hist.append([idx, since if since is not None else until, until])
        out.append((json.dumps(hist, separators=(",", ":")), r["uuid"]))
    return out


def moved(row: dict[str, Any], idx: int, now_ms: int) -> tuple[int, str | None]:
    """(idx_since_ms, idx_history) for an existing board's row seen at `idx` now: unchanged when it stays, else
    its current segment closed at `now_ms` and a new one from now."""
    since = _since(row)
    if not isinstance(row.get("idx"), int) and _history(row):  # back after it was gone: a new segment from now
        return now_ms, row.get("idx_history")
    if row.get("idx") == idx or not isinstance(row.get("idx"), int):
        return (since if since is not None else now_ms), row.get("idx_history")
    hist = _history(row)
    hist.append([row["idx"], since if since is not None else now_ms, now_ms])
    return now_ms, json.dumps(hist, separators=(",", ":"))


def segments(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every (index, board) segment: {gpu, uuid, since_ms, until_ms} (until None: still the last one known
    there), by index then start. A segment ends at the next board's start at that index, or when it moved."""
    segs: list[dict[str, Any]] = []
    for r in rows:
        for idx, since, until in _history(r):
            segs.append({"gpu": idx, "uuid": r["uuid"], "since_ms": since, "until_ms": until})
        if isinstance(r.get("idx"), int):
            segs.append({"gpu": r["idx"], "uuid": r["uuid"], "since_ms": _since(r), "until_ms": None})
    segs.sort(key=lambda s: (s["gpu"], s["since_ms"] if s["since_ms"] is not None else -1, s["uuid"]))
    for a, b in zip(segs, segs[1:], strict=False):
        if a["gpu"] == b["gpu"] and b["since_ms"] is not None and (a["until_ms"] is None or
                                                                    a["until_ms"] > b["since_ms"]):
            a["until_ms"] = b["since_ms"]
    return segs


def uuid_at(segs: Iterable[dict[str, Any]], gpu: int, ts_ms: int) -> str | None:
    """The board whose segment at index `gpu` holds `ts_ms`; None before anything was recorded there or in a gap
    (unknown: never guessed)."""
    for s in segs:
        if (s["gpu"] == gpu and s["since_ms"] is not None and s["since_ms"] <= ts_ms
                and (s["until_ms"] is None or ts_ms < s["until_ms"])):
            return s["uuid"]
    return None


def message(found_changes: list[dict[str, Any]]) -> str:
    """The store's `gpu.identity_changed` text: what changed since the history was last written. A board gone
    and one back are said as such: nothing continues at a gone board's index."""
    gone_ = [c for c in found_changes if "seen_until_ms" in c]
    back = [c for c in found_changes if "seen_until_ms" not in c and c["old_uuid"] == c["new_uuid"]]
    other = [c for c in found_changes if c not in gone_ and c not in back]
    parts = []
    if other:
        said = "; ".join(f"GPU {c['gpu']}: {c['old_uuid']} -> " + (c["new_uuid"] or "none (no longer enumerated)")
                         + (f" (no board there since {iso(c['absent_since_ms'])})" if "absent_since_ms" in c else "")
                         for c in other)
        parts.append(f"NVML enumerates other boards at indices this history knows, since the agent last recorded "
                     f"them ({said}). History is kept by index: these GPUs' charts, rollups and exports continue "
                     "with another board's readings from here; which board each index was when: "
                     "StoreReader.gpu_identities()")
    if gone_:
        said = "; ".join(f"GPU {c['gpu']} ({c['old_uuid']}, seen until "
                         f"{iso(c['seen_until_ms']) or 'an unknown time'}) is not present now" for c in gone_)
        parts.append(f"{said}: NVML lists no board at {'that index' if len(gone_) == 1 else 'those indices'} "
                     "since the agent last ran (removed, fallen off the bus, or not answering NVML: `nvidia-smi -L` "
                     "and the kernel log say which). Its history up to then stays under its index")
    if back:
        said = "; ".join(f"GPU {c['gpu']} ({c['new_uuid']}) is present again (not present since "
                         f"{iso(c['absent_since_ms'])})" for c in back)
        parts.append(f"{said}: the same board at its index, its history continues there after the gap")
    return ". ".join(parts)
