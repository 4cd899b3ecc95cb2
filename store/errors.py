"""Errors of the history store, each naming the database path so an operator knows which file to look at."""

from __future__ import annotations


class StoreError(Exception):
    """A problem with the history database that a user can act on (message names the path)."""


class NotOurDatabase(StoreError):
    """The file is corrupt, not SQLite at all, or another program's SQLite database.

    The writer moves such a file aside and starts fresh; readers only report it.
    """


class NewerSchema(StoreError):
    """A newer lynxtop changed the database in a way this code cannot follow (its floor, meta.compat_version, is
    above this SCHEMA_VERSION), or its schema version is unreadable: never moved aside or touched, only refused."""


class StoreAccessError(StoreError):
    """The process may not read or write the file or its directory ("permission denied").

    Never treated as damage: the file is left exactly as it is and the agent refuses to start.
    """
