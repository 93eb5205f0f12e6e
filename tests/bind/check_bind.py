#!/usr/bin/env python3
"""The binding-time hooks on the fake driver: bind_prog loads bind_lib with RTLD_DEEPBIND or
dlmopen, and the library allocates directly or through cuGetProcAddress, under each way of
loading the cache.

Usage: check_bind.py CASE BACKEND PROG LIB FAKE_DIR SHIM LAUNCHER

CASE is LOAD-PATH-HOOKS (deepbind|dlmopen, direct|procaddr, preload|audit|both|run|trace),
or disabled, or fork, or keys, or nested, or debug, or exit, or twice. SHIM is libcacheshim.so, preloaded and as LD_AUDIT.
Exit 0 on success, 1 with a message on failure.
"""
import json
import os
import subprocess
import sys
import tempfile

CASE, BACKEND, PROG, LIB, FAKE_DIR, SHIM, LAUNCHER = sys.argv[1:8]
PAIRS = 1000


def fail(msg):
    print(f"FAIL {CASE} ({BACKEND}): {msg}", file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def env(**extra):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith("CACHESHIM_") and k not in ("LD_PRELOAD", "LD_AUDIT")}
    e["LD_LIBRARY_PATH"] = FAKE_DIR
    if BACKEND == "classic":
        e["CACHESHIM_BACKEND"] = "classic"
    e.update(extra)
    return e


