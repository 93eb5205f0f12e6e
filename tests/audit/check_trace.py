#!/usr/bin/env python3
"""Integration tests of the tracer: run tests/audit/audit_prog under
LD_AUDIT=libcacheaudit.so on the fake driver and check the trace it writes.

Usage: check_trace.py CASE AUDIT_LIB PROG FAKE_DIR CUDART_DIR SHIM_LIB

Each CASE runs the program (in a fresh temporary directory) with its own CACHESHIM_TRACE_*
variables, parses what it wrote (json for JSON Lines and Perfetto, a regular expression for
text) and checks exact event counts. Exit 0 on success, 1 with a message on failure, 77
(meson's "skipped") when the tracer cannot be loaded in this build (see SKIP below).
"""
import json
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import tempfile
import time

CASE, AUDIT, PROG, FAKE_DIR, CUDART_DIR, SHIM = sys.argv[1:7]
# The launcher, for `cacheshim finish` (tests/audit/meson.build sets it).
LAUNCHER = os.environ.get("CACHESHIM_TEST_LAUNCHER", "")
WORK = tempfile.mkdtemp(prefix="cacheaudit-")
MiB = 1 << 20
# The cases that load the cache also run as CASE-classic, with CACHESHIM_BACKEND=classic: the
# shim then takes memory with cuMemAlloc_v2, pooled (the default) with cuMemCreate.
CLASSIC = CASE.endswith("-classic")
DRIVER_ALLOC = "cuMemAlloc_v2" if CLASSIC else "cuMemCreate"


