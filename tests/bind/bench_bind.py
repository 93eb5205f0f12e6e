#!/usr/bin/env python3
"""What a cache-hit allocate+free pair costs through each way of loading the cache, on the
fake driver (no GPU): bind_prog has bind_lib make N 1 MiB cuMemAlloc/cuMemFree pairs, every
one a cache hit but the first, and prints ns per pair. Runs each configuration RUNS times,
alternating, and prints the medians (min-max) as a markdown table for docs/usage.md, with
the instructions one pair costs, counted by valgrind's callgrind inside the library's loop
(bind_lib_run; the run with 2 x CG_N pairs minus the run with CG_N, so setup cancels out):
exact where timings on a loaded machine are not.

Through the preload the calls reach the preloaded shim's functions; through the audit
module, the wrappers that ld.so wrote into the library's GOT at binding time (or that
cuGetProcAddress handed out). Both are the same wrappers, called once per call: the
difference should be noise.

Usage: bench_bind.py PROG LIB FAKE_DIR SHIM [N] [RUNS]
"""
import os
import re
import shutil
import statistics
import subprocess
import sys

PROG, LIB, FAKE_DIR, SHIM = sys.argv[1:5]
N = int(sys.argv[5]) if len(sys.argv) > 5 else 1000000
RUNS = int(sys.argv[6]) if len(sys.argv) > 6 else 7
CG_N = 20000


def environment(extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CACHESHIM_") and k not in ("LD_PRELOAD", "LD_AUDIT")}
    env["LD_LIBRARY_PATH"] = FAKE_DIR
    env.update(extra)
    return env


def instructions(load, path, extra, n):
    p = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                        "--toggle-collect=bind_lib_run", PROG, load, path, LIB, str(n)],
                       env=environment(extra), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True).stderr
    return int(re.search(r"^==\d+== Collected : (\d+)$", p, re.M).group(1))


def once(load, path, extra):
    out = subprocess.run([PROG, load, path, LIB, str(N)], env=environment(extra), check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    fields = dict(line.rsplit(" ", 1) for line in out.splitlines() if " " in line)
    if fields.get("driver allocations") != "1":
        sys.exit(f"bench_bind: {load} {path} {extra} was not served from the cache:\n{out}")
    return float(fields["ns per pair"])


configs = []
for path in ("direct", "procaddr"):
    configs += [(f"plain dlopen, {path}", "plain", path, "LD_PRELOAD", {"LD_PRELOAD": SHIM}),
                (f"plain dlopen, {path}", "plain", path, "LD_AUDIT", {"LD_AUDIT": SHIM}),
                (f"RTLD_DEEPBIND, {path}", "deepbind", path, "LD_AUDIT",
                 {"LD_AUDIT": SHIM}),
                (f"dlmopen, {path}", "dlmopen", path, "LD_AUDIT", {"LD_AUDIT": SHIM})]
times = {i: [] for i in range(len(configs))}
for _ in range(RUNS):
    for i, (_, load, path, _, env) in enumerate(configs):
        times[i].append(once(load, path, env))

have_valgrind = shutil.which("valgrind") is not None
if not have_valgrind:
    print("bench_bind: valgrind not found: no instruction counts", file=sys.stderr)
with open("/proc/loadavg") as f:
    load_avg = " ".join(f.read().split()[:3])
print(f"bench_bind: {N} pairs a run, {RUNS} runs, median (min-max) ns per cache-hit pair; "
      f"load {load_avg}")
print("| library loaded with, path | cache loaded by | ns per pair | instructions per pair |")
print("| --- | --- | ---: | ---: |")
for i, (name, load, path, mode, env) in enumerate(configs):
    t = times[i]
    ins = "-"
    if have_valgrind:
        ins = str((instructions(load, path, env, 2 * CG_N) -
                   instructions(load, path, env, CG_N)) // CG_N)
    print(f"| {name} | {mode} | {statistics.median(t):.1f} ({min(t):.1f}-{max(t):.1f}) | "
          f"{ins} |")
