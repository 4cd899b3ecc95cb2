"""What a tick's XID poll costs on a real driver: `nvmlEventSetWait_v2(set, 0)` with every GPU registered for XID
critical errors (the sampler's poll, agent/gpu/xid.py), called through ctypes so it runs wherever
libnvidia-ml.so.1 loads (no pynvml needed). Checks that a zero timeout answers TIMEOUT at once when nothing is
queued, and times it (wall and this thread's CPU per call) beside a 500 ms-timeout wait's CPU (the old thread's).
Last line: one JSON object.
Usage: python benchmarks/nvml_xid_poll.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time

NVML_ERROR_TIMEOUT = 10
XID_CRITICAL = 0x0000000000000008  # nvmlEventTypeXidCriticalError


class EventData(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong), ("eventData", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    assert lib.nvmlInit_v2() == 0
    count = ctypes.c_uint()
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
    es = ctypes.c_void_p()
    assert lib.nvmlEventSetCreate(ctypes.byref(es)) == 0
    registered = []
    for i in range(count.value):
        h = ctypes.c_void_p()
        assert lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
        rc = lib.nvmlDeviceRegisterEvents(h, ctypes.c_ulonglong(XID_CRITICAL), es)
        registered.append(rc)
    data = EventData()
    wait = lib.nvmlEventSetWait_v2
    codes: dict[int, int] = {}
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(args.calls):
        rc = wait(es, ctypes.byref(data), 0)
        codes[rc] = codes.get(rc, 0) + 1
    w1, c1 = time.perf_counter(), time.thread_time()
    # the old thread's wait: 500 ms each, nothing queued (CPU of the waits themselves)
    n_block = 4
    b0, bc0 = time.perf_counter(), time.thread_time()
    block_codes = [wait(es, ctypes.byref(data), 500) for _ in range(n_block)]
    b1, bc1 = time.perf_counter(), time.thread_time()
    lib.nvmlEventSetFree(es)
    lib.nvmlShutdown()
    out = {"gpus": count.value, "register_rc": registered, "calls": args.calls,
           "poll_codes": {str(k): v for k, v in codes.items()},
           "poll_wall_us": round(1e6 * (w1 - w0) / args.calls, 2),
           "poll_cpu_us": round(1e6 * (c1 - c0) / args.calls, 2),
           "wait500_codes": block_codes, "wait500_wall_ms": round(1e3 * (b1 - b0) / n_block, 1),
           "wait500_cpu_us": round(1e6 * (bc1 - bc0) / n_block, 1)}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
