#!/usr/bin/env python3
"""A tiny stand-in for `vllm serve` used by the supervisor tests (stdlib only, starts in milliseconds).

It has the shape that matters to the supervisor: milestone log lines, a closed port while "loading", then
/health, /version and /metrics, and an engine child process in the same process group that survives a
SIGKILL of the server. Behaviour comes from STANDIN_* environment variables:
STANDIN_MODE (ok, fail_start, ignore_term, hang, drain), STANDIN_STARTUP_S, STANDIN_EXIT0_AFTER_S,
STANDIN_SIGLOG (file: signals received, in order), STANDIN_DRAIN_S, STANDIN_SHM (engine maps a /dev/shm/psm_*
segment and starts a multiprocessing resource tracker), STANDIN_DIST (a vllm_dist_* file named in the log),
STANDIN_ENGINE_IGNORE_TERM (the engine needs SIGKILL).
"""

import ctypes
import http.server
import os
import signal
import sys
import threading
import time


def siglog(line: str) -> None:
    """One line to STANDIN_SIGLOG (O_APPEND: lines of the server and its engine keep their order)."""
    path = os.environ.get("STANDIN_SIGLOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, f"{time.monotonic():.6f} {line}\n".encode())
        finally:
            os.close(fd)


def engine() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # taken with sigwaitinfo: who sent it
    try:
        ctypes.CDLL(None).prctl(15, b"VLLM::EngineCor", 0, 0, 0)  # PR_SET_NAME, like setproctitle
    except Exception:
        pass
    shm = None
    if os.environ.get("STANDIN_SHM"):
        # like vLLM's shm_broadcast: a segment mapped while serving, removed by nobody after a SIGKILL;
        # unregistered so that the resource tracker (started here, as in vLLM) does not clean it up either
        from multiprocessing import resource_tracker, shared_memory

        shm = shared_memory.SharedMemory(create=True, size=1 << 16)
        shm.buf[0] = 1
        resource_tracker.unregister(shm._name, "shared_memory")
        print(f"INFO standin: engine shm /dev/shm/{shm.name}", flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # starting the tracker unblocked it
    ready_fd = int(os.environ.get("STANDIN_READY_FD", "-1"))
    if ready_fd >= 0:  # the handshake: set up (segment mapped, tracker running) before the API server serves
        os.write(ready_fd, b"1")
        os.close(ready_fd)
    while True:
        info = signal.sigwaitinfo({signal.SIGTERM})
        siglog(f"engine {os.getpid()} SIGTERM from {info.si_pid}")
        if not os.environ.get("STANDIN_ENGINE_IGNORE_TERM"):
            os._exit(0)  # no clean-up, like a process killed mid-work


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

    ready_r, ready_w = os.pipe()
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--engine"], pass_fds=(ready_w,),
                             env={**os.environ, "STANDIN_READY_FD": str(ready_w)})
    os.close(ready_w)
    print(f"INFO standin: engine pid {child.pid}", flush=True)
    if os.environ.get("STANDIN_DIST"):  # vLLM's torch.distributed rendezvous file, named in the log
        import tempfile
        import uuid

        dist = os.path.join(tempfile.gettempdir(), f"vllm_dist_{uuid.uuid4().hex}")
        open(dist, "w").close()
        print(f"(Worker pid={child.pid}) INFO standin [parallel_state.py] world_size=1 rank=0 local_rank=0 "
              f"distributed_init_method=file://{dist} backend=gloo", flush=True)
    if mode == "fail_start":
        time.sleep(startup / 2)
        print("ERROR standin: CUDA out of memory (simulated start-up failure)", flush=True)
        sys.exit(1)
    def drain(*_):
        # a draining API server that exits 0 and leaves its engine behind (the agent must stop it)
        siglog(f"leader {os.getpid()} SIGTERM")
        time.sleep(float(os.environ.get("STANDIN_DRAIN_S", "0.5")))
        siglog(f"leader {os.getpid()} exit")
        os._exit(0)

    def stop_engine_and_exit(*_):  # what vLLM does on SIGTERM: stop its engine, then exit
        child.terminate()
        child.wait()
        sys.exit(0)

    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, lambda *a: print("INFO standin: ignoring SIGTERM", flush=True))
    elif mode == "drain":
        signal.signal(signal.SIGTERM, drain)
    else:
        signal.signal(signal.SIGTERM, stop_engine_and_exit)
    time.sleep(startup / 4)
    print("INFO Loading weights took 0.05 seconds", flush=True)
    time.sleep(startup / 4)
    print("INFO Available KV cache memory: 10.0 GiB", flush=True)
    time.sleep(startup / 4)
    print("INFO Graph capturing finished in 1 secs", flush=True)
    time.sleep(startup / 4)
    # like vLLM's API server, which serves only after its EngineCore's handshake: on a loaded machine the engine's
    # set-up (its shm segment, the resource tracker) could otherwise come after readiness
    os.read(ready_r, 1)
    os.close(ready_r)
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
