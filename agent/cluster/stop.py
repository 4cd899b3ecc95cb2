"""`lynxtop stop --cluster`, the part that runs inside Ray: ask each worker node's agent to stop its Ray.

Run by the head's agent as a script with the Python that has Ray (`python cluster_stop.py ADDRESS REASON`); it
imports nothing of lynxtop, so it runs in whichever environment Ray lives in. It joins the cluster as a driver,
runs one task pinned to each other alive node, and that task calls the node's agent on its control socket
(`POST /v1/ray/stop`): Ray's processes inherit LYNXTOP_SOCKET from the agent that started them. Ray carries the
request, so no lynxtop traffic crosses the network. The last line printed is JSON: one answer per node.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys

ASK_TIMEOUT_S = 60.0


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def ask_local_agent(reason: str) -> dict:
    """On a worker node, inside a Ray task: POST /v1/ray/stop to the agent that started this node's Ray."""
    path = os.environ.get("LYNXTOP_SOCKET")
    if not path:
        return {"ok": False, "message": "no lynxtop agent started Ray on this node (no LYNXTOP_SOCKET)"}
    conn = _UnixHTTPConnection(path, 10.0)
    try:
        conn.request("POST", "/v1/ray/stop", body=json.dumps({"reason": reason}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = json.loads(resp.read() or b"{}")
    except (OSError, ValueError) as exc:
        return {"ok": False, "message": f"the agent on {path} did not answer: {exc}"}
    finally:
        conn.close()
    return {"ok": resp.status == 202, "message": body.get("message") or body.get("error") or ""}


def main(argv: list[str]) -> int:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    address, reason = argv[1], argv[2]
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
    here = ray.get_runtime_context().get_node_id()
    task = ray.remote(num_cpus=0, max_retries=0)(ask_local_agent)
    asked = {}
    for node in ray.nodes():
        if node.get("Alive") and node["NodeID"] != here:
            strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            asked[node["NodeManagerAddress"]] = task.options(scheduling_strategy=strategy).remote(reason)
    answers = []
    for ip, ref in asked.items():
        try:
            answer = ray.get(ref, timeout=ASK_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - one node's failure is reported, the others still stop
            answer = {"ok": False, "message": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        answers.append(answer | {"ip": ip})
    ray.shutdown()
    print(json.dumps({"nodes": answers}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
