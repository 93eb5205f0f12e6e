#!/usr/bin/env python3
"""Per-call cost of the tracer on the fake driver (no GPU): audit_prog bench N WORK makes N
cuMemGetInfo_v2 calls through direct binding, each followed by WORK iterations of a busy loop
standing in for the program's own work, and prints ns per call. Runs each configuration 5
times, alternating untraced and traced runs, and prints medians and the differences.

Two regimes, the calling thread formatting and writing each record either way:
- back to back (WORK=0): the tracer's throughput bound.
- with work between calls (WORK=2000, about a microsecond or more, like a framework's
  launches).

Usage: bench_audit.py AUDIT_LIB PROG FAKE_DIR CUDART_DIR [N]
"""
import os
import statistics
import subprocess
import sys
import tempfile

AUDIT, PROG, FAKE_DIR, CUDART_DIR = sys.argv[1:5]
N = int(sys.argv[5]) if len(sys.argv) > 5 else 1000000
RUNS = 5


def once(work, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESHIM_")}
    env["LD_LIBRARY_PATH"] = FAKE_DIR + ":" + CUDART_DIR
    env.update(extra)
    out = subprocess.run([PROG, "bench", str(N), str(work)], env=env, check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return float(out.split()[-1])


with tempfile.TemporaryDirectory() as d:
    k = [0]

    def traced(fmt, filt="all"):
        k[0] += 1
        return {"LD_AUDIT": AUDIT, "CACHESHIM_TRACE_FILTER": filt, "CACHESHIM_TRACE_FORMAT": fmt,
                "CACHESHIM_TRACE_FILE": os.path.join(d, f"{fmt}-{k[0]}-%p")}

    for work in (0, 2000):
        configs = [("no tracer", lambda: {})]
        configs += [(f"traced, {f}", lambda f=f: traced(f)) for f in ("text", "jsonl", "perfetto")]
        configs += [("LD_AUDIT, call filtered out", lambda: traced("jsonl", "cuMemAlloc*"))]
        times = {name: [] for name, _ in configs}
        for _ in range(RUNS):
            for name, env in configs:
                times[name].append(once(work, env()))
        base = statistics.median(times["no tracer"])
        label = "back to back" if work == 0 else f"{work} loop iterations of work between calls"
        print(f"{label} (median of {RUNS} x {N} calls):")
        for name, _ in configs:
            t = statistics.median(times[name])
            print(f"  {name:28s} {t:8.1f} ns per call, tracer cost {t - base:7.1f} ns")
