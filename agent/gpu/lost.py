"""Lost GPUs and the boards behind NVML's indices, for the GPU sampler (sampler.py).

A GPU answering GPU_IS_LOST is marked lost and probed every `probe_s`; one lost
while NVML enumerated it (no handle, or lost amid its setup) is set up again at each probe, as at open, since a
reset makes it answer again without a re-initialisation (it stayed out of static() until the agent restarted).
While lost, its last process rows stay known, marked `stale`: NVML cannot list a lost GPU's processes, and a
stop must not take their absence for a release (agent/serving/stopping.py says "not confirmed").

The events follow episodes, as agent/gpu/outage.py does for NVML: `gpu.lost` (critical) when one starts, and
`gpu.recovered` once the GPU has answered for `settle_s` since it last came back, counting the times it came back
and was lost again in between. A GPU that falls off the bus every few seconds is one pair of events, not one per
flap. The lost flag itself (the rows' `lost`, the exporter's `lynxtop_gpu_lost`) follows NVML at every tick, and
the GPU is sampled again as soon as it answers: only the recovery event waits.

Stored history is keyed by NVML index: the last UUID seen at each index is kept across (re)initialisations, and
another board at a known index (a driver reload that reorders them, a board gone) is one `gpu.identity_changed`.
An episode belongs to the board (its UUID), not to the index: NVML indices follow the PCI order of the boards
present, so when a lost board falls off the bus the next one takes its index at the next driver load. That board
answering is not the lost one recovered (its episode ends, told by the identity event); the lost board found at
another index is, told under its new index. Changes between two agent processes are the store's to tell
(store/writer.py upsert_gpus): this memory starts empty with the process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pynvml

from lynxtop.agent.gpu.calls import REINIT_CODES, Gpu, NvmlCaller, Reinit, Reporter, log
from lynxtop.contract.events import EventKind

SETTLE_S = 60.0  # a lost GPU answering this long is told recovered; lost again before is the same episode


@dataclass
class LostEpisode:
    """One GPU's loss, from its `gpu.lost` until its `gpu.recovered`; times on the sampler's monotonic clock."""

    since: float
    back_at: float | None = None  # when it last came back (None: lost now)
    flaps: int = 0  # times it came back and was lost again within the settle time
    how: str = ""  # how it came back last, for the recovery's message
    uuid: str = ""  # the lost board ("" while unknown: lost before NVML gave its UUID)


class LostGpus:
    """Marks, probes and sets up again the lost GPUs; `set_up(idx)` is the sampler's setup of one GPU (None: left
    out by a setup bug, told there; raises `Reinit` for the library)."""

    def __init__(self, r: Reporter, caller: NvmlCaller, clock: Callable[[], float], probe_s: float,
                 set_up: Callable[[int], Gpu | None], settle_s: float = SETTLE_S):
        self._r, self._c, self._clock, self.probe_s, self._set_up = r, caller, clock, probe_s, set_up
        self.settle_s = settle_s
        self._episodes: dict[int, LostEpisode] = {}  # by NVML index, across (re)initialisations
        self._settle_at = float("inf")  # the first tick at which a GPU back in an episode may be told recovered
        self._uuids: dict[int, str] = {}  # the last UUID known at each NVML index, across (re)initialisations
        self._stale: dict[int, tuple[str, list[dict]]] = {}  # a lost GPU's last processes across a re-init

    def opened(self, gpus: list[Gpu], count: int) -> None:
        """After a (re)initialisation that enumerated `count` GPUs: identities compared, lost GPUs told (a GPU lost
        before it and lost again keeps its last processes), the ones answering counted back in their episode (told
        recovered once they settle). A GPU of an episode no longer sampled (not enumerated, left out) is not back."""
        lost_uuids = {ep.uuid for ep in self._episodes.values() if ep.uuid}
        self.check_identity({g.idx: g.uuid for g in gpus if g.uuid}, count, lost_uuids)
        moved = self._follow_boards(gpus)
        stale, self._stale = self._stale, {}
        now = self._clock()
        answering = set()
        for g in gpus:
            if g.lost:
                was = stale.get(g.idx)
                if was is not None and g.uuid in ("", was[0]):
                    g.proc_rows = was[1]
                self.mark(g, "while enumerating")
            else:  # found answering (a reset, a driver reload)
                answering.add(g.idx)
                ep = self._episodes.get(g.idx)
                if ep is not None and ep.back_at is None:
                    how = "found answering when NVML was initialised again"
                    if g.idx in moved:
                        how += f", at index {g.idx}: it was lost at index {moved[g.idx]}"
                    self._back(g, now, how)
        for i, ep in self._episodes.items():
            if i not in answering:
                ep.back_at = None

    def _follow_boards(self, gpus: list[Gpu]) -> dict[int, int]:
        """The episodes re-keyed to where NVML enumerates their boards now: a lost board found at another index
        moves there (returned: new index -> old); one whose index now holds another board and that is enumerated
        nowhere ends (not recovered: the identity event names it); one of unknown board, or whose index holds no
        known board, stays where it was."""
        at = {g.uuid: g.idx for g in gpus if g.uuid}
        held = {g.idx for g in gpus if g.uuid}
        kept: dict[int, LostEpisode] = {}
        moved: dict[int, int] = {}
        later: list[tuple[int, LostEpisode]] = []
        for i, ep in self._episodes.items():
            if ep.uuid and ep.uuid in at:
                kept[at[ep.uuid]] = ep
                if at[ep.uuid] != i:
                    moved[at[ep.uuid]] = i
            elif ep.uuid and i in held:
                log.info("GPU %d's lost board %s is not enumerated now; another board answers at index %d: its lost "
                         "episode ends, not recovered", i, ep.uuid, i)
            else:
                later.append((i, ep))
        for i, ep in later:
            kept.setdefault(i, ep)
        self._episodes = kept
        return moved

    def keep(self, gpus: list[Gpu]) -> None:
        """At a teardown: the lost GPUs' last processes, for the next initialisation should it find them lost."""
        for g in gpus:
            if g.lost and g.proc_rows:
                self._stale[g.idx] = (g.uuid, g.proc_rows)

    def mark(self, g: Gpu, where: str) -> None:
        """`g` is lost: one `gpu.lost` per episode (lost again within the settle time: a flap, counted). Its last
        process rows are copied once with `stale: True` and stay in every tick (the same objects: stored once,
        store/writer.py) until it answers and is read again."""
        g.lost = True
        g.lost_probe_at = self._clock() + self.probe_s
        if g.proc_rows and not g.proc_rows[0].get("stale"):
            g.proc_rows = [{**r, "stale": True} for r in g.proc_rows]
        ep = self._episodes.get(g.idx)
        if ep is not None and ep.uuid and g.uuid and ep.uuid != g.uuid:  # another board lost at that index
            del self._episodes[g.idx]
            ep = None
        if ep is not None:
            ep.uuid = ep.uuid or g.uuid
            if ep.back_at is not None:
                ep.flaps += 1
                ep.back_at = None
                log.debug("GPU %d lost again %d time(s) in this episode", g.idx, ep.flaps)
        else:
            self._episodes[g.idx] = LostEpisode(since=self._clock(), uuid=g.uuid)
            self._r.event(EventKind.GPU_LOST, "critical",
                          f"GPU {g.idx} {g.uuid or ''} is lost (NVML GPU_IS_LOST {where}); the other GPUs keep "
                          "sampling. A lost GPU usually needs a reset or a reboot.",
                          {"gpu": g.idx, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id})

    def probe(self, g: Gpu, now: float) -> Gpu | None:
        """The lost GPU to sample again if it answers (checked every probe_s, with one cheap call), else None. One
        lost before its static facts were read comes back as a new `Gpu` (`_set_up_again`): the sampler then puts
        it in place of `g` and re-publishes the static rows."""
        if now < g.lost_probe_at:
            return None
        g.lost_probe_at = now + self.probe_s
        if g.handle is None or not g.uuid:
            return self._set_up_again(g)
        try:
            self._c.b.nvmlDeviceGetTemperature(g.handle, pynvml.NVML_TEMPERATURE_GPU)
        except pynvml.NVMLError as e:
            if e.value in REINIT_CODES and not g.reinit_local:
                raise Reinit(e.value, "nvmlDeviceGetTemperature", g.idx) from None
            return None
        g.lost = False
        g.kept_at = None  # read everything again on its first tick back
        if g.gpm is not None:
            g.gpm.reset()
        self._back(g, now, "")
        return g

    def _set_up_again(self, lost: Gpu) -> Gpu | None:
        """`lost`'s handle and static facts asked again, as at open: the new `Gpu`, its UUID compared with what its
        index was and `gpu.recovered` told as for any lost GPU that settles; None while it does not."""
        g = self._set_up(lost.idx)  # Reinit (the library's code) goes up to the tick: NVML is opened again
        if g is None or g.lost or g.handle is None or not g.uuid:
            if g is not None and g.gpm is not None:
                g.gpm.close()
            return None
        g.kept_at = None
        ep = self._episodes.get(g.idx)
        self.check_identity({g.idx: g.uuid}, None, {ep.uuid} if ep is not None and ep.uuid else set())
        if ep is not None and ep.uuid and ep.uuid != g.uuid:  # another board set up at the lost one's index
            del self._episodes[g.idx]
        self._back(g, self._clock(), "it was lost when NVML enumerated it: its static facts were read when it "
                   "answered")
        return g

    def _back(self, g: Gpu, now: float, how: str) -> None:
        """`g` answers again: its episode settles from now (`settle`)."""
        ep = self._episodes.get(g.idx)
        if ep is None:  # answering without an episode (none was told): nothing to close
            return
        ep.back_at, ep.how = now, how
        self._settle_at = min(self._settle_at, now + self.settle_s)
        log.info("GPU %d answers NVML again; sampled again now, told recovered once it has answered for %g s",
                 g.idx, self.settle_s)

    def settle(self, now: float, gpus: list[Gpu]) -> None:
        """Once a tick, after sampling: each GPU back for `settle_s` gets its episode's one `gpu.recovered`, with
        how long it was lost and how many times it came back and was lost again."""
        if now < self._settle_at:
            return
        self._settle_at = float("inf")
        by_idx = {g.idx: g for g in gpus}
        for i, ep in list(self._episodes.items()):
            if ep.back_at is None:
                continue
            if now - ep.back_at < self.settle_s:
                self._settle_at = min(self._settle_at, ep.back_at + self.settle_s)
                continue
            del self._episodes[i]
            g = by_idx.get(i)
            uuid, bus = (g.uuid, g.pci_bus_id) if g is not None else ("", "")
            lost_s = round(ep.back_at - ep.since, 1)
            msg = f"GPU {i} {uuid} answers NVML again: lost for {lost_s:g} s, answering for {self.settle_s:g} s"
            if ep.flaps:
                msg += (f"; it came back and was lost again {ep.flaps} time(s) in this episode (one event for "
                        "them all): check its seating, power and PCIe link")
            if ep.how:
                msg += f" ({ep.how})"
            self._r.event(EventKind.GPU_RECOVERED, "info", msg,
                          {"gpu": i, "uuid": uuid, "pci_bus_id": bus, "lost_s": lost_s, "flaps": ep.flaps,
                           "settle_s": self.settle_s})

    def check_identity(self, found: dict[int, str], count: int | None, lost: set[str] | frozenset[str] = frozenset(),
                       ) -> None:
        """The UUIDs `found` at their NVML indices against the last known at each: one `gpu.identity_changed`
        (warning) naming each index whose board changed (old and new UUID; new None: no longer enumerated, told
        when `count` is given, at a (re)open). An index without a UUID now (lost while NVML enumerated) is
        unknown, not changed: compared once it is set up. A board of `lost` (lost GPUs' UUIDs) enumerated nowhere
        now is named: what answers at its index is another board, not it recovered."""
        known = self._uuids
        changes = [{"gpu": i, "old_uuid": known[i], "new_uuid": new}
                   for i, new in sorted(found.items()) if known.get(i) not in (None, new)]
        if count is not None:
            gone = sorted(i for i in known if i >= count)
            changes += [{"gpu": i, "old_uuid": known.pop(i), "new_uuid": None} for i in gone]
        known.update(found)
        if not changes:
            return
        said = "; ".join(f"GPU {c['gpu']}: {c['old_uuid']} -> " + (c["new_uuid"] or "none (no longer enumerated)")
                         for c in changes)
        now_at = set(known.values())
        gone_lost = sorted({c["old_uuid"] for c in changes} & set(lost) - now_at)
        if gone_lost:
            said += (f"; lost board(s) {', '.join(gone_lost)} not enumerated now: what answers at their index is "
                     "another board, not them recovered")
        self._r.event(EventKind.GPU_IDENTITY_CHANGED, "warning",
                      f"NVML now enumerates other boards at known indices ({said}). History is kept by index: "
                      "from here these GPUs' charts continue with another board's readings", {"changes": changes})
