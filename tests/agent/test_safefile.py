"""agent/serving/safefile.py: the one way a state file is opened and read. What stands at the path is never
trusted: each kind of non-regular file is refused with a message naming the path and what it is, without
following or blocking; the size is bounded; the JSON is what an agent writes. Real files of every kind."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from lynxtop.agent.serving import safefile
from lynxtop.agent.serving.safefile import StateFileError

pytestmark = pytest.mark.timeout(30)


def test_a_regular_file_is_read_and_a_missing_one_is_file_not_found(tmp_path):
    p = tmp_path / "serving.json"
    p.write_text('{"pid": 12, "argv": ["vllm", "serve", "é"]}')
    assert safefile.read_text(p) == '{"pid": 12, "argv": ["vllm", "serve", "é"]}'
    assert safefile.read_json(p) == {"pid": 12, "argv": ["vllm", "serve", "é"]}
    with pytest.raises(FileNotFoundError):
        safefile.read_text(tmp_path / "absent.json")


def _fifo(p):
    os.mkfifo(p)


def _socket(p):
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()


def _chardev(p):
    os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers


def _dir(p):
    p.mkdir()


def _symlink(p):
    target = p.with_name("target.json")
    target.write_text('{"secret": 1}')
    p.symlink_to(target)


def _dangling(p):
    p.symlink_to(p.with_name("nowhere"))


@pytest.mark.parametrize("make, what", [
    (_fifo, "a FIFO (named pipe)"), (_socket, "a socket"), (_chardev, "a character device"), (_dir, "a directory"),
    (_symlink, "a symbolic link"), (_dangling, "a symbolic link"),
], ids=["fifo", "socket", "chardev", "directory", "symlink", "dangling-symlink"])
def test_what_is_not_a_regular_file_is_refused_naming_it(tmp_path, make, what):
    if make is _chardev and os.geteuid() != 0:
        pytest.skip("mknod of a device needs root")
    p = tmp_path / "serving.json"
    make(p)
    with pytest.raises(StateFileError) as err:
        safefile.read_text(p)
    assert str(err.value) == f"{p} is {what}, not a regular file: not read"
    assert err.value.reason == f"is {what}, not a regular file" and isinstance(err.value, OSError)


def test_creating_through_a_dangling_symlink_is_refused_and_creates_nothing(tmp_path):
    p = tmp_path / "agent.lock"
    p.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(StateFileError, match="symbolic link, not a regular file: not used"):
        safefile.open_regular(p, os.O_RDWR | os.O_CREAT, 0o640, refused="not used")
    assert not (tmp_path / "would-be-created").exists()


def test_open_regular_creates_a_new_file_with_the_mode_asked(tmp_path):
    p = tmp_path / "agent.lock"
    fd = safefile.open_regular(p, os.O_RDWR | os.O_CREAT, 0o640)
    try:
        st = os.fstat(fd)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640 & ~_umask()
        assert os.get_blocking(fd) and os.get_inheritable(fd) is False
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_size_is_bounded(tmp_path):
    p = tmp_path / "switch.json"
    p.write_bytes(b"x" * 100)
    assert safefile.read_bytes(p, limit=100) == b"x" * 100
    with pytest.raises(StateFileError, match="larger than 99 bytes"):
        safefile.read_bytes(p, limit=99)
    p.write_bytes(b"x" * (safefile.MAX_BYTES + 1))
    with pytest.raises(StateFileError, match="too large for a state file"):
        safefile.read_text(p)


def test_text_that_is_not_utf8_is_refused(tmp_path):
    p = tmp_path / "serving.json"
    p.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(StateFileError, match=r"not UTF-8 text \(byte 7\)"):
        safefile.read_text(p)


@pytest.mark.parametrize("text, words", [
    ("1e999", "number 1e999 is not finite"), ("-1e999", "number -1e999 is not finite"), ("Infinity", "Infinity is not"),
    ("-Infinity", "-Infinity is not"), ("NaN", "NaN is not"), ("9223372036854775808", "out of range"),
    ("-9223372036854775809", "out of range"), ("1" * 5000, "out of range"), ("[" * 50_000 + "]" * 50_000, "nested"),
    ("[" * 33 + "]" * 33, "nested more than 32"), ("{", "Expecting"),
], ids=["1e999", "-1e999", "Infinity", "-Infinity", "NaN", "2**63", "-2**63-1", "5000-digits", "deep", "33-levels",
        "cut-short"])
def test_loads_strict_refuses_what_no_agent_writes(text, words):
    with pytest.raises(ValueError, match=words):
        safefile.loads_strict(text)


def test_loads_strict_takes_what_agents_write():
    text = ('{"pid": 4194304, "start_ticks": 9223372036854775807, "low": -9223372036854775808, "x": 0.5, '
            '"e": 1e300, "n": null, "ok": true, "s": "Infinity", "l": ' + "[" * 31 + "]" * 31 + "}")
    got = safefile.loads_strict(text)
    assert got["start_ticks"] == 2**63 - 1 and got["low"] == -(2**63) and got["e"] == 1e300 and got["s"] == "Infinity"


def test_a_swap_between_the_look_and_the_open_is_caught(tmp_path, monkeypatch):
    """The lstat saw a regular file; by the open a symlink, or another file, stands there."""
    decoy = tmp_path / "decoy.json"
    decoy.write_text("{}")
    link = tmp_path / "switch.json"
    link.symlink_to(decoy)
    real_lstat = os.lstat
    monkeypatch.setattr(safefile.os, "lstat", lambda p: real_lstat(decoy))
    with pytest.raises(StateFileError, match="is a symbolic link, not a regular file: not read"):
        safefile.read_text(link)  # O_NOFOLLOW: ELOOP
    other = tmp_path / "crash-loop.json"
    other.write_text("{}")
    with pytest.raises(StateFileError, match="was replaced while being opened"):
        safefile.read_text(other)  # another inode than the one looked at
