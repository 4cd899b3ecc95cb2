#!/usr/bin/env python3
"""A tiny stand-in for `vllm serve` used by the supervisor tests (stdlib only, starts in milliseconds).

It has the shape that matters to the supervisor: milestone log lines, a closed port while "loading", then
/health, /version and /metrics, and an engine child process in the same process group that survives a
SIGKILL of the server. Behaviour comes from STANDIN_* environment variables.
"""

import ctypes
import http.server
import os
import signal
import sys
import threading
import time


def engine() -> None:
    try:
        ctypes.CDLL(None).prctl(15, b"VLLM::EngineCor", 0, 0, 0)  # PR_SET_NAME, like setproctitle
    except Exception:
        pass
    while True:
        time.sleep(1)


def main() -> None:
    if sys.argv[1:2] == ["--engine"]:
        engine()
        return
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    startup = float(os.environ.get("STANDIN_STARTUP_S", "0.2"))
    mode = os.environ.get("STANDIN_MODE", "ok")
    print(f"INFO standin: serve {args[1] if len(args) > 1 else '?'} argv={args}", flush=True)
    import subprocess

    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--engine"])
    print(f"INFO standin: engine pid {child.pid}", flush=True)
    if mode == "fail_start":
        time.sleep(startup / 2)
        print("ERROR standin: CUDA out of memory (simulated start-up failure)", flush=True)
        sys.exit(1)
    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, lambda *a: print("INFO standin: ignoring SIGTERM", flush=True))
    else:
        signal.signal(signal.SIGTERM, lambda *a: (child.terminate(), sys.exit(0)))
    time.sleep(startup / 4)
    print("INFO Loading weights took 0.05 seconds", flush=True)
    time.sleep(startup / 4)
    print("INFO Available KV cache memory: 10.0 GiB", flush=True)
    time.sleep(startup / 4)
    print("INFO Graph capturing finished in 1 secs", flush=True)
    time.sleep(startup / 4)
    print(f"INFO Starting vLLM API server 0 on http://127.0.0.1:{port}", flush=True)
    state = {"gen": 0.0}
    running = 3 if mode == "hang" else 0

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def do_GET(self):
            if self.path == "/health":
                body, ctype = b"", "text/plain"
            elif self.path == "/version":
                body, ctype = b'{"version": "0.0.0-standin"}', "application/json"
            elif self.path == "/metrics":
                if mode != "hang":
                    state["gen"] += 5
                body = (f"vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} {running}\n"
                        f"vllm:generation_tokens_total{{engine=\"0\",model_name=\"m\"}} {state['gen']}\n").encode()
                ctype = "text/plain"
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    print("INFO Application startup complete.", flush=True)
    exit_after = float(os.environ.get("STANDIN_EXIT0_AFTER_S", "0"))
    if exit_after:
        threading.Timer(exit_after, lambda: (print("ERROR engine died", flush=True), os._exit(0))).start()
    srv.serve_forever()


if __name__ == "__main__":
    main()
