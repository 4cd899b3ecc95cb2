"""`lynxtop bench`'s own inputs and outputs: `--json PATH` (checked before the sweep, never over an existing file,
written whole or not at all), `--prompts FILE` (a bad file is named with its line, exit 2, nothing sent),
`--save-result` names under racing writers, `--api-key` checked up front, and prompts built as they are sent
(not thousands of them in advance). The command runs as a subprocess against the raw server of
test_bench_foreign_server.py (docs/bench.md, docs/reliability.md)."""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_bench_foreign_server import Hostile, run_bench

from lynxtop.cli import bench_result

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def srv() -> Iterator[Hostile]:
    s = Hostile()
    yield s
    s.close()


def bench_json(srv: Hostile, path: str, *extra: str) -> tuple[int, str]:
    code, _, err, _, _ = run_bench("--url", srv.url, "--no-store", "--concurrency", "1", "--requests", "2",
                                   "--warmup", "0", "--input-len", "4", "--output-len", "4", "--json", path, *extra)
    assert "Traceback" not in err, err
    return code, err


# ---------------------------------------------------------------------------------------------- bug 4: --json

def test_json_into_a_missing_directory_is_refused_before_anything_is_sent(srv, tmp_path):
    target = tmp_path / "no" / "such" / "levels.json"
    code, err = bench_json(srv, str(target))
    assert code == 2 and str(target.parent) in err and "--json" in err, err
    assert srv.posts == 0 and not (tmp_path / "no").exists()


def test_json_over_an_existing_file_is_refused_and_the_file_kept(srv, tmp_path):
    precious = tmp_path / "notes.json"
    precious.write_text("an operator's own file\n")
    code, err = bench_json(srv, str(precious))
    assert code == 2 and "exists" in err and str(precious) in err, err
    assert precious.read_text() == "an operator's own file\n" and srv.posts == 0


@pytest.mark.parametrize("make", ["dir", "unwritable"])
def test_json_to_a_directory_or_an_unwritable_one_is_refused(srv, tmp_path, make):
    if make == "dir":
        target = tmp_path / "adir"
        target.mkdir()
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes anywhere")
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = ro / "levels.json"
    code, err = bench_json(srv, str(target))
    assert code == 2 and "--json" in err, err
    assert srv.posts == 0


def test_json_is_written_whole_with_no_temporary_left(srv, tmp_path):
    target = tmp_path / "levels.json"
    old = os.umask(0o022)
    try:
        code, err = bench_json(srv, str(target))
    finally:
        os.umask(old)
    assert code == 0, err
    assert [p.name for p in tmp_path.iterdir()] == ["levels.json"]
    assert len(json.loads(target.read_text())) == 1
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # as a plain create under the umask, not mkstemp's 0600


def test_a_json_file_that_appears_during_the_sweep_is_kept_and_the_levels_go_beside_it(tmp_path):
    target = tmp_path / "levels.json"

    def intruder() -> None:
        if not target.exists():
            target.write_text("someone else's\n")

    s = Hostile(on_post=intruder)
    try:
        code, err = bench_json(s, str(target))
    finally:
        s.close()
    beside = tmp_path / "levels-2.json"
    assert target.read_text() == "someone else's\n"
    assert len(json.loads(beside.read_text())) == 1
    assert str(beside) in err and code == 1, err  # not where asked: a script must not read the other file


# ---------------------------------------------------------------------------------------------- bug 5: --prompts

@pytest.mark.parametrize("content,where", [
    (None, "no such file"),
    (b"", "holds no prompt"),
    (b'{"prompt": "fine"}\n{"prompt": 1\n', ":2"),
    (b"fine\n\xff\xfe\n", "UTF-8"),
    (b'{"prompt": "fine"}\n\n{"x": 1}\n', ":3"),
    (b'{"prompt": 7}\n', ":1"),
    (b'{"prompt": ""}\n', ":1"),
    (b'{"prompt": "a"}\n' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"\n", ":2"),  # nested past the parser
], ids=["missing", "empty", "bad-json", "not-utf8", "no-prompt", "not-a-string", "empty-prompt", "deep"])
def test_a_bad_prompts_file_is_named_with_its_line_and_nothing_is_sent(srv, tmp_path, content, where):
    prompts = tmp_path / "prompts.jsonl"
    if content is not None:
        prompts.write_bytes(content)
    code, _, err, _, _ = run_bench("--url", srv.url, "--no-store", "--concurrency", "1", "--requests", "1",
                                   "--warmup", "0", "--prompts", str(prompts))
    assert "Traceback" not in err and code == 2, err
    assert str(prompts) in err and where in err, err
    assert srv.posts == 0


