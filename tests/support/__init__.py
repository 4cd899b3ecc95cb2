"""Helpers shared by the tests and the benchmarks (ports, waits, the agent's TOML, fake statuses, the dashboard).

Imported as `support.<module>`: pytest puts tests/ on sys.path (tests/conftest.py sits there, without an
__init__.py); a benchmark adds the repository's tests/ to sys.path itself (see support/agent_config.py).
Test modules import from here, never from a conftest.
"""
