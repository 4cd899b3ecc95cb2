"""`lynxtop config check` on a Ray head and worker: the [ray] table and the exact `ray start` argv the agent runs;
nothing of it on a single node."""

from __future__ import annotations

import json
from pathlib import Path

from lynxtop.__main__ import main


def run(capsys, path: Path, *args: str) -> tuple[int, str, str]:
    code = main(["config", "check", "--config", str(path), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def write(tmp_path: Path, agent: str, ray: str = "") -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f'[agent]\ndatabase = "{tmp_path}/l.db"\nsocket = "{tmp_path}/a.sock"\n{agent}\n'
                    + (f"[ray]\n{ray}\n" if ray else ""))
    return path


def test_worker_prints_its_ray_table_and_argv(tmp_path, capsys):
    path = write(tmp_path, 'role = "worker"', 'head_address = "10.0.0.1:6379"\nnode_ip_address = "10.0.0.2"\n'
                 'num_gpus = 8\nenv = { NCCL_SOCKET_IFNAME = "eth0" }\n'
                 'extra_args = ["--object-store-memory=2000000000"]')
    code, out, err = run(capsys, path)
    assert code == 0 and err == ""
    section = out[out.index("[ray]"):]
    assert section.startswith("[ray] (agent.role = 'worker'")
    assert "  head_address = '10.0.0.1:6379'" in section and "  num_gpus = 8" in section
    argv = next(line for line in section.splitlines() if line.startswith("  argv: "))
    assert argv.endswith("start --block --disable-usage-stats --address 10.0.0.1:6379 --node-ip-address 10.0.0.2 "
                         "--num-gpus 8 --object-store-memory=2000000000")
    assert "  env:  NCCL_SOCKET_IFNAME=eth0" in section
    assert "a Ray worker runs no vLLM" in out


def test_head_prints_dashboard_on_loopback(tmp_path, capsys):
    code, out, _ = run(capsys, write(tmp_path, 'role = "head"', "port = 6380\ndashboard_port = 8266"))
    assert code == 0
    argv = next(line for line in out.splitlines() if line.startswith("  argv: "))
    assert "--head --port 6380 --include-dashboard true --dashboard-host 127.0.0.1 --dashboard-port 8266" in argv
    code, out, _ = run(capsys, write(tmp_path, 'role = "head"'), "--json")
    assert json.loads(out)["ray"]["dashboard_port"] == 8265


def test_single_node_prints_no_ray_section(tmp_path, capsys):
    code, out, _ = run(capsys, write(tmp_path, ""))
    assert code == 0 and "[ray]" not in out and "argv: " not in out
    assert "(no profiles: the agent will sample the node but serve nothing)" in out
