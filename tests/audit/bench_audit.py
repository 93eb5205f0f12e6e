#!/usr/bin/env python3
"""Per-call cost of the tracer on the fake driver (no GPU). `audit_prog bench KIND N WORK`
makes N driver calls of one kind, the cheap ones a framework makes around each kernel (see
audit_prog.c), through direct binding, and prints ns per call of wall time and of the
calling thread's CPU time; this takes the latter, which other jobs on the machine disturb
less (the tracer's helper thread is not in it: at these rates it needs as much CPU as the
program's thread back to back, see docs/performance.md). Each configuration runs RUNS
times, untraced and traced runs in turn; the medians are printed with the tracer's cost per
call (traced minus untraced), in a markdown table per regime:

- back to back (WORK=0): the tracer's throughput bound, everything in the nearest caches.
- cold (WORK=cold): a few microseconds of code and data between calls, enough that the
  tracer's code, tables and branch history have left the nearest caches by the next call,
  as between a real framework's calls (PyTorch: about 2 us a driver call).

Usage: bench_audit.py AUDIT_LIB PROG FAKE_DIR CUDART_DIR [RUNS]
Environment: AUDIT_BEFORE (another build of the library, to compare: its columns are
added, the runs interleaved with the others), KINDS (default "mix launch ctx record
alloc"), N (calls a run, back to back; a twentieth of it cold; default 400000).
"""
import os
import statistics
import subprocess
import sys
import tempfile

AUDIT, PROG, FAKE_DIR, CUDART_DIR = sys.argv[1:5]
RUNS = int(sys.argv[5]) if len(sys.argv) > 5 else 5
KINDS = os.environ.get("KINDS", "mix launch ctx record alloc").split()
N = int(os.environ.get("N", "400000"))
FORMATS = ("text", "jsonl", "perfetto")


def once(kind, n, work, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESHIM_")}
    env["LD_LIBRARY_PATH"] = FAKE_DIR + ":" + CUDART_DIR
    env.update(extra)
    out = subprocess.run([PROG, "bench", kind, str(n), work], env=env, check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return float(out.split()[1])


with tempfile.TemporaryDirectory() as d:
    k = [0]

    def traced(fmt, filt="all", lib=AUDIT):
        k[0] += 1
        return {"LD_AUDIT": lib, "CACHESHIM_TRACE_FILTER": filt, "CACHESHIM_TRACE_FORMAT": fmt,
                "CACHESHIM_TRACE_FILE": os.path.join(d, f"{fmt}-{k[0]}-%p")}

    configs = [("untraced", lambda: {})]
    if os.environ.get("AUDIT_BEFORE"):
        configs += [(f"before, {f}", lambda f=f: traced(f, lib=os.environ["AUDIT_BEFORE"]))
                    for f in FORMATS]
    configs += [(f"traced, {f}", lambda f=f: traced(f)) for f in FORMATS]
    configs += [("LD_AUDIT, filtered out", lambda: traced("jsonl", "cuMemHost*"))]
    for work, n in (("0", N), ("cold", N // 20)):
        label = "back to back" if work == "0" else "cold (work between calls)"
        print(f"{label}: ns of the calling thread's CPU time per call, "
              f"median of {RUNS} runs of {n} calls; "
              "in brackets the tracer's cost (traced minus untraced)\n")
        print("| calls | " + " | ".join(name for name, _ in configs) + " |")
        print("| --- " * (len(configs) + 1) + "|")
        for kind in KINDS:
            times = {name: [] for name, _ in configs}
            for _ in range(RUNS):
                for name, env in configs:
                    times[name].append(once(kind, n, work, env()))
                    for f in os.listdir(d):  # the traces are not kept: a run's page cache
                        os.unlink(os.path.join(d, f))
            base = statistics.median(times["untraced"])
            cells = [f"{base:.1f}"]
            for name, _ in configs[1:]:
                t = statistics.median(times[name])
                cells.append(f"{t:.1f} (+{t - base:.1f})")
            print(f"| {kind} | " + " | ".join(cells) + " |", flush=True)
        print()
