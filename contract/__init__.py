"""The shared contract of lynxtop: what the agent, the API, the CLI and the dashboard agree on.

Nothing in this package imports another part of the project, so every part can import it: the typed status and
events (`status`, `events`), the configuration (`config`), and the small helpers every side formats or writes with
(`format`, `files`).
"""
