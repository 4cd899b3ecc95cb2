"""The config is re-read in one place (issue 27.1): `ConfigSource`, shared by the node and the supervisor.

Before: the supervisor re-read profiles for each action and the node re-read them on a changed mtime, then
assigned the supervisor's `cfg` from outside.
"""

from __future__ import annotations

import os

import pytest

from lynxtop.agent.config_source import ConfigSource
from lynxtop.contract.config import ConfigError, load_config


def _bump_mtime(path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_a_profile_added_to_the_file_is_seen_by_the_supervisor_and_the_node_alike(tmp_path, make_sup, h):
    path = h.write_config(tmp_path)
    sup = make_sup(cfg_path=path)
    source = sup.config  # the node passes its source to the supervisor: this one object is the config
    assert [p.name for p in source.poll().profiles] == ["alpha", "beta"]  # the first poll notes the mtime
    path.write_text(path.read_text() + h.standin_profile("gamma"))
    _bump_mtime(path)
    assert [p.name for p in source.poll().profiles] == ["alpha", "beta", "gamma"]
    assert sup.cfg.profile("gamma") is not None  # one config: what the node listed, the supervisor starts


def test_a_broken_file_keeps_the_profiles_for_the_list_and_refuses_an_action(tmp_path, h, caplog):
    path = h.write_config(tmp_path)
    source = ConfigSource(load_config(str(path)))
    source.poll()
    path.write_text(path.read_text() + "\n[[profile]]\nname = 3\n")
    _bump_mtime(path)
    assert [p.name for p in source.poll().profiles] == ["alpha", "beta"]
    assert "keeping the previous profiles" in caplog.text
    with pytest.raises(ConfigError):
        source.reload()
    assert [p.name for p in source.current.profiles] == ["alpha", "beta"]  # nothing was changed