def fail(msg):
    print(f"FAIL {CASE}: {msg}", file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def run(scenario, expect_rc=0, preload=None, args=(), preexec=None, stderr=subprocess.PIPE,
        audit=None, **env_vars):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("CACHESHIM_"):
            del env[k]
    env["LD_AUDIT"] = audit or AUDIT
    env["LD_LIBRARY_PATH"] = FAKE_DIR + ":" + CUDART_DIR
    # ThreadSanitizer's runtime needs static TLS, and the audit namespace (its own libc)
    # takes much of the surplus ld.so keeps: without more, a TSan-built program under
    # LD_AUDIT fails to start ("cannot allocate memory in static TLS block").
    env.setdefault("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=16777216")
    if preload:
        env["LD_PRELOAD"] = preload
        if CLASSIC:
            env["CACHESHIM_BACKEND"] = "classic"
        # verify_asan_link_order: the shim is preloaded ahead of the ASan runtime, as in
        # tests/meson.build. detect_leaks=0: LeakSanitizer's stop-the-world tracer crashes
        # (SIGSEGV at exit) when an ASan-built libcacheshim is preloaded together with
        # LD_AUDIT; the shim's leaks are checked by its own tests, without LD_AUDIT.
        env["ASAN_OPTIONS"] = "verify_asan_link_order=0:detect_leaks=0"
    env.update(env_vars)
    p = subprocess.run([PROG, scenario, *args], env=env, cwd=WORK, stdout=subprocess.PIPE,
                       stderr=stderr, text=True, timeout=120, preexec_fn=preexec)
    if p.returncode != expect_rc:
        fail(f"{scenario}: exit {p.returncode}, expected {expect_rc}\n{(p.stderr or '')[-3000:]}")
    return p


def jsonl(text):
    """Every line must be one JSON object (parsed by json, not matched)."""
    events = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.startswith("{"):
            continue  # the program's own stderr lines
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as e:
            fail(f"line {n} is not JSON ({e}): {line[:200]}")
    return events


def chrome(text):
    """A finished Chrome trace: strict JSON, the array form of the Trace Event Format."""
    doc = json.loads(text)
    check(isinstance(doc, list), f"a Chrome trace of the object form: {str(doc)[:200]}")
    return doc


def count(events, **want):
    return sum(all(e.get(k) == v for k, v in want.items()) for e in events)


def trace_file(name="trace.%p"):
    return os.path.join(WORK, name)


def only_file():
    files = [f for f in os.listdir(WORK)]
    check(len(files) == 1, f"expected one trace file, found {files}")
    return os.path.join(WORK, files[0])


def read(path):
    with open(path) as f:
        return f.read()


# ---------------------------------------------------------------- paths

def case_path_direct():
    p = run("direct", CACHESHIM_TRACE_FORMAT="jsonl")
    ev = jsonl(p.stderr)
    allocs = [e for e in ev if e["name"] == "cuMemAlloc_v2"]
    check(len(allocs) == 3, f"{len(allocs)} cuMemAlloc_v2 events, expected 3")
    check(count(ev, name="cuMemFree_v2") == 4, "expected 4 cuMemFree_v2 (one failing)")
    check(count(ev, name="cuMemGetInfo_v2") == 1, "expected 1 cuMemGetInfo_v2")
    check(sorted(a["args"]["bytesize"] for a in allocs) == [4096, 70 * 1024, MiB],
          "allocation sizes")
    for a in allocs:
        check(a["lib"] == "driver" and a["from"] == "app", f"labels {a}")
        check(a["result"] == 0 and a["result_name"] == "CUDA_SUCCESS", f"result {a}")
        check(re.fullmatch(r"0x[0-9a-f]+", a["out"]["dptr"]) and a["out"]["dptr"] != "0x0",
              f"out-parameter {a}")
        check(a["dur_ns"] >= 0 and a["ts_ns"] >= 0 and a["tid"] > 0, f"times {a}")
    bad = [e for e in ev if e["name"] == "cuMemFree_v2" and e["result"] != 0]
    check(len(bad) == 1 and bad[0]["args"]["dptr"] == "0x1234", "the failing free")
    check(bad[0]["result_name"].startswith("CUDA_ERROR_"), "error name")
    info = [e for e in ev if e["name"] == "cuMemGetInfo_v2"][0]
    check(info["out"]["total"] > 0 and info["out"]["free"] <= info["out"]["total"], "out sizes")
    check(not any(e["name"].startswith("cuInit") for e in ev), "memory filter let cuInit in")


def case_path_dlsym():
    p = run("dlsym", CACHESHIM_TRACE_FORMAT="jsonl")
    ev = jsonl(p.stderr)
    check(count(ev, name="cuMemAlloc_v2", lib="driver") == 2, "2 allocations via dlsym")
    check(count(ev, name="cuMemFree_v2", lib="driver") == 2, "2 frees via dlsym")


def case_path_procaddr():
    p = run("procaddr", CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILTER="all")
    ev = jsonl(p.stderr)
    gpa2 = [e for e in ev if e["name"] == "cuGetProcAddress_v2"]
    # 1 through dlsym, 3 through the pointer it returned for "cuGetProcAddress"
    check(len(gpa2) == 4, f"{len(gpa2)} cuGetProcAddress_v2 events, expected 4")
    check(count(ev, name="cuGetProcAddress") == 1, "the v1 cuGetProcAddress")
    # the driver's versioning: cuMemAlloc at 12000 is cuMemAlloc_v2, at 3000 cuMemAlloc
    check(count(ev, name="cuMemAlloc_v2") == 2, "2 cuMemAlloc_v2 through the table")
    check(count(ev, name="cuMemFree_v2") == 2, "2 cuMemFree_v2 through the table")
    check(count(ev, name="cuMemAlloc") == 1, "the v1 cuMemAlloc through the table")
    check(count(ev, name="cuMemFree") == 0, "v1 cuMemFree was not called")
    asked = [e["args"]["symbol"] for e in gpa2]
    check(asked[0] == "0x" + asked[0][2:] and all(a.startswith("0x") for a in asked),
          "pointer arguments in hex")


def case_path_runtime():
    p = run("runtime", CACHESHIM_TRACE_FORMAT="jsonl")
    ev = jsonl(p.stderr)
    rt = [e for e in ev if e["lib"] == "runtime"]
    names = sorted(e["name"] for e in rt)
    check(names == sorted(["cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync",
                           "cudaMallocHost", "cudaFreeHost", "cudaMemGetInfo"]),
          f"runtime events {names}")
    check(all(e["result"] == 0 and e["result_name"] == "cudaSuccess" for e in rt), "results")
    m = [e for e in rt if e["name"] == "cudaMalloc"][0]
    check(m["args"]["size"] == MiB and m["out"]["devPtr"] != "0x0", f"cudaMalloc {m}")
    # what cudart asked of the driver, labelled as coming from cudart
    check(count(ev, name="cuMemAlloc_v2", lib="driver", **{"from": "cudart"}) == 2,
          "cudart's cuMemAlloc_v2 calls")
    check(count(ev, name="cuMemFree_v2", lib="driver", **{"from": "cudart"}) == 2,
          "cudart's cuMemFree_v2 calls")


def case_shim():
    p = run("shim", preload=SHIM, CACHESHIM_TRACE_FORMAT="jsonl")
    ev = jsonl(p.stderr)
    asked = count(ev, name="cuMemAlloc_v2", lib="shim", **{"from": "app"})
    check(asked == 3, f"{asked} program allocations seen at the shim, expected 3")
    # 1 MiB, 4 KiB and 70 KiB: three blocks of different classes; pooled, all three are slots
    # of one granule's slabs
    driver = count(ev, name=DRIVER_ALLOC, lib="driver", **{"from": "shim"})
    check(driver == (3 if CLASSIC else 1), f"{driver} shim allocations seen at the driver")
    other = count(ev, name="cuMemCreate" if CLASSIC else "cuMemAlloc_v2", lib="driver")
    check(other == 0, f"{other} allocations of the other backend")
    check(count(ev, name="cuMemFree_v2", lib="shim") == 4, "program frees at the shim")


def case_shim_procaddr():
    """cudart's way with the cache loaded: dlsym reaches the shim's dlsym, which hands out
    the shim's cuGetProcAddress_v2; calls through it and through what it returns are the
    program's requests to the shim."""
    p = run("procaddr", preload=SHIM, CACHESHIM_TRACE_FORMAT="jsonl",
            CACHESHIM_TRACE_FILTER="all")
    ev = jsonl(p.stderr)
    check(count(ev, name="cuGetProcAddress_v2", lib="shim", **{"from": "app"}) == 4,
          "4 cuGetProcAddress_v2 asked of the shim")
    check(count(ev, name="cuMemAlloc_v2", lib="shim", **{"from": "app"}) == 2,
          "2 cuMemAlloc_v2 asked of the shim through the table")
    check(count(ev, name="cuMemFree_v2", lib="shim", **{"from": "app"}) == 2,
          "2 cuMemFree_v2 asked of the shim through the table")
    # 3 MiB, asked twice, is one block: classic, one cuMemAlloc_v2; pooled, its two granules
    # are two chunks of one granule each (cuMemCreate); the second request is a hit
    check(count(ev, name=DRIVER_ALLOC, lib="driver", **{"from": "shim"}) == (1 if CLASSIC else 2),
          "the shim's one block from the driver")
    check(count(ev, name="cuMemCreate" if CLASSIC else "cuMemAlloc_v2", lib="driver",
                **{"from": "shim"}) == 0, "the other backend's allocations")


# ---------------------------------------------------------------- formats

# ---------------------------------------------------------------- scopes (cacheshim.h)

# audit_prog scopes: the begins (name, flags) and ends (result) in order; one end has no scope.
SCOPE_NAMES = ["outer", "inner", "inner", 'odd "name"\t\u00e9???']
SCOPE_FLAGS = [0, 1, 1, 0]
SCOPE_ENDS = [0, 0, 0, -1, 0]
# The program's calls on its main thread: B(egin), E(nd), A(llocation), F(ree).
SCOPE_SEQUENCE = "BA" + "BAAFE" * 2 + "AE" + "E" + "BE" + "FFFF"


def case_scopes_jsonl():
    p = run("scopes", preload=SHIM, CACHESHIM_TRACE_FORMAT="jsonl")
    ev = jsonl(p.stderr)
    begins = [e for e in ev if e["name"] == "cacheshim_scope_begin"]
    ends = [e for e in ev if e["name"] == "cacheshim_scope_end"]
    check([e["args"]["name"] for e in begins] == SCOPE_NAMES, f"names {begins}")
    check([e["args"]["flags"] for e in begins] == SCOPE_FLAGS, f"flags {begins}")
    check([e["args"]["flags_decoded"] for e in begins] ==
          ["0", "CACHESHIM_SCOPE_RELEASE", "CACHESHIM_SCOPE_RELEASE", "0"], "flags decoded")
    check([e["result"] for e in ends] == SCOPE_ENDS, f"end results {ends}")
    check([e["args"]["size"] for e in ends] == [56, 56, 56, 0, 0], "end sizes")
    for e in begins + ends:
        check(e["lib"] == "shim" and e["from"] == "app" and e["result_name"] is None, f"{e}")
    main = begins[0]["tid"]
    letter = {"cacheshim_scope_begin": "B", "cacheshim_scope_end": "E", "cuMemAlloc_v2": "A",
              "cuMemFree_v2": "F"}
    seq = "".join(letter[e["name"]] for e in ev
                  if e["tid"] == main and e["lib"] == "shim" and e["name"] in letter)
    check(seq == SCOPE_SEQUENCE, f"calls in order {seq}, expected {SCOPE_SEQUENCE}")


def case_scopes_text():
    p = run("scopes", preload=SHIM)
    lines = [l for l in p.stderr.splitlines() if "cacheshim_scope_" in l]
    tail = r" \[shim, from app, pid \d+, tid \d+, at \d+\.\d{9} s, \d+\.\d{3} us\]"
    want = [r'cacheshim_scope_begin\(name="outer", flags=0 \(0\)\) = 0',
            r'cacheshim_scope_begin\(name="inner", flags=1 \(CACHESHIM_SCOPE_RELEASE\)\) = 0',
            r"cacheshim_scope_end\(out=0x[0-9a-f]+, size=56\) = 0"] * 1
    want = [want[0], want[1], want[2], want[1], want[2], want[2],
            r"cacheshim_scope_end\(out=0x0, size=0\) = -1",
            r'cacheshim_scope_begin\(name="odd \\"name\\"\\u0009\u00e9\?\?\?", flags=0 \(0\)\) = 0',
            r"cacheshim_scope_end\(out=0x0, size=0\) = 0"]
    check(len(lines) == len(want), f"{len(lines)} scope lines:\n" + "\n".join(lines))
    for line, pat in zip(lines, want):
        check(re.fullmatch(r"\[Intercepted\] " + pat + tail, line), f"{line!r} is not {pat}")


def case_scopes_perfetto():
    run("scopes", preload=SHIM, CACHESHIM_TRACE_FORMAT="perfetto", CACHESHIM_TRACE_FILE=trace_file())
    ev = chrome(read(only_file()))
    scope = [e for e in ev if e.get("cat") == "scope"]
    b = [e for e in scope if e["ph"] == "B"]
    check([e["name"] for e in b] == SCOPE_NAMES, f"slices {b}")
    check([e["args"]["flags"] for e in b] == SCOPE_FLAGS, "flags")
    check(len(scope) == 8 and all(e["ph"] in "BE" for e in scope), f"B and E events {scope}")
    depth = 0
    for e in scope:  # balanced, nested, on one thread, in time order
        depth += 1 if e["ph"] == "B" else -1
        check(depth >= 0 and e["tid"] == b[0]["tid"] and e["args"]["from"] == "app", f"{e}")
        check(e["ph"] == "B" or e["args"]["result"] == 0, f"{e}")
    check(depth == 0 and [e["ts"] for e in scope] == sorted(e["ts"] for e in scope), "order")
    bad = [e for e in ev if e["name"] == "cacheshim_scope_end" and e["ph"] == "X"]
    check(len(bad) == 1 and bad[0]["cat"] == "shim" and bad[0]["args"]["result"] is None and
          bad[0]["args"]["args"]["size"] == 0, f"the end with no scope open: {bad}")


def case_format_text():
    p = run("direct")
    lines = [l for l in p.stderr.splitlines() if l.startswith("[Intercepted] ")]
    check(len(lines) == 8, f"{len(lines)} lines, expected 8")
    pat = (r"\[Intercepted\] cuMemAlloc_v2\(dptr=0x[0-9a-f]+, bytesize=1048576 \(1\.00 MiB\)\)"
           r" = CUDA_SUCCESS, \*dptr=0x[0-9a-f]+ \[driver, from app, pid \d+, tid \d+, "
           r"at \d+\.\d{9} s, \d+\.\d{3} us\]")
    check(any(re.fullmatch(pat, l) for l in lines), "no cuMemAlloc_v2 line like\n" + pat +
          "\n" + "\n".join(lines))


def case_format_perfetto():
    path = trace_file()
    run("threads", CACHESHIM_TRACE_FORMAT="perfetto", CACHESHIM_TRACE_FILE=path)
    ev = chrome(read(only_file()))
    x = [e for e in ev if e["ph"] == "X"]
    c = [e for e in ev if e["ph"] == "C"]
    check(len(x) == 8 * 700 * 2, f"{len(x)} complete events")
    check(len(c) == 8 * 700 * 2, f"{len(c)} counter events")
    for e in x[:50]:
        check(set(e) >= {"name", "ph", "ts", "dur", "pid", "tid", "args"}, f"fields {e}")
        check(isinstance(e["ts"], (int, float)) and e["dur"] >= 0, "ts/dur numbers")
    check(len({e["tid"] for e in x}) == 8, "8 threads")
    vals = [e["args"]["driver"] for e in sorted(c, key=lambda e: e["ts"])]
    check(min(vals) >= 0 and max(vals) <= 8 * 2000, f"counter range {min(vals)}..{max(vals)}")
    check(all(e["name"] == "device bytes" for e in c), "counter name")


def case_format_jsonl_file():
    path = trace_file()
    p = run("direct", CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILE=path)
    check("[Intercepted]" not in p.stderr and '"name"' not in p.stderr, "trace went to stderr")
    ev = jsonl(read(only_file()))
    check(len(ev) == 8, f"{len(ev)} events in the file")


# ---------------------------------------------------------------- filters

def case_filter_memory():
    ev = jsonl(run("streams", CACHESHIM_TRACE_FORMAT="jsonl").stderr)
    names = sorted({e["name"] for e in ev})
    check(names == ["cuMemAlloc_v2", "cuMemFree_v2"], f"memory filter gave {names}")


def case_filter_all():
    ev = jsonl(run("streams", CACHESHIM_TRACE_FORMAT="jsonl",
                   CACHESHIM_TRACE_FILTER="all").stderr)
    for n in ["cuInit", "cuDeviceGet", "cuStreamCreate", "cuEventCreate", "cuEventSynchronize",
              "cuEventDestroy_v2", "cuStreamDestroy_v2", "cuMemAlloc_v2"]:
        check(count(ev, name=n) == 1, f"{n}: {count(ev, name=n)} events")
    check(count(ev, name="cuEventRecord") == 2, "2 cuEventRecord")
    sc = [e for e in ev if e["name"] == "cuStreamCreate"][0]
    check(sc["args"]["Flags"] == 1 and sc["args"]["Flags_decoded"] == "CU_STREAM_NON_BLOCKING",
          f"stream flags {sc['args']}")
    check(sc["out"]["phStream"].startswith("0x"), "stream out-parameter")
    rec = [e for e in ev if e["name"] == "cuEventRecord"][0]
    check(rec["args"]["hStream_decoded"] == "CU_STREAM_PER_THREAD", f"stream {rec['args']}")
    evc = [e for e in ev if e["name"] == "cuEventCreate"][0]
    check(evc["args"]["Flags_decoded"] == "CU_EVENT_DISABLE_TIMING", f"event {evc['args']}")


def case_filter_list():
    ev = jsonl(run("streams", CACHESHIM_TRACE_FORMAT="jsonl",
                   CACHESHIM_TRACE_FILTER="cuMemFree*, cuStream?reate").stderr)
    names = sorted(e["name"] for e in ev)
    check(names == ["cuMemFree_v2", "cuStreamCreate"], f"list filter gave {names}")


def case_bad_value():
    p = run("direct", CACHESHIM_TRACE_FORMAT="json")
    check("cacheshim: CACHESHIM_TRACE_FORMAT='json' is not valid: expected text, jsonl or "
          "perfetto; using the default (text)" in p.stderr, "the one-line message")
    check(sum(l.startswith("[Intercepted] ") for l in p.stderr.splitlines()) == 8,
          "text format after a bad value")


# ---------------------------------------------------------------- files

def case_file_mode():
    os.umask(0o022)
    path = trace_file("t-%p.jsonl")
    run("direct", CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILE=path)
    f = only_file()
    check(re.fullmatch(r"t-\d+\.jsonl", os.path.basename(f)), f"%p not expanded: {f}")
    mode = stat.S_IMODE(os.stat(f).st_mode)
    check(mode == 0o600, f"mode {oct(mode)}, expected 0o600")


def case_file_exists():
    """A file already there is never touched: the process traces to PATH.PID and says so."""
    path = trace_file("existing")
    with open(path, "w") as f:
        f.write("precious\n")
    p = run("direct", CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILE=path)
    check(read(path) == "precious\n", "an existing file was changed")
    m = re.search(rf"cacheshim: trace file '{re.escape(path)}' exists; process (\d+) traces to "
                  rf"'{re.escape(path)}\.(\d+)'\n", p.stderr)
    check(m and m.group(1) == m.group(2), f"the message: {p.stderr!r}")
    check(len(jsonl(read(f"{path}.{m.group(1)}"))) == 8, "the trace is in PATH.PID")
    check(sorted(os.listdir(WORK)) == ["existing", f"existing.{m.group(1)}"], "other files")


def case_pending_taken():
    """The ring's file cannot be made (a file of that name already there): one line says so,
    the file there is left alone, and every call is formatted on its own thread: the same
    trace, finished."""
    path = trace_file("taken.jsonl")
    with open(path + ".pending", "w") as f:
        f.write("someone else's\n")
    p = run("direct", CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILE=path)
    said = [l for l in p.stderr.splitlines() if l.startswith("cacheshim: ")]
    check(said == [f"cacheshim: cannot create '{path}.pending': File exists; each call is "
                   f"formatted on its own thread instead (slower)"], f"the message: {said}")
    check(read(path + ".pending") == "someone else's\n", "the file there was changed")
    check(len(jsonl(read(path))) == 8, "the trace, formatted on the calling thread")


def case_spawn():
    """Programs the traced program starts inherit the variables: one with driver calls gets
    PATH.PID, a shell without any leaves no file and prints nothing."""
    path = trace_file("trace.jsonl")
    p = run("spawn", CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILE=path)
    child = int(re.search(r"child (\d+)", p.stdout).group(1))
    check(sorted(os.listdir(WORK)) == ["trace.jsonl", f"trace.jsonl.{child}"],
          f"files: {sorted(os.listdir(WORK))}")
    ev, cev = jsonl(read(path)), jsonl(read(f"{path}.{child}"))
    check(len(ev) == 8 and len(cev) == 8, f"events: parent {len(ev)}, child {len(cev)}")
    check(all(e["pid"] == child for e in cev), "the child's file has the child's calls")
    check(all(e["pid"] != child for e in ev), "the parent's file has the parent's calls")
    check(p.stderr == f"cacheshim: trace file '{path}' exists; process {child} traces to "
                      f"'{path}.{child}'\n", f"stderr: {p.stderr!r}")


def case_file_symlink():
    """A link is never written through, dangling or not: like an existing file, the process
    traces to PATH.PID."""
    target = os.path.join(WORK, "target")
    with open(target, "w") as f:
        f.write("precious\n")
    link = os.path.join(WORK, "link")
    os.symlink(target, link)
    dangling = os.path.join(WORK, "dangling")
    os.symlink(os.path.join(WORK, "nowhere"), dangling)
    for path in (link, dangling):
        p = run("direct", CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILE=path)
        m = re.search(rf"trace file '{re.escape(path)}' exists; process (\d+) traces to", p.stderr)
        check(m, f"no message for {path}: {p.stderr!r}")
        check(len(jsonl(read(f"{path}.{m.group(1)}"))) == 8, "the trace is in PATH.PID")
        check(not os.path.islink(f"{path}.{m.group(1)}"), "PATH.PID is a link")
    check(read(target) == "precious\n", "the symlink was followed")
    check(not os.path.exists(os.path.join(WORK, "nowhere")), "the dangling link was followed")


def case_file_unwritable():
    path = os.path.join(WORK, "no-such-dir", "trace")
    p = run("direct", CACHESHIM_TRACE_FILE=path)
    check(f"cannot create trace file '{path}': No such file or directory; tracing to stderr"
          in p.stderr, "message")


# ---------------------------------------------------------------- threads, fork, exit

def case_threads():
    path = trace_file()
    run("threads", CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILE=path)
    ev = jsonl(read(only_file()))
    per = {}
    for e in ev:
        per.setdefault(e["tid"], []).append(e)
    check(len(per) == 8, f"{len(per)} threads")
    for tid, es in per.items():
        check(len(es) == 1400, f"thread {tid}: {len(es)} events, expected 1400")
        check(count(es, name="cuMemAlloc_v2") == 700, "700 allocations per thread")
        ts = [e["ts_ns"] for e in es]
        check(ts == sorted(ts), "a thread's events in order")
        sizes = [e["args"]["bytesize"] for e in es if e["name"] == "cuMemAlloc_v2"]
        check(sizes == [512 + i for i in range(700)], "every allocation, once, in order")


def case_fork():
    path = trace_file("trace.%p")
    p = run("fork", CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILE=path)
    child = int(re.search(r"child (\d+)", p.stdout).group(1))
    files = sorted(os.listdir(WORK))
    check(len(files) == 2, f"files {files}")
    cf = os.path.join(WORK, f"trace.{child}")
    check(os.path.exists(cf), f"no child file trace.{child}")
    pf = [os.path.join(WORK, f) for f in files if f != f"trace.{child}"][0]
    cev, pev = jsonl(read(cf)), jsonl(read(pf))
    check(count(cev, name="cuMemAlloc_v2") == 3 and len(cev) == 6, f"child: {len(cev)} events")
    check(all(e["args"]["bytesize"] == 2 * MiB for e in cev if e["name"] == "cuMemAlloc_v2"),
          "child's sizes")
    check(count(pev, name="cuMemAlloc_v2") == 3 and len(pev) == 6, f"parent: {len(pev)} events")
    check(all(e["pid"] == child for e in cev), "child pid")
    check(stat.S_IMODE(os.stat(cf).st_mode) == 0o600, "child file mode")


def objects_and_records(ev):
    objects = [e for e in ev if "object" in e]
    return objects, [e for e in ev if "object" not in e]


def case_stack_threads():
    # Call sites from 8 threads at once: each object's line once in the file (the threads
    # meet audit_prog and libc together), every allocation with its stack.
    path = trace_file()
    run("threads", CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILE=path,
        CACHESHIM_TRACE_STACK="4")
    objects, ev = objects_and_records(jsonl(read(only_file())))
    paths = [o["object"] for o in objects]
    check(len(paths) == len(set(paths)), f"an object described twice: {sorted(paths)}")
    check(any(p.endswith("/audit_prog") for p in paths), f"audit_prog not among {paths}")
    allocs = [e for e in ev if e["name"] == "cuMemAlloc_v2"]
    check(len(allocs) == 8 * 700, f"{len(allocs)} allocations")
    check(all(1 <= len(e.get("stack", [])) <= 4 for e in allocs), "an allocation without stack")
    check(not any("stack" in e for e in ev if e["name"] != "cuMemAlloc_v2"), "a free's stack")


def case_stack_kill():
    # A program killed by SIGKILL right after its allocations, before the formatter ran:
    # once `cacheshim finish` has formatted its calls, every address of their stacks lies in
    # an object the file describes, as when the program ends normally.
    path = trace_file("kill.jsonl")
    run("die", DEATHS["kill"], args=("kill", str(N_DIE)), CACHESHIM_TRACE_FORMAT="jsonl",
        CACHESHIM_TRACE_FILE=path, CACHESHIM_TRACE_STACK="4")
    with open(path, "rb") as f:
        raw = f.read()
    objects, ev = objects_and_records(jsonl(finish_killed("jsonl", path, raw).decode()))
    allocs = [e for e in ev if e["name"] == "cuMemAlloc_v2"]
    check(len(allocs) == N_DIE, f"{len(allocs)} allocations, expected {N_DIE}")
    prog = [o for o in objects if o["object"].endswith("/audit_prog")]
    check(len(prog) == 1, f"audit_prog not among {[o['object'] for o in objects]}")
    lo = int(prog[0]["base"], 16) if prog else 0
    hi = lo + os.path.getsize(PROG)
    check(all(any(lo <= int(pc, 16) < hi for pc in e.get("stack", [])) for e in allocs),
          f"an allocation whose stack does not reach the program: {allocs[:1]}")


def case_stack_bind():
    # The cache as the first audit module, the tracer the second (what `cacheshim trace --cache`
    # sets): ld.so's table of objects does not know the second audit namespace (glibc 2.36),
    # and the program's allocations had no stack until the tracer registered its own unwind
    # data (ca_stack.c).
    path = trace_file()
    run("shim", preload=SHIM, audit=f"{SHIM}:{AUDIT}", CACHESHIM_TRACE_FORMAT="jsonl",
        CACHESHIM_TRACE_FILE=path, CACHESHIM_TRACE_STACK="4")
    objects, ev = objects_and_records(jsonl(read(only_file())))
    allocs = [e for e in ev if e["name"] == "cuMemAlloc_v2" and e["lib"] == "shim"]
    check(len(allocs) == 3, f"{len(allocs)} program allocations seen at the shim, expected 3")
    prog = [o for o in objects if o["object"].endswith("/audit_prog")]
    check(len(prog) == 1, f"audit_prog not among {[o['object'] for o in objects]}")
    lo = int(prog[0]["base"], 16)
    hi = lo + os.path.getsize(PROG)  # its text lies within its file's size from its base
    check(all(any(lo <= int(pc, 16) < hi for pc in e.get("stack", [])) for e in allocs),
          f"an allocation whose stack does not reach the program: {allocs}")


def case_stack_fork():
    # The child of fork describes its objects again in its own file, with its pid.
    path = trace_file("trace.%p")
    p = run("fork", CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILE=path,
            CACHESHIM_TRACE_STACK="4")
    child = int(re.search(r"child (\d+)", p.stdout).group(1))
    for f in os.listdir(WORK):
        objects, ev = objects_and_records(jsonl(read(os.path.join(WORK, f))))
        pid = ev[0]["pid"]
        check(all(o["pid"] == pid for o in objects), f"{f}: an object of another process")
        check(any(o["object"].endswith("/audit_prog") for o in objects), f"{f}: no audit_prog")
        check(all(e.get("stack") for e in ev if e["name"] == "cuMemAlloc_v2"), f"{f}: stacks")
        check((pid == child) == (f == f"trace.{child}"), f"{f}: pid {pid}")


def case_fork_perfetto():
    path = trace_file("trace.%p.json")
    run("fork", CACHESHIM_TRACE_FORMAT="perfetto", CACHESHIM_TRACE_FILE=path)
    files = os.listdir(WORK)
    check(len(files) == 2, f"files {files}")
    n = sorted(sum(e["ph"] == "X" for e in chrome(read(os.path.join(WORK, f))))
               for f in files)
    check(n == [6, 6], f"events per file {n}")


def case_chdir():
    # A relative CACHESHIM_TRACE_FILE, and a program that changes its working directory after
    # its first traced call: at its end the file of its unformatted calls goes from where it
    # was made, and a file of that name in the new directory (another program's) stays.
    sub = os.path.join(WORK, "sub")
    os.mkdir(sub)
    with open(os.path.join(sub, "run.jsonl.pending"), "w") as f:
        f.write("another program's")
    run("chdir", args=(sub,), CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILE="run.jsonl")
    check(not os.path.exists(os.path.join(WORK, "run.jsonl.pending")),
          "run.jsonl.pending left where it was made")
    check(os.path.exists(os.path.join(sub, "run.jsonl.pending")),
          "the new directory's run.jsonl.pending removed")
    ev = jsonl(read(os.path.join(WORK, "run.jsonl")))
    check(count(ev, name="cuMemAlloc_v2") == 2, "2 allocations")


def case_exit_thread():
    path = trace_file("trace.json")
    run("exit-thread", CACHESHIM_TRACE_FORMAT="perfetto", CACHESHIM_TRACE_FILE=path)
    ev = chrome(read(path))
    check(sum(e["ph"] == "X" and e["name"] == "cuMemAlloc_v2" for e in ev) == 50,
          "50 allocations before exit() from a thread")
    check(sum(e["ph"] == "X" for e in ev) == 100, "100 events")


# ---------------------------------------------------------------- deaths and write errors

N_DIE = 10
FORMATS = ("text", "jsonl", "perfetto")
# How the program ends, and its exit status as subprocess reports it.
DEATHS = {"abort": -signal.SIGABRT, "_exit": 3, "kill": -signal.SIGKILL, "segv": -signal.SIGSEGV,
          "quick_exit": 4, "at_quick_exit": 4}


def perfetto_events(raw):
    """The events of a Chrome trace: a finished file must be strict JSON."""
    check(b"\0" not in raw, "zero bytes in a finished file")
    return chrome(raw)


def die_records(fmt, raw, name="cuMemAlloc_v2"):
    """The records of name (cuMemAlloc_v2) of a finished trace written by audit_prog die."""
    if fmt == "perfetto":
        ev = perfetto_events(raw)
        return [e for e in ev if e["ph"] == "X" and e["name"] == name]
    text = raw.decode()
    check("\0" not in text and (text == "" or text.endswith("\n")),
          "a finished file ends in a whole line")
    lines = text.splitlines()
    if fmt == "jsonl":
        return [e for e in jsonl("\n".join(lines)) if e["name"] == name]
    return [l for l in lines if l.startswith(f"[Intercepted] {name}(")]


def finish_killed(fmt, path, raw):
    """A killed program's file: the records its formatter wrote (the last batch in part if it
    was being copied at that moment), then zero bytes (the rest of its last step of growth; or
    nothing at all); the rest of its calls in PATH.pending, which `cacheshim finish` formats
    into the file, from where the header says the formatter's text ended."""
    check(os.path.exists(path + ".pending"), f"{fmt}: no {path}.pending beside it")
    p = subprocess.run([LAUNCHER, "finish", path], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0 and "formatted into it" in p.stdout,
          f"cacheshim finish: {p.returncode} {p.stdout!r} {p.stderr!r}")
    check(not os.path.exists(path + ".pending"), f"{fmt}: {path}.pending left after finish")
    p = subprocess.run([LAUNCHER, "finish", path], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0 and "nothing to finish" in p.stdout, f"finish again: {p.stdout!r}")
    with open(path, "rb") as f:
        return f.read()


def die_case(how, frees=0):
    """frees: the cuMemFree_v2 calls the program makes as it ends (an at_quick_exit handler's),
    which must be in the trace too."""
    for fmt in FORMATS:
        path = trace_file(f"{how}.{fmt}")
        # handle_segv=0: in the ASan build, the sanitizer would report the SIGSEGV and exit 1
        # instead of letting the signal end the program.
        asan = os.environ.get("ASAN_OPTIONS", "") + ":handle_segv=0"
        run("die", DEATHS[how], args=(how, str(N_DIE)), CACHESHIM_TRACE_FORMAT=fmt,
            CACHESHIM_TRACE_FILE=path, ASAN_OPTIONS=asan.lstrip(":"))
        with open(path, "rb") as f:
            raw = f.read()
        if how == "kill":
            raw = finish_killed(fmt, path, raw)
        else:
            check(not os.path.exists(path + ".pending"), f"{how}: {path}.pending left")
        recs = die_records(fmt, raw)
        check(len(recs) == N_DIE, f"{how}, {fmt}: {len(recs)} allocations in the trace, "
                                  f"expected {N_DIE}")
        got = len(die_records(fmt, raw, "cuMemFree_v2"))
        check(got == frees, f"{how}, {fmt}: {got} frees in the trace, expected {frees}")


def case_die_abort():
    die_case("abort")


def case_die_exit():
    die_case("_exit")


def case_die_kill():
    die_case("kill")


def case_die_segv():
    die_case("segv")


def case_die_quick_exit():
    """quick_exit() (C11): the at_quick_exit handlers, then _Exit inside libc, which no
    binding shows; without handlers, and with one that makes a traced call (in the trace)."""
    die_case("quick_exit")
    die_case("at_quick_exit", frees=1)


def case_end_race():
    """A thread crashes (SIGSEGV) while exit() on another thread finishes the trace, here held
    up in its last write ("]") to stderr, a full pipe read only 1.5 s later: the crash waits
    for the end, so the Chrome trace is whole. Either may end the process."""
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("CACHESHIM_"):
            del env[k]
    env.update(LD_AUDIT=AUDIT, LD_LIBRARY_PATH=FAKE_DIR + ":" + CUDART_DIR,
               CACHESHIM_TRACE_FORMAT="perfetto",
               ASAN_OPTIONS=(env.get("ASAN_OPTIONS", "") + ":handle_segv=0").lstrip(":"),
               # The sanitizers' reports would go into the trace (stderr): none here.
               TSAN_OPTIONS=(env.get("TSAN_OPTIONS", "") +
                             ":handle_segv=0:report_signal_unsafe=0").lstrip(":"))
    env.setdefault("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=16777216")
    p = subprocess.Popen([PROG, "end-race"], env=env, cwd=WORK, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    time.sleep(1.5)
    raw = p.stderr.read()
    rc = p.wait(timeout=60)
    check(rc in (0, -signal.SIGSEGV), f"end-race: exit {rc}\n{raw[-2000:]!r}")
    try:
        ev = chrome(raw)
    except ValueError as e:
        fail(f"end-race: the trace is not whole JSON ({e}): ...{raw[-200:]!r}")
    n = sum(e["ph"] == "X" and e["name"] == "cuMemAlloc_v2" for e in ev)
    check(n == 10, f"end-race: {n} allocations, expected 10")


def case_vfork():
    """A child of vfork that calls _exit (its exec failed) runs in the parent's memory: it
    must not end the parent's trace (which then recorded nothing more, cut and closed)."""
    for fmt in FORMATS:
        path = trace_file(f"vfork.{fmt}")
        run("vfork", CACHESHIM_TRACE_FORMAT=fmt, CACHESHIM_TRACE_FILE=path)
        with open(path, "rb") as f:
            raw = f.read()
        check(not os.path.exists(path + ".pending"), f"vfork, {fmt}: {path}.pending left")
        recs = die_records(fmt, raw)
        check(len(recs) == 6, f"vfork, {fmt}: {len(recs)} allocations in the trace, expected 6")


def clock_case(how):
    """The trace's times against CLOCK_MONOTONIC read by the program around each call, with
    each clock the tracer can take: the start of each call after the first, counted from the
    first's, within the program's own reads (and their distance); no call longer than the
    program saw it. kill: the last records are made ns by `cacheshim finish`, with the clock
    the pending file holds; stderr: by the thread of each call (no ring)."""
    n = 12
    clocks = ["monotonic", "auto"]
    if invariant_tsc():
        clocks.append("tsc")
    for clock in clocks:
        path = trace_file(f"clock-{how}-{clock}.jsonl")
        to_file = {} if how == "stderr" else {"CACHESHIM_TRACE_FILE": path}
        p = run("clock", DEATHS["kill"] if how == "kill" else 0,
                args=(str(n), "exit" if how == "stderr" else how),
                CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_CLOCK=clock, **to_file)
        check("CACHESHIM_TRACE_CLOCK" not in p.stderr, f"{clock}: {p.stderr[-500:]}")
        if how == "kill":
            finish_killed("jsonl", path, b"")
        seen = [tuple(map(int, l.split())) for l in p.stdout.splitlines()]
        text = p.stderr if how == "stderr" else read(path)
        ev = [e for e in jsonl(text) if e["name"] == "cuMemAlloc_v2"]
        check(len(ev) == n and len(seen) == n, f"{clock}: {len(ev)} records, {len(seen)} reads")
        a0, b0 = seen[0]
        for e, (a, b) in zip(ev, seen):
            check(0 <= e["dur_ns"] <= b - a, f"{clock}: dur_ns {e['dur_ns']}, the program saw "
                                             f"{b - a}")
            # The call began after a and before b; the first between a0 and b0.
            lo, hi = (a - b0), (b - a0)
            t = e["ts_ns"] - ev[0]["ts_ns"]
            check(lo - 2000 <= t <= hi + 2000,
                  f"{clock}: start {t} ns after the first's, the program saw {lo}..{hi}")


def invariant_tsc():
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    return " constant_tsc" in flags and " nonstop_tsc" in flags


def case_clock():
    clock_case("exit")


def case_clock_kill():
    clock_case("kill")


def case_clock_stderr():
    clock_case("stderr")  # no ring: each record's times made ns by the thread of its call


def limit_file_size(n):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))