def run(load, path, e, launcher=()):
    p = subprocess.run(list(launcher) + [PROG, load, path, LIB, str(PAIRS)], env=e,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    check(p.returncode == 0, f"exit {p.returncode}: {p.stderr}")
    fields = {}
    for line in p.stdout.splitlines():
        key, _, value = line.rpartition(" ")
        if line.startswith("stats:"):
            key, value = "stats", line[len("stats: "):]
        elif line.startswith("program keys:"):
            key, value = "program keys", line[len("program keys: "):]
        elif line.startswith("preloaded copy:"):
            key, value = "preloaded", line[len("preloaded copy: "):]
        fields[key] = value
    return fields, p.stderr


def served(f, out):
    # one driver allocation (pooled: one cuMemCreate of a granule), the rest cache hits
    check(f.get("driver allocations") == "1", f"not served from the cache: {out}")
    check(f.get("driver frees") == "0", f"frees reached the driver: {out}")


def main():
    if CASE == "disabled":
        # CACHESHIM_DISABLE=1: every binding is left alone, every call reaches the driver
        f, _ = run("deepbind", "procaddr",
                   env(LD_AUDIT=SHIM, CACHESHIM_DISABLE="1"))
        check(f.get("driver allocations") == str(PAIRS), f"disabled, yet cached: {f}")
        return
    if CASE == "keys":
        # the program's thread-specific keys (cudart and Python keep theirs so) keep their
        # values in both threads, and their destructors see them, while the cache, an audit
        # module with a libc of its own, keeps its per-thread state beside them
        for hooks in ({"LD_PRELOAD": SHIM}, {"LD_AUDIT": SHIM}, {"LD_AUDIT": SHIM, "LD_PRELOAD": SHIM}):
            f, _ = run("keys", "direct", env(**hooks))
            if "LD_AUDIT" in hooks:
                check(f.get("driver allocations") == "1", f"{hooks}: not served from the cache: {f}")
            check(f.get("program keys") == "16 intact, 0 overwritten, 8 destructors right, 0 wrong",
                  f"{hooks}: the program's keys: {f}")
        return
    if CASE == "nested":
        # the launcher run by a program it launched (a script that runs `cacheshim run`
        # again): LD_AUDIT names the cache twice, and two audit copies each took the other's
        # wrappers for the driver and recursed until the stack overflowed (SIGSEGV); the
        # second copy must stand down
        for inner in (("run", "--stats"), ("run", "--no-bind"), ("trace", "--cache")):
            with tempfile.TemporaryDirectory(prefix="cacheshim-bind-") as work:
                out = ("-o", os.path.join(work, "t.jsonl")) if inner[0] == "trace" else ()
                f, _ = run("deepbind", "direct", env(),
                           launcher=(LAUNCHER, "run", "--", LAUNCHER) + inner + out + ("--",))
            served(f, f)
            check(f.get("stats") == f"requests {PAIRS} hits {PAIRS - 1}", f"{inner}: {f}")
            check(f.get("preloaded") == "not entered", f"{inner}: wrapped twice: {f}")
        return
    if CASE == "debug":
        # CACHESHIM_DEBUG under the audit module (what `cacheshim run` loads by default): the
        # call sites are the shim's backtrace() from its own namespace; it aborted in libgcc_s
        # at the first allocation
        for hooks, launcher in (({"LD_AUDIT": SHIM}, ()), ({}, (LAUNCHER, "run", "--"))):
            f, err = run("deepbind", "direct", env(CACHESHIM_DEBUG="leaks", **hooks),
                         launcher=launcher)
            served(f, f)
            check("leaks: none" in err, f"{hooks or launcher}: no leak report: {err!r}")
        return
    if CASE == "twice":
        # LD_AUDIT names the cache twice (by hand): two copies took each other's wrappers
        # without end (a stack overflow); the second now stands down, the first serves
        f, err = run("deepbind", "direct", env(LD_AUDIT=f"{SHIM}:{SHIM}", CACHESHIM_STATS="1"))
        served(f, f)
        check(err.count("hit rate") == 1, f"one exit table expected: {err!r}")
        return
    if CASE == "exit":
        # CACHESHIM_DEBUG=uaf's exit check reads the quarantined blocks back, so it must run
        # at the program's exit(), before the exit handlers cudart registered earlier tear
        # the driver down: under the audit module it ran only when ld.so finished the shim
        for hooks in ({"LD_PRELOAD": SHIM}, {"LD_AUDIT": SHIM}):
            f, _ = run("exit", "direct", env(CACHESHIM_DEBUG="uaf", **hooks))
            n = f.get("synchronizes before the program's exit handler:")
            check(n is not None and int(n) >= 1, f"{hooks}: the exit check ran late: {f}")
        return
    if CASE == "fork":
        # the program's fork runs the cache's handlers under the audit module too: the
        # child's cache starts empty, so its one allocation takes memory from the driver
        for hooks in ({"LD_PRELOAD": SHIM}, {"LD_AUDIT": SHIM}):
            f, _ = run("fork", "direct", env(**hooks))
            served(f, f)
            check(f.get("child driver allocations") == "2", f"{hooks}: the child {f}")
        return
    load, path, hooks = CASE.split("-")
    if hooks == "preload":
        # the hole the hooks close: the preload alone never sees these calls (deep binding
        # finds libcuda first; a dlmopen'ed library calls its own copy of libcuda)
        f, _ = run(load, path, env(LD_PRELOAD=SHIM))
        expect = str(PAIRS) if load == "deepbind" else "0"
        check(f.get("driver allocations") == expect, f"preload alone: {f}")
        check(f.get("stats") == "requests 0 hits 0", f"preload alone: {f}")
    elif hooks == "audit":
        f, _ = run(load, path, env(LD_AUDIT=SHIM))
        served(f, f)
        check(f.get("stats") == "not loaded", f"the API without the preload: {f}")
    elif hooks == "both":
        # preloaded and audit module: one cache, the preloaded copy never entered
        f, err = run(load, path, env(LD_AUDIT=SHIM, LD_PRELOAD=SHIM, CACHESHIM_STATS="1"))
        served(f, f)
        check(f.get("stats") == f"requests {PAIRS} hits {PAIRS - 1}", f"one cache: {f}")
        check(f.get("preloaded") == "not entered", f"wrapped twice: {f}")
        check(err.count("hit rate") == 1, f"one exit table expected: {err!r}")
    elif hooks == "run":
        f, err = run(load, path, env(), launcher=(LAUNCHER, "run", "--stats"))
        served(f, f)
        check(f.get("stats") == f"requests {PAIRS} hits {PAIRS - 1}", f"one cache: {f}")
        check(f.get("preloaded") == "not entered", f"wrapped twice: {f}")
        check(err.count("hit rate") == 1, f"one exit table expected: {err!r}")
    elif hooks == "trace":
        # tracer and cache as two audit modules: the library's calls reach the shim, the
        # shim's reach the driver, each seen once
        with tempfile.TemporaryDirectory(prefix="cacheshim-bind-") as work:
            trace = os.path.join(work, "t.jsonl")
            f, _ = run(load, path, env(), launcher=(LAUNCHER, "trace", "--cache", "-o", trace))
            served(f, f)
            with open(trace) as t:
                ev = [json.loads(line) for line in t]
        n = lambda name, lib, frm: sum(e["name"] == name and e["lib"] == lib and
                                       e["from"] == frm for e in ev)
        driver_alloc = "cuMemAlloc_v2" if BACKEND == "classic" else "cuMemCreate"
        got = (n("cuMemAlloc_v2", "shim", "app"), n("cuMemFree_v2", "shim", "app"),
               n(driver_alloc, "driver", "shim"), n("cuMemAlloc_v2", "driver", "app"))
        check(got == (PAIRS, PAIRS, 1, 0),
              f"(allocs, frees) at the shim, allocs at the driver from it and from the "
              f"program: {got}")
    else:
        fail("unknown case")


main()
