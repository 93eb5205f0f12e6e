#!/usr/bin/env python3
"""Per-call cost of the tracer on the fake driver (no GPU): audit_prog bench N makes N
cuMemGetInfo_v2 calls through direct binding and prints ns per call. Runs it 5 times
without LD_AUDIT and 5 times with LD_AUDIT=libcacheaudit.so (every call traced, JSON Lines
and text to a file), and prints the medians and the difference: the tracer's cost per call.

Usage: bench_audit.py AUDIT_LIB PROG FAKE_DIR CUDART_DIR [N]
"""
import os
import statistics
import subprocess
import sys
import tempfile

AUDIT, PROG, FAKE_DIR, CUDART_DIR = sys.argv[1:5]
N = int(sys.argv[5]) if len(sys.argv) > 5 else 2000000
RUNS = 5


def once(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESHIM_")}
    env["LD_LIBRARY_PATH"] = FAKE_DIR + ":" + CUDART_DIR
    env.update(extra)
    out = subprocess.run([PROG, "bench", str(N)], env=env, check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return float(out.split()[-1])


def median(extra):
    return statistics.median(once(extra) for _ in range(RUNS))


with tempfile.TemporaryDirectory() as d:
    base = median({})
    print(f"no tracer:            {base:8.1f} ns per call (median of {RUNS} x {N} calls)")
    for fmt in ("text", "jsonl", "perfetto"):
        i = [0]

        def traced():
            i[0] += 1
            return {"LD_AUDIT": AUDIT, "CACHESHIM_TRACE_FILTER": "all",
                    "CACHESHIM_TRACE_FORMAT": fmt,
                    "CACHESHIM_TRACE_FILE": os.path.join(d, f"{fmt}-{i[0]}-%p")}

        t = statistics.median(once(traced()) for _ in range(RUNS))
        print(f"traced, {fmt:9s}:     {t:8.1f} ns per call, tracer cost {t - base:7.1f} ns")
    filtered = median({"LD_AUDIT": AUDIT, "CACHESHIM_TRACE_FILTER": "cuMemAlloc*"})
    print(f"LD_AUDIT, call filtered out: {filtered:8.1f} ns per call "
          f"(cost {filtered - base:.1f} ns: the binding is left alone)")