def case_full_disk():
    """The file cannot grow past RLIMIT_FSIZE (as on a full disk): the program runs to its
    end untouched (SIGXFSZ would kill it), one line on stderr, every call either in the file
    or counted in the note at its end."""
    calls = 8 * 700 * 2
    for fmt in FORMATS:
        path = trace_file(f"full.{fmt}")
        p = run("threads", preexec=limit_file_size(int(1.5 * (1 << 20))),
                CACHESHIM_TRACE_FORMAT=fmt, CACHESHIM_TRACE_FILE=path)
        said = [l for l in p.stderr.splitlines() if l.startswith("cacheshim: ")]
        check(said == [f"cacheshim: cannot write the trace to '{path}': File too large; calls "
                       f"from now on are counted in the trace, not written"], f"{fmt}: {said}")
        raw = read(path)
        if fmt == "jsonl":
            ev = jsonl(raw)
            note = ev[-1]
            check(set(note) == {"cacheshim_lost", "error"} and note["error"] == "File too large",
                  f"the note {note}")
            written, lost = len(ev) - 1, note["cacheshim_lost"]
        elif fmt == "perfetto":
            ev = chrome(raw)
            note = [e for e in ev if e["name"] == "cacheshim: calls not written"]
            check(len(note) == 1 and note[0]["args"]["error"] == "File too large", f"{note}")
            written, lost = sum(e["ph"] == "X" for e in ev), note[0]["args"]["lost"]
        else:
            lines = raw.splitlines()
            m = re.fullmatch(r"\[cacheshim\] +(\d+) calls not written: File too large", lines[-1])
            check(m, f"the note {lines[-1]!r}")
            written, lost = len(lines) - 1, int(m.group(1))
        check(lost > 0 and written + lost == calls,
              f"{fmt}: {written} written + {lost} counted, expected {calls} calls")
        check(len(raw) <= 1.5 * (1 << 20), f"{fmt}: {len(raw)} bytes")


