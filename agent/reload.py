"""SIGHUP (`systemctl reload`): the config file re-read, told to systemd, the log and the event history.

An operator who reloads from a script or a remote shell sees neither the journal nor systemd's state; the event
(`agent.config_reloaded`, or `agent.config_reload_failed` naming the problems) is what the dashboard's Events view,
`/v1/events` and the history show. The file's name and the problems are foreign text (a problem quotes the file's
values): escaped and cut as every event's foreign text is (agent/gpu/left_out.py), and only so many of them, since a
broken file can hold thousands.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from lynxtop.agent.config_source import ConfigSource
from lynxtop.agent.notify import Notifier
from lynxtop.contract.config import ConfigError
from lynxtop.contract.events import Event, EventKind, Severity
from lynxtop.contract.terminal import terminal_safe

log = logging.getLogger("lynxtop.agent")

PROBLEM_CHARS = 240  # one problem (or error) as stored, escaped first so an escape is never cut in half
PROBLEMS_KEPT = 20  # in details.problems; `lynxtop config check` lists them all
PROBLEMS_IN_MESSAGE = 3
NAMES_IN_MESSAGE = 20  # profile names in the message (details.profiles has them all: each is at most 64 safe chars)

Record = Callable[[Event], None]


def reload_config(config: ConfigSource, notifier: Notifier | None, status_line: Callable[[], str],
                  record: Record | None = None) -> str:
    """SIGHUP: re-read the config file now, as an action does (ConfigSource.reload): its profiles and models are
    used from now on; nothing running is stopped, restarted or changed. A file with errors is refused and the
    config in use kept. The [agent], [sla] and [ray] settings take effect on an agent restart only. `notifier`:
    None before READY=1 (a reload then must not tell systemd the agent is up); else RELOADING=1 ... READY=1.
    `record`: the agent's event path (None before the store is open: then the log line alone); it logs the event,
    so the line is not written twice. A file read is also checked for secrets others can read (Config.warnings):
    each warning is logged at every reload, as at the agent's start (no event, as there), so a file made
    world-readable is told and a fixed one is not told again. Returns the message."""
    path = config.current.path
    if path is None:
        msg = "SIGHUP: no config file to reload (the agent runs on defaults); nothing changed"
        log.info("%s", msg)
        return msg
    if notifier is not None:
        notifier.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
    file = terminal_safe(str(path))
    warnings: tuple[str, ...] = ()
    try:
        cfg = config.reload()
    except ConfigError as exc:
        event = failed_event(file, exc.problems)
    except Exception as exc:  # noqa: BLE001 - a reload must never end the agent
        event = failed_event(file, [f"cannot reload ({type(exc).__name__}: {exc})"])
    else:
        event = reloaded_event(file, [p.name for p in cfg.profiles])
        warnings = cfg.warnings
    if record is not None:
        record(event)
    else:
        log.log(logging.INFO if event.severity == Severity.INFO else logging.WARNING, "%s", event.message)
    for line in warnings:  # the file as read now, at each reload, as the agent's start says them (log only)
        log.warning("SIGHUP: config warning: %s", line)
    if notifier is not None:
        notifier.ready(status_line())
    return event.message


def reloaded_event(file: str, names: list[str]) -> Event:
    """`agent.config_reloaded` (info): the file (escaped) and the profiles now in use."""
    shown = ", ".join(names[:NAMES_IN_MESSAGE]) or "none"
    if len(names) > NAMES_IN_MESSAGE:
        shown += f" and {len(names) - NAMES_IN_MESSAGE} more"
    msg = (f"SIGHUP: config reloaded from {file}: profiles {shown}; serving untouched (a changed profile is used by "
           "its next start; [agent], [sla] and [ray] settings take effect on an agent restart)")
    return Event(EventKind.AGENT_CONFIG_RELOADED, Severity.INFO, msg, details={"file": file, "profiles": names})


def failed_event(file: str, problems: list[str]) -> Event:
    """`agent.config_reload_failed` (warning): the config in use is kept; the first problems, escaped and cut."""
    kept = [_cut(terminal_safe(p)) for p in problems[:PROBLEMS_KEPT]]
    named = "; ".join(kept[:PROBLEMS_IN_MESSAGE])
    more = len(problems) - PROBLEMS_IN_MESSAGE
    if more > 0:
        named += f" (and {more} more; `lynxtop config check` lists them all)"
    msg = f"SIGHUP: config {file} has errors; kept the previous config, nothing changed: {named}"
    return Event(EventKind.AGENT_CONFIG_RELOAD_FAILED, Severity.WARNING, msg,
                 details={"file": file, "problems": kept, "problems_total": len(problems)})


def _cut(text: str) -> str:
    return text if len(text) <= PROBLEM_CHARS else text[:PROBLEM_CHARS - 1] + "…"
