"""Errors of the history store, each naming the database path so an operator knows which file to look at."""

from __future__ import annotations


class StoreError(Exception):
    """A problem with the history database that a user can act on (message names the path)."""


class NotOurDatabase(StoreError):
    """The file is corrupt, not SQLite at all, or another program's SQLite database.

    The writer moves such a file aside and starts fresh; readers only report it.
    """


class NewerSchema(StoreError):
    """The database was written by a newer lynxtop: never moved aside or touched, only refused."""


class StoreAccessError(StoreError):
    """The process may not read or write the file or its directory ("permission denied").

    Never treated as damage: the file is left exactly as it is and the agent refuses to start.
    """
