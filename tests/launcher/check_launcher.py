#!/usr/bin/env python3
"""Tests of the cacheshim launcher, end to end on the fake driver: run the built launcher
(tools/cacheshim) on tests/launcher/launch_prog and check exit statuses, what the program got
and every message.

Usage: check_launcher.py CASE LAUNCHER PROG FAKE_DIR SHIM AUDIT MARKER VERSION LIBDIR_REL
                         HOOKS

HOOKS: "audit" where the launcher loads the cache as an audit module too (LD_AUDIT, ahead of
the tracer), "preload-only" in sanitized builds (tools/meson.build).

Each CASE runs in a fresh temporary directory. Exit 0 on success, 1 with a message on failure.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

CASE, LAUNCHER, PROG, FAKE_DIR, SHIM, AUDIT, MARKER, VERSION, LIBDIR_REL, HOOKS = \
    sys.argv[1:11]
# The cases that load the cache also run as CASE-classic, with CACHESHIM_BACKEND=classic in
# the environment: the shim then takes memory with cuMemAlloc_v2, pooled (the default) with
# cuMemCreate, a granule (2 MiB on the fake) at least.
CLASSIC = CASE.endswith("-classic")
DRIVER_ALLOC = "cuMemAlloc_v2" if CLASSIC else "cuMemCreate"
WORK = tempfile.mkdtemp(prefix="cacheshim-launcher-")
SHIM_REAL = os.path.realpath(SHIM)
AUDIT_REAL = os.path.realpath(AUDIT)
BIND = HOOKS == "audit"
# what LD_AUDIT holds ahead of the tracer, or alone, for the cache
CACHE_AUDIT = f"{SHIM_REAL}:" if BIND else ""
SIZE_ACCEPTED = ("a size like 8G, 512MiB, 1.5GB, 4096, a percentage of device memory like 75%, "
                 "or none")
CAP_ACCEPTED = ("a size of at least 2MiB like 8G, 512MiB, 1.5GB, a percentage of device memory "
                "like 75%, or none")


def fail(msg):
    print(f"FAIL {CASE}: {msg}", file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def base_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CACHESHIM_") and k not in ("LD_PRELOAD", "LD_AUDIT")}
    env["LD_LIBRARY_PATH"] = FAKE_DIR
    # Sanitized builds: the shim is preloaded ahead of the sanitizer runtime (as in
    # tests/meson.build); LeakSanitizer crashes at exit under LD_AUDIT with the shim
    # preloaded (tests/audit/check_trace.py), and `run` loads the cache as LD_AUDIT too, so
    # leaks are checked by the shim's own tests (tests/meson.build), not here.
    env["ASAN_OPTIONS"] = "verify_asan_link_order=0:detect_leaks=0"
    env.setdefault("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=16777216")
    if CLASSIC:
        env["CACHESHIM_BACKEND"] = "classic"
    env.update(extra)
    return env


def launch(*args, rc=0, env=None, launcher=None, stdout=subprocess.PIPE):
    """Runs the launcher with args; checks its exit status; returns (stdout, stderr)."""
    cmd = [launcher or LAUNCHER] + list(args)
    p = subprocess.run(cmd, env=env or base_env(), cwd=WORK, stdout=stdout,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    if p.returncode != rc:
        fail(f"{cmd[1:]}: exit {p.returncode}, expected {rc}\nstdout: {p.stdout}\n"
             f"stderr: {p.stderr[-3000:]}")
    return p.stdout or "", p.stderr


def lines(text, prefix):
    return [l for l in text.splitlines() if l.startswith(prefix)]


def field(out, key):
    """The rest of the line of out that starts with key (launch_prog's output)."""
    found = [l[len(key):].strip() for l in out.splitlines() if l.startswith(key + " ")]
    check(len(found) == 1, f"no single '{key}' line in:\n{out}")
    return found[0]


# ---------------------------------------------------------------- the launcher's own

def case_version():
    out, err = launch("--version")
    check(out == f"cacheshim {VERSION}\n" and err == "", f"--version printed {out!r} {err!r}")
    with open("/dev/full", "w") as full:
        _, err = launch("--version", rc=125, stdout=full)
    check(err == "cacheshim: cannot write to standard output: No space left on device\n",
          f"--version to a full device: {err!r}")


def case_help():
    out, err = launch("--help")
    check(out.startswith("usage: cacheshim COMMAND") and err == "", f"--help: {out!r}")
    for cmd in ("run", "trace", "report", "replay", "status"):
        check(f"\n  {cmd} " in out, f"--help does not list {cmd}")
    check(launch("-h")[0] == out, "-h differs from --help")
    out, _ = launch("run", "--help")
    check(out.startswith("usage: cacheshim run [OPTIONS] [--] PROGRAM [ARGS...]\n"), out)
    for opt, var in (("--cap SIZE", "CACHESHIM_CAP"), ("--threshold SIZE",
                     "CACHESHIM_RELEASE_THRESHOLD"), ("--group NAME", "CACHESHIM_GROUP"),
                     ("--stats", "CACHESHIM_STATS"),
                     ("--verbose N", "CACHESHIM_VERBOSE"), ("--disable", "CACHESHIM_DISABLE")):
        check(any(l.startswith(f"  {opt} ") and l.endswith(f"({var})") for l in out.splitlines()),
              f"run --help: no line for {opt} ({var})")
    check("--format" not in out and "--cache" not in out, "run --help shows trace options")
    out, _ = launch("trace", "-h")
    check(out.startswith("usage: cacheshim trace [OPTIONS] [--] PROGRAM [ARGS...]\n"), out)
    for opt in ("-o FILE, --output FILE", "--format FORMAT", "--filter CALLS", "--cache"):
        check(f"\n  {opt}" in out, f"trace --help: no {opt}")
    # --help wins wherever it is among the options, and nothing runs
    out, _ = launch("run", "--cap", "1G", "--help", PROG, "args", "0", "ran")
    check(out.startswith("usage: cacheshim run") and "[ran]" not in out, "run ... --help")


def case_usage():
    _, err = launch(rc=2)
    check(err.startswith("usage: cacheshim COMMAND"), f"no arguments: {err!r}")
    want = {
        ("frob",): "cacheshim: unknown command 'frob' (try: cacheshim --help)",
        ("--frob",): "cacheshim: unknown option '--frob' (try: cacheshim --help)",
        ("frob\x1b[31m",): "cacheshim: unknown command 'frob\\x1b[31m' (try: cacheshim --help)",
        ("run", "--frob", PROG): "cacheshim run: unknown option '--frob' (try: cacheshim run --help)",
        ("run", "-x", PROG): "cacheshim run: unknown option '-x' (try: cacheshim run --help)",
        ("run", "--capacity=1G", PROG):
            "cacheshim run: unknown option '--capacity=1G' (try: cacheshim run --help)",
        ("run", "--format", "jsonl", PROG):
            "cacheshim run: unknown option '--format' (try: cacheshim run --help)",
        ("run", "-o", "f", PROG): "cacheshim run: unknown option '-o' (try: cacheshim run --help)",
        ("run", "--cap"): "cacheshim run: --cap needs a value (try: cacheshim run --help)",
        ("trace", "-o"): "cacheshim trace: -o needs a value (try: cacheshim trace --help)",
        ("run", "--stats=1", PROG): "cacheshim run: --stats takes no value (try: cacheshim run --help)",
        ("run",): "cacheshim run: no program to run (try: cacheshim run --help)",
        ("run", "--cap", "1G", "--"): "cacheshim run: no program to run (try: cacheshim run --help)",
        ("trace", "--stats", PROG):
            "cacheshim trace: --stats is an option of the cache: add --cache to load it",
        ("trace", "--cap=1G", "--format", "text", PROG):
            "cacheshim trace: --cap is an option of the cache: add --cache to load it",
    }
    for args, line in want.items():
        out, err = launch(*args, "args", "0", "ran", rc=2) if PROG in args else launch(*args, rc=2)
        check(err == line + "\n", f"{args}: {err!r}, expected {line!r}")
        check(out == "", f"{args}: the program ran: {out!r}")


def case_finish():
    _, err = launch("finish", rc=2)
    check(err.startswith("usage: cacheshim finish TRACE..."), f"no trace: {err!r}")
    out, _ = launch("finish", "--help")
    check(out.startswith("usage: cacheshim finish TRACE..."), f"--help: {out!r}")
    with tempfile.TemporaryDirectory() as d:
        done = os.path.join(d, "done.jsonl")
        with open(done, "w") as f:
            f.write("{}\n")
        missing = os.path.join(d, "missing.jsonl")
        out, err = launch("finish", done, missing, rc=1)
        check(out == f"{done}: nothing to finish\n", f"a finished trace: {out!r}")
        check(err == f"cacheshim: '{missing}': No such file or directory\n",
              f"a trace that is not there: {err!r}")


# ---------------------------------------------------------------- run

def case_exit_status():
    out, _ = launch("run", "--", PROG, "args", "42", rc=42)
    launch("run", PROG, "args", "0")
    launch("run", PROG, "args", "255", rc=255)
    out, _ = launch("run", PROG, "signal", rc=-signal.SIGTERM)


def case_arguments():
    args = ["a b", "", "--cap", "8X", "*", "  x  ", "é", "'\"$HOME\\", "--", "-h"]
    out, _ = launch("run", "--", PROG, "args", "0", *args)
    check(out == "".join(f"[{a}]\n" for a in args), f"arguments: {out!r}")
    # without --, the first word that is not an option is the program; the rest is its own
    out, _ = launch("run", "--stats", PROG, "args", "7", "--cap", "8X", rc=7)
    check(out == "[--cap]\n[8X]\n", f"options after PROGRAM: {out!r}")
    # a program found in PATH
    env = base_env(PATH=os.path.dirname(PROG) + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
    out, _ = launch("run", os.path.basename(PROG), "args", "3", "x", rc=3, env=env)
    check(out == "[x]\n", f"through PATH: {out!r}")


def case_loaded():
    # without the launcher: no shim; the header's helpers say so
    p = subprocess.run([PROG, "alloc", "10"], env=base_env(), stdout=subprocess.PIPE, text=True)
    check(p.returncode == 0, f"alone: exit {p.returncode}")
    check(field(p.stdout, "driver allocations") == "10", p.stdout)
    check(field(p.stdout, "driver cuMemCreate") == "0", p.stdout)
    check(field(p.stdout, "shim") == "not loaded", p.stdout)
    check(field(p.stdout, "stats:") == "not loaded", p.stdout)
    check(field(p.stdout, "trim:") == "not loaded, released 0", p.stdout)
    # with it: one driver allocation, nine hits, the cached memory given back by the trim:
    # the 1 MiB block, or pooled the granule its slab is on
    out, err = launch("run", PROG, "alloc", "10")
    check(field(out, "driver allocations") == "1", out)
    check(field(out, "driver cuMemCreate") == ("0" if CLASSIC else "1"), out)
    check(field(out, "shim") == "loaded", out)
    check(field(out, "stats:") == "requests 10 hits 9", out)
    check(field(out, "trim:") == ("released 1048576" if CLASSIC else "released 2097152"), out)
    check(err == "", f"stderr: {err!r}")


def case_env():
    out, _ = launch("run", PROG, "env")
    # the cache preloaded and at binding time (where the build can: not sanitized)
    audit = f"LD_AUDIT={SHIM_REAL}\n" if BIND else "LD_AUDIT=(unset)\n"
    check(f"LD_PRELOAD={SHIM_REAL}\n" in out, f"LD_PRELOAD: {out}")
    check(audit in out and "CACHESHIM_CAP=(unset)\n" in out, out)
    check("marker not loaded" in out, out)
    # --no-bind: preloaded only
    out, _ = launch("run", "--no-bind", PROG, "env")
    check(f"LD_PRELOAD={SHIM_REAL}\n" in out and "LD_AUDIT=(unset)\n" in out, out)
    # the user's LD_PRELOAD is kept, after the shim; and still loaded
    out, _ = launch("run", PROG, "env", env=base_env(LD_PRELOAD=MARKER))
    check(f"LD_PRELOAD={SHIM_REAL}:{MARKER}\n" in out, f"LD_PRELOAD kept: {out}")
    check("marker loaded" in out, out)
    # each option as its variable; options over the environment; the rest left alone
    out, _ = launch("run", "--cap", "64M", "--threshold=1MiB", "--stats", "--verbose", "1",
                    "--disable", PROG, "env",
                    env=base_env(CACHESHIM_CAP="32M", CACHESHIM_TRACE_FILTER="all"))
    for var, val in (("CAP", "64M"), ("RELEASE_THRESHOLD", "1MiB"), ("STATS", "1"),
                     ("VERBOSE", "1"), ("DISABLE", "1"), ("TRACE_FILTER", "all"),
                     ("TRACE_FILE", "(unset)"), ("TRACE_FORMAT", "(unset)")):
        check(f"CACHESHIM_{var}={val}\n" in out, f"CACHESHIM_{var} is not {val}: {out}")
    # the cache comes ahead of the tracer, so that the tracer sees its answers
    out, _ = launch("trace", "--cache", "-otbind", PROG, "env")
    check(f"LD_PRELOAD={SHIM_REAL}\n" in out and f"LD_AUDIT={CACHE_AUDIT}{AUDIT_REAL}\n" in out,
          out)
    out, _ = launch("trace", "--cache", "--no-bind", "-otnobind", PROG, "env")
    check(f"LD_PRELOAD={SHIM_REAL}\n" in out and f"LD_AUDIT={AUDIT_REAL}\n" in out, out)
    # trace: LD_AUDIT, its variables, and the shim only with --cache
    # (a user's audit module that does not exist: ld.so reports it and goes on; the marker
    # library cannot stand in, as a sanitized build of it cannot load in an audit namespace)
    user_audit = os.path.join(WORK, "no-such-audit.so")
    out, _ = launch("trace", "-o", "t", PROG, "env", env=base_env(LD_AUDIT=user_audit))
    check(f"LD_AUDIT={AUDIT_REAL}:{user_audit}\n" in out and "LD_PRELOAD=(unset)\n" in out, out)
    check("CACHESHIM_TRACE_FILE=t\n" in out and "CACHESHIM_TRACE_FORMAT=jsonl\n" in out, out)
    out, _ = launch("trace", "--cache", "--stats", "-ot2", "--format=text", "--filter", "all",
                    PROG, "env")
    check(f"LD_PRELOAD={SHIM_REAL}\n" in out and f"LD_AUDIT={CACHE_AUDIT}{AUDIT_REAL}\n" in out,
          out)
    for var, val in (("STATS", "1"), ("TRACE_FILE", "t2"), ("TRACE_FORMAT", "text"),
                     ("TRACE_FILTER", "all")):
        check(f"CACHESHIM_{var}={val}\n" in out, f"CACHESHIM_{var} is not {val}: {out}")
    # the environment's format is kept when --format is absent
    out, _ = launch("trace", "-o", "t3", PROG, "env",
                    env=base_env(CACHESHIM_TRACE_FORMAT="perfetto"))
    check("CACHESHIM_TRACE_FORMAT=perfetto\n" in out, out)


def case_options_reach_the_shim():
    _, err = launch("run", "--cap", "64M", "--threshold", "1M", "--verbose", "1", PROG,
                    "alloc", "1", env=base_env(CACHESHIM_CAP="32M"))
    for line in ("cacheshim: CACHESHIM_CAP = 64 MiB (set)",
                 "cacheshim: CACHESHIM_RELEASE_THRESHOLD = 1 MiB (set)",
                 "cacheshim: CACHESHIM_VERBOSE = 1 (set)",
                 "cacheshim: CACHESHIM_STATS = 0 (default)"):
        check(line in err.splitlines(), f"no '{line}' in:\n{err}")
    # --stats: the statistics at exit; none without it
    _, err = launch("run", "--stats", PROG, "alloc", "3")
    check(lines(err, "cacheshim:") and "requests" in err.lower(), f"--stats printed:\n{err}")
    _, err = launch("run", PROG, "alloc", "3")
    check(err == "", f"statistics without --stats:\n{err}")
    # --disable: the shim is loaded and forwards everything
    out, _ = launch("run", "--disable", PROG, "alloc", "4")
    check(field(out, "driver allocations") == "4" and field(out, "shim") == "loaded", out)
    check(field(out, "stats:") == "none", out)


def case_bad_values():
    want = {
        ("--cap", "8X"): f"--cap='8X' is not valid: expected {CAP_ACCEPTED}",
        ("--cap=",): f"--cap='' is not valid: expected {CAP_ACCEPTED}",
        ("--cap", "0"): f"--cap='0' is not valid: expected {CAP_ACCEPTED}",
        ("--cap", "0.4K"): f"--cap='0.4K' is not valid: expected {CAP_ACCEPTED}",
        ("--threshold=-1",): f"--threshold='-1' is not valid: expected {SIZE_ACCEPTED}",
        ("--verbose", "3"): "--verbose='3' is not valid: expected 0, 1 or 2",
        ("--group", "a/b"): "--group='a/b' is not valid: expected none, or a name of 1 to 64 "
                            "letters, digits, '.', '_' and '-' that does not start with '.'",
        ("--verbose", "x\ny"): "--verbose='x\\x0ay' is not valid: expected 0, 1 or 2",
    }
    for args, line in want.items():
        out, err = launch("run", *args, PROG, "args", "0", "ran", rc=2)
        check(err == f"cacheshim run: {line}\n", f"{args}: {err!r}")
        check(out == "", f"{args}: the program ran")
    # from the environment, every bad one reported; an empty one is the default, as for the shim
    env = base_env(CACHESHIM_CAP="8X", CACHESHIM_STATS="maybe", CACHESHIM_VERBOSE="")
    out, err = launch("run", PROG, "args", "0", "ran", rc=2, env=env)
    check(err == f"cacheshim run: CACHESHIM_CAP='8X' in the environment is not valid: expected "
                 f"{CAP_ACCEPTED}\n"
                 "cacheshim run: CACHESHIM_STATS='maybe' in the environment is not valid: "
                 "expected 1, 0, true, false, yes, no, on or off\n", f"environment: {err!r}")
    check(out == "", "the program ran")
    # an option replaces a bad value of the environment
    launch("run", "--cap", "1G", PROG, "args", "0", env=base_env(CACHESHIM_CAP="8X"))
    # trace: its own values; the cache's are checked only when --cache loads the cache
    _, err = launch("trace", "--format", "xml", PROG, "args", "0", rc=2)
    check(err == "cacheshim trace: --format='xml' is not valid: expected text, jsonl or "
                 "perfetto\n", err)
    _, err = launch("trace", "--filter", "cuMem Alloc", PROG, "args", "0", rc=2)
    check(err.startswith("cacheshim trace: --filter='cuMem Alloc' is not valid: expected memory,"),
          err)
    launch("trace", "-o", "t", PROG, "args", "0", env=base_env(CACHESHIM_CAP="8X"))
    _, err = launch("trace", "--cache", "-o", "t2", PROG, "args", "0", rc=2,
                    env=base_env(CACHESHIM_CAP="8X"))
    check(err.startswith("cacheshim trace: CACHESHIM_CAP='8X' in the environment is not valid"),
          err)
    check(not os.path.exists(os.path.join(WORK, "t2")), "traced despite the bad value")


def case_not_found():
    _, err = launch("run", "no-such-program-cacheshim", rc=127)
    check(err == "cacheshim run: 'no-such-program-cacheshim': not found in PATH\n", err)
    _, err = launch("run", "./no-such-program", rc=127)
    check(err == "cacheshim run: cannot run './no-such-program': No such file or directory\n",
          err)
    plain = os.path.join(WORK, "plain")
    with open(plain, "w") as f:
        f.write("#!/bin/sh\necho ran\n")
    _, err = launch("run", plain, rc=126)
    check(err == f"cacheshim run: cannot run '{plain}': Permission denied\n", err)
    _, err = launch("trace", "-o", "t", WORK, rc=126)
    check(err.endswith(f"cacheshim trace: cannot run '{WORK}': Permission denied\n"), err)


# ---------------------------------------------------------------- trace

def jsonl_events(path):
    events = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError as e:
                fail(f"{path}:{n} is not JSON ({e}): {line[:200]}")
    return events


def case_trace_default():
    out, err = launch("trace", PROG, "alloc", "3", env=base_env(ASAN_OPTIONS=
                      "verify_asan_link_order=0:detect_leaks=0"))
    pid = field(out, "pid")
    name = f"cacheshim-trace.launch_prog.{pid}.jsonl"  # the pid of the launcher is the program's
    check(os.listdir(WORK) == [name], f"files: {os.listdir(WORK)}, expected {name}")
    check(err == f"cacheshim trace: tracing to {name}; summarise it with: cacheshim report "
                 f"{name}\n", f"notice: {err!r}")
    ev = jsonl_events(os.path.join(WORK, name))
    allocs = [e for e in ev if e["name"] == "cuMemAlloc_v2"]
    check(len(allocs) == 3 and all(e["lib"] == "driver" for e in allocs), f"events: {ev}")
    check(field(out, "shim") == "not loaded", "trace loaded the cache without --cache")


def case_trace_options():
    env = base_env(ASAN_OPTIONS="verify_asan_link_order=0:detect_leaks=0")
    # --cache: the program's calls reach the shim, the shim's reach the driver
    out, err = launch("trace", "--cache", "--stats", "-o", "cached %p.jsonl", PROG, "alloc", "4",
                      env=env)
    pid = field(out, "pid")
    path = f"cached {pid}.jsonl"
    check(err.startswith(f"cacheshim trace: tracing to '{path}'; summarise it with: cacheshim "
                         f"report '{path}'\n"), f"notice: {err!r}")
    check("requests" in err.lower(), "--stats with --cache printed no statistics")
    ev = jsonl_events(os.path.join(WORK, path))
    n = lambda name, lib: sum(e["name"] == name and e["lib"] == lib for e in ev)
    shim, driver = n("cuMemAlloc_v2", "shim"), n(DRIVER_ALLOC, "driver")
    check(shim == 4 and driver == 1, f"{shim} shim, {driver} driver allocations")
    other = n("cuMemCreate" if CLASSIC else "cuMemAlloc_v2", "driver")
    check(other == 0, f"{other} driver allocations of the other backend")
    # perfetto with every call: one JSON document
    out, err = launch("trace", "--format", "perfetto", "--filter", "all", "-o", "t.json", PROG,
                      "alloc", "2", env=env)
    check(err == "cacheshim trace: tracing to t.json; open it in https://ui.perfetto.dev\n", err)
    with open(os.path.join(WORK, "t.json")) as f:
        doc = json.load(f)
    check(isinstance(doc, list), f"perfetto: not the array form: {str(doc)[:200]}")
    names = [e["name"] for e in doc]
    check(names.count("cuMemAlloc_v2") == 2 and "cuInit" in names, f"perfetto events: {names}")
    # text, named by the launcher with its extension
    out, err = launch("trace", "--format=text", PROG, "alloc", "1", env=env)
    name = f"cacheshim-trace.launch_prog.{field(out, 'pid')}.txt"
    check(err == f"cacheshim trace: tracing to {name} (text; cacheshim report reads --format "
                 "jsonl)\n", err)
    with open(os.path.join(WORK, name)) as f:
        text = f.read()
    check(text.count("[Intercepted] cuMemAlloc_v2(") == 1, f"text trace:\n{text}")
    # to stderr
    out, err = launch("trace", "-o", "stderr", PROG, "alloc", "1", env=env)
    check(err.startswith("cacheshim trace: tracing to stderr\n"), err)
    check(sum(1 for l in err.splitlines() if '"name":"cuMemAlloc_v2"' in l) == 1, err)
    # the trace file from the environment when -o is absent
    launch("trace", PROG, "alloc", "1", env=dict(env, CACHESHIM_TRACE_FILE="from-env.jsonl"))
    check(os.path.exists(os.path.join(WORK, "from-env.jsonl")), "CACHESHIM_TRACE_FILE ignored")


def case_trace_exists():
    open(os.path.join(WORK, "old.jsonl"), "w").close()
    out, err = launch("trace", "-o", "old.jsonl", PROG, "args", "0", "ran", rc=2)
    check(err == "cacheshim trace: old.jsonl exists; the tracer writes only new files: remove "
                 "it or choose another with -o\n", err)
    check(out == "", "the program ran")
    os.symlink("nowhere", os.path.join(WORK, "link"))  # a dangling link is refused too
    launch("trace", "-o", "link", PROG, "args", "0", rc=2)
    # 1000 bytes are a good name (under 1024), but not once each %p is a pid of 2+ digits
    _, err = launch("trace", "-o", "%p" * 500, PROG, "args", "0", "ran", rc=2)
    check(err == "cacheshim trace: the trace file name is too long once %p is expanded\n", err)


# ---------------------------------------------------------------- report, replay, missing parts

def case_dispatch():
    out, _ = launch("replay", "--help")
    check(out.startswith("usage: cacheshim-replay "), f"replay --help: {out!r}")
    out, _ = launch("replay", "--version")
    check(out == f"cacheshim-replay {VERSION}\n", out)
    _, err = launch("replay", "--frob", rc=2)
    check(err == "cacheshim-replay: unknown option --frob (try --help)\n", err)
    out, _ = launch("report", "--help")
    check(out.startswith("usage: cacheshim-report "), f"report --help: {out!r}")
    out, _ = launch("report", "--version")
    check(out == f"cacheshim-report {VERSION}\n", out)
    _, err = launch("report", "no-such.jsonl", rc=2)
    check("no-such.jsonl" in err, f"report of a missing file: {err!r}")


def report_row(text, table, first):
    """The cells of the row of `table` in cacheshim-report's text output whose first cells
    are `first`."""
    section = text.split("\n" + table + "\n", 1)
    check(len(section) == 2, f"no '{table}' table in:\n{text}")
    for line in section[1].split("\n\n", 1)[0].splitlines():
        cells = line.split()
        if cells[:len(first)] == list(first):
            return cells
    fail(f"no row {first} in '{table}':\n{section[1]}")


def case_trace_then_report():
    """What a user does: trace a program with the cache loaded, then report the trace."""
    env = base_env(ASAN_OPTIONS="verify_asan_link_order=0:detect_leaks=0")
    launch("trace", "--cache", "-o", "run.jsonl", PROG, "alloc", "5", env=env)
    out, err = launch("report", "--html", "run.html", "run.jsonl")
    check(err == "", f"report wrote to stderr: {err!r}")
    # the program asked the shim 5 times; the shim went to the driver once (1 MiB, kept
    # cached, given back by the program's trim; pooled, the granule of 2 MiB its slab is on)
    shim = report_row(out, "Calls by name", ("cuMemAlloc_v2", "shim"))
    check(shim[2:4] == ["5", "0"], f"shim row: {shim}")
    driver = report_row(out, "Calls by name", (DRIVER_ALLOC, "driver"))
    check(driver[2:4] == ["1", "0"], f"driver row: {driver}")
    peak = report_row(out, "Bytes in use", ("driver",))
    want = ["1.00", "MiB", "1048576"] if CLASSIC else ["2.00", "MiB", "2097152"]
    check(peak[1:4] == want, f"driver peak: {peak}")
    check(peak[5:7] == ["0", "B"], f"driver at end: {peak}")
    peak = report_row(out, "Bytes in use", ("shim",))
    check(peak[1:4] == ["1.00", "MiB", "1048576"], f"shim peak: {peak}")
    with open(os.path.join(WORK, "run.html")) as f:
        page = f.read()
    check("<svg" in page and "1048576" in page, "the HTML page has no plot or no peak")


def case_missing_parts():
    """A launcher alone in a directory: every part it needs is missing."""
    bindir = os.path.join(WORK, "prefix", "bin")
    os.makedirs(bindir)
    alone = os.path.join(bindir, "cacheshim")
    shutil.copy2(LAUNCHER, alone)
    launch("--version", launcher=alone)
    for cmd, lib in (("run", "libcacheshim.so"), ("trace", "libcacheaudit.so")):
        out, err = launch(cmd, PROG, "args", "0", "ran", rc=125, launcher=alone)
        check(err == f"cacheshim {cmd}: no readable {lib}: looked for {bindir}/{LIBDIR_REL}/{lib} "
                     f"and {bindir}/../{'shim' if cmd == 'run' else 'audit'}/{lib}\n", err)
        check(out == "", "the program ran")
    for tool in ("report", "replay"):
        _, err = launch(tool, "--help", rc=127, launcher=alone)
        check(err == f"cacheshim: '{tool}' is not available: {bindir}/cacheshim-{tool} does not "
                     "exist\n", err)
    with open(os.path.join(bindir, "cacheshim-replay"), "w") as f:
        f.write("not a program")
    _, err = launch("replay", "--help", rc=126, launcher=alone)
    check(err == f"cacheshim: cannot run {bindir}/cacheshim-replay: Permission denied\n", err)
    # found where an install puts it, even in a directory whose name LD_PRELOAD cannot carry
    spaced = os.path.join(WORK, "with space", "bin")
    os.makedirs(spaced)
    shutil.copy2(LAUNCHER, os.path.join(spaced, "cacheshim"))
    libdir = os.path.normpath(os.path.join(spaced, LIBDIR_REL))
    os.makedirs(libdir)
    shutil.copy2(SHIM, os.path.join(libdir, "libcacheshim.so"))
    _, err = launch("run", PROG, "args", "0", rc=125, launcher=os.path.join(spaced, "cacheshim"))
    check(err == f"cacheshim run: cannot put {libdir}/libcacheshim.so in LD_PRELOAD: its path "
                 "contains a colon or a space\n", err)


CASES = {name[5:].replace("_", "-"): fn for name, fn in globals().items()
         if name.startswith("case_")}

if __name__ == "__main__":
    name = CASE[:-len("-classic")] if CLASSIC else CASE
    if name not in CASES:
        fail(f"unknown case; known: {', '.join(CASES)}")
    try:
        CASES[name]()
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    print(f"ok {CASE}")