def case_stderr_full():
    """The trace on stderr, which is /dev/full: every write fails; the program runs on."""
    with open("/dev/full", "w") as full:
        run("threads", stderr=full, CACHESHIM_TRACE_FORMAT="jsonl")
        run("direct", stderr=full, CACHESHIM_TRACE_FORMAT="perfetto")



def case_stderr_fsize():
    """The trace on stderr, a regular file (`2>log`) that reaches RLIMIT_FSIZE: SIGXFSZ, whose
    default action kills the program, must not come of the tracer's writes; said once."""
    for fmt in FORMATS:
        path = os.path.join(WORK, f"stderr-fsize.{fmt}")
        with open(path, "w") as log:
            run("threads", stderr=log, preexec=limit_file_size(64 << 10),
                CACHESHIM_TRACE_FORMAT=fmt)
        raw = read(path)
        check(len(raw) == 64 << 10, f"{fmt}: {len(raw)} bytes, expected the limit")

CASES = {k[5:].replace("_", "-"): v for k, v in globals().items() if k.startswith("case_")}

if __name__ == "__main__":
    name = CASE[:-len("-classic")] if CLASSIC else CASE
    if name not in CASES:
        sys.exit(f"unknown case {CASE}; known: {' '.join(sorted(CASES))}")
    CASES[name]()
    print(f"{CASE}: ok")
