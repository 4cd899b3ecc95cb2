"""Helpers shared by the tests and the benchmarks, one copy each.

ports (free_port, short_dir), waits (wait_for, wait_for_async), agent_config (the one writer of the agent's
TOML), agent_proc (the agent as a real process for end-to-end tests), db (read-only queries), status (the fake
node's Status), tui (the dashboard under test), tui_keys (a key pressed there and the screen it opens),
bench_env (`lynxtop bench`'s agent and a failing server), web_app (an aiohttp stand-in on a free port, a vLLM
/metrics page), cli (`lynxtop` run in process), gpu_boards (a fake NVML node's boards and the store's identity
records), remote_history (an agent serving a history over TCP reads), serving_record (edited serving.json records).

Imported as `support.<module>`: pytest puts tests/ on sys.path (tests/conftest.py sits there, without an
__init__.py); a benchmark does `import _support` first (benchmarks/_support.py adds tests/ to sys.path).
Test modules import helpers from here (or from a helper module of their own folder), never from a conftest or
from another test module.
"""
