"""Whether a directory the agent keeps files in (state, control socket, run logs) is safe from other users.

A run record in such a directory whose server is gone makes the next agent SIGKILL every process the record
names (launcher.kill_leftovers), so a directory another user may write lets that user have the agent kill any
process of the node; one another user owns also lets them replace the control socket (and with it every
operator's `lynxtop stop`). So each must be owned by the agent's user and writable by nobody else. systemd's
StateDirectory=/RuntimeDirectory=/LogsDirectory= make theirs so (User=lynxtop, mode 0750); so do the agent's own
mkdirs (0750) and a test's tmp_path (0700/0755).

A sticky directory (the socket in /tmp, `[agent] socket = "/tmp/a.sock"`) may be written by others but nobody
else may remove or rename what the agent makes there; the socket's directory is allowed to be one, because the
agent also reads the record beside the socket only when it owns it (statefiles) and sets the socket's group and
mode without following a link (routes). The state and log directories may not: the agent opens, prunes and
locks many names there that another user could make first.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path


def user(uid: int) -> str:
    """`name (uid N)`, or `uid N` for a uid with no passwd entry."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def user_name(uid: int) -> str:
    """The name for a command line (chown NAME), `#N`-free: the uid itself when there is no name."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def problem(d: Path, what: str, setting: str, *, sticky_ok: bool = False) -> str | None:
    """Why the directory `d` (`what`: "the state directory") cannot be trusted, as one line saying what to do
    (`setting`: the config key that picks another one); None when it can, or is not there yet (the agent makes it,
    its own) or cannot be looked at (whatever uses it next says so, with the path). A symlink to a directory is
    judged by the directory."""
    try:
        st = d.stat()
    except OSError:
        return None
    me, mode = os.geteuid(), stat.S_IMODE(st.st_mode)
    where = f"{what} {d} belongs to {user(st.st_uid)}, mode {mode:04o}"
    if st.st_uid != me:
        return (f"{where}, but this agent runs as {user(me)}: that user could replace the files the agent keeps "
                f"there (the run's record, whose processes the agent kills when the run is gone); nothing was "
                f"changed. Use a directory of this agent's user ({setting}) or hand it over (chown "
                f"{user_name(me)} {d}; chmod go-w {d})")
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not (sticky_ok and mode & stat.S_ISVTX):
        return (f"{what} {d} (owner {user(st.st_uid)}, mode {mode:04o}) may be written by other users: they could "
                "plant a run's record there and have the agent kill the processes it names; nothing was changed. "
                f"Make it private (chmod go-w {d}) or use another directory ({setting})")
    return None