def test_a_prompts_path_that_is_not_a_regular_file_is_refused(srv, tmp_path):
    code, _, err, _, _ = run_bench("--url", srv.url, "--no-store", "--concurrency", "1", "--warmup", "0",
                                   "--prompts", "/dev/zero", timeout=30)
    assert "Traceback" not in err and code == 2 and "/dev/zero" in err, err
    code, _, err, _, _ = run_bench("--url", srv.url, "--no-store", "--concurrency", "1", "--warmup", "0",
                                   "--prompts", str(tmp_path), timeout=30)
    assert "Traceback" not in err and code == 2 and str(tmp_path) in err, err
    assert srv.posts == 0


def test_good_prompts_are_sent(srv, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello there"}\nplain line\n')
    code, err = bench_json(srv, str(tmp_path / "out.json"), "--prompts", str(prompts))
    assert code == 0 and srv.posts == 2, err


# ---------------------------------------------------------------------------------------------- bug 6: names

@pytest.mark.parametrize("writers", [2, 3])
def test_save_result_names_never_lose_a_level_to_a_racing_writer(tmp_path, writers):
    lost = []
    for i in range(100):
        d = tmp_path / str(i)
        barrier = threading.Barrier(writers)

        def one(n: int, d: Path = d, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            bench_result.write(d, {"writer": n}, "same.json")

        ts = [threading.Thread(target=one, args=(n,)) for n in range(writers)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        got = sorted(json.loads(p.read_text())["writer"] for p in d.glob("*.json"))
        if got != list(range(writers)):
            lost.append((i, got))
        assert not [p for p in d.iterdir() if not p.name.endswith(".json")], "a temporary file was left"
    assert not lost, lost[:5]
    assert {p.name for p in (tmp_path / "0").iterdir()} == {"same.json", *(f"same-{n}.json"
                                                                          for n in range(2, writers + 1))}


def test_save_result_never_replaces_an_existing_file(tmp_path):
    (tmp_path / "x.json").write_text("old\n")
    path = bench_result.write(tmp_path, {"a": 1}, "x.json")
    assert path.name == "x-2.json" and (tmp_path / "x.json").read_text() == "old\n"


# ---------------------------------------------------------------------------------------------- also

@pytest.mark.parametrize("key", ["ключ", "tok\r\nX-Injected: 1", "tok\x1b[2J"], ids=["cyrillic", "crlf", "escape"])
def test_an_api_key_that_cannot_be_a_header_is_refused_up_front(srv, tmp_path, key):
    code, _, err, _, _ = run_bench("--url", srv.url, "--no-store", "--concurrency", "1", "--warmup", "0",
                                   "--api-key", key)
    assert "Traceback" not in err and code == 2 and "--api-key" in err, err
    assert srv.posts == 0 and "/v1/models" not in srv.sent


def test_prompts_are_built_as_sent_not_thousands_in_advance(srv, tmp_path):
    """--input-len 131072 with 4096 requests a level built ~19 GB of prompts before the first request."""
    code, _, err, rss, wall = run_bench("--url", srv.url, "--no-store", "--concurrency", "1", "--duration", "2",
                                        "--warmup", "0", "--input-len", "131072",
                                        "--output-len", "1", timeout=60)
    assert "Traceback" not in err and code == 0, err
    assert rss < 400 and wall < 30, (rss, wall)
    assert srv.posts > 0


def test_the_same_seed_gives_the_same_prompts():
    from lynxtop.cli.bench_load import Workload

    a, b = Workload("http://x", "m", 64, 4, seed=3), Workload("http://x", "m", 64, 4, seed=3)
    assert [a.body(i, 7) for i in range(5)] == [b.body(i, 7) for i in range(5)]
    assert len({a.body(i, 7) for i in range(5)}) == 5  # distinct prompts
    body = json.loads(a.body(0, 7))
    assert len(body["prompt"]) == 64 and all(100 <= t <= 30_000 for t in body["prompt"])
    assert body["max_tokens"] == 4 and body["stream"] and body["ignore_eos"]
    assert a.body(4096, 7) != a.body(0, 7) and a.body(0, 8) != a.body(0, 7)  # no repeats: no prefix-cache hits

