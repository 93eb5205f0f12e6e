#!/usr/bin/env python3
"""`meson install --destdir` checked and used: the expected files in the expected places, the
installed launcher running a program under the installed libraries (also after the whole
installation is moved), and a program built against the installed header with the flags of
the installed cacheshim.pc.

Usage: check_install.py MESON BUILD_DIR PREFIX BINDIR LIBDIR INCLUDEDIR MANDIR PROG FAKE_DIR
                        API_SRC CC SANITIZE PKG_CONFIG VERSION

Exit 0 on success, 1 with a message on failure.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

(MESON, BUILD, PREFIX, BINDIR, LIBDIR, INCLUDEDIR, MANDIR, PROG, FAKE_DIR, API_SRC, CC,
 SANITIZE, PKG_CONFIG, VERSION) = sys.argv[1:15]
WORK = tempfile.mkdtemp(prefix="cacheshim-install-")
DEST = os.path.join(WORK, "dest")


def fail(msg):
    print(f"FAIL install: {msg}", file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def run(cmd, rc=0, **kw):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CACHESHIM_") and k not in ("LD_PRELOAD", "LD_AUDIT")}
    env["LD_LIBRARY_PATH"] = FAKE_DIR
    env["ASAN_OPTIONS"] = "verify_asan_link_order=0:detect_leaks=0"
    env.setdefault("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=16777216")
    env.update(kw.pop("env", {}))
    p = subprocess.run(cmd, env=env, cwd=WORK, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=240, **kw)
    if p.returncode != rc:
        fail(f"{cmd}: exit {p.returncode}, expected {rc}\nstdout: {p.stdout[-2000:]}\n"
             f"stderr: {p.stderr[-3000:]}")
    return p.stdout


def under_prefix(d):
    """An install directory relative to DEST/PREFIX's root: meson's options may be absolute."""
    return os.path.normpath(d if os.path.isabs(d) else os.path.join(PREFIX, d)).lstrip("/")


def installed_files():
    found = set()
    for root, _, files in os.walk(DEST):
        for f in files:
            found.add(os.path.relpath(os.path.join(root, f), DEST))
    return found


def check_launcher(root):
    """The installed launcher under root (DEST/PREFIX, or where it was moved)."""
    rel = lambda d: os.path.join(root, os.path.relpath("/" + under_prefix(d), PREFIX))
    launcher = os.path.join(rel(BINDIR), "cacheshim")
    check(run([launcher, "--version"]) == f"cacheshim {VERSION}\n", "--version")
    out = run([launcher, "run", PROG, "alloc", "10"])
    check("shim loaded\n" in out and "stats: requests 10 hits 9\n" in out, f"run:\n{out}")
    shim = os.path.realpath(os.path.join(rel(LIBDIR), "libcacheshim.so"))
    audit = os.path.realpath(os.path.join(rel(LIBDIR), "libcacheaudit.so"))
    # the cache preloaded and as an audit module, ahead of the tracer; a sanitized build
    # only preloads; --no-bind only preloads
    cache_audit = f"{shim}:" if SANITIZE == "none" else ""
    run_audit = f"LD_AUDIT={shim}\n" if cache_audit else "LD_AUDIT=(unset)\n"
    out = run([launcher, "run", PROG, "env"])
    check(f"LD_PRELOAD={shim}\n" in out, f"run did not preload the installed {shim}:\n{out}")
    check(run_audit in out, f"run did not audit with the installed cache:\n{out}")
    out = run([launcher, "run", "--no-bind", PROG, "env"])
    check(f"LD_PRELOAD={shim}\n" in out and "LD_AUDIT=(unset)\n" in out,
          f"run --no-bind audited:\n{out}")
    out = run([launcher, "trace", "--cache", "-o", "env.%p.jsonl", PROG, "env"])
    check(f"LD_PRELOAD={shim}\n" in out and f"LD_AUDIT={cache_audit}{audit}\n" in out,
          f"trace did not load the installed libraries:\n{out}")
    out = run([launcher, "trace", "--cache", "--no-bind", "-o", "env2.%p.jsonl", PROG, "env"])
    check(f"LD_PRELOAD={shim}\n" in out and f"LD_AUDIT={audit}\n" in out,
          f"trace --no-bind did not load the installed libraries:\n{out}")
    trace = os.path.join(WORK, "t.jsonl")
    if os.path.exists(trace):
        os.unlink(trace)
    run([launcher, "trace", "-o", trace, PROG, "alloc", "2"])
    with open(trace) as f:
        events = [json.loads(line) for line in f]
    check(sum(e["name"] == "cuMemAlloc_v2" for e in events) == 2, f"trace: {events}")
    check(run([launcher, "replay", "--version"]) == f"cacheshim-replay {VERSION}\n",
          "replay through the installed launcher")
    out = run([launcher, "report", trace])
    row = [l.split() for l in out.splitlines() if l.split()[:2] == ["cuMemAlloc_v2", "driver"]]
    check(len(row) == 1 and row[0][2] == "2", f"report through the installed launcher:\n{out}")
    return launcher


def main():
    run([MESON, "install", "-C", BUILD, "--no-rebuild", "--quiet", "--destdir", DEST])

    bindir, libdir, incdir, mandir = (under_prefix(d) for d in (BINDIR, LIBDIR, INCLUDEDIR,
                                                                MANDIR))
    expected = {
        f"{bindir}/cacheshim", f"{bindir}/cacheshim-replay", f"{bindir}/cacheshim-report",
        f"{libdir}/libcacheshim.so", f"{libdir}/libcacheaudit.so",
        f"{libdir}/pkgconfig/cacheshim.pc", f"{incdir}/cacheshim.h",
        f"{mandir}/man1/cacheshim.1", f"{mandir}/man1/cacheshim-replay.1",
        f"{mandir}/man1/cacheshim-report.1",
        f"{mandir}/man3/cacheshim.3",
    }
    found = installed_files()
    check(expected <= found, f"missing: {sorted(expected - found)}")
    check(found <= expected, f"unexpected: {sorted(found - expected)}")
    for f in (f"{bindir}/cacheshim", f"{bindir}/cacheshim-replay", f"{bindir}/cacheshim-report"):
        check(os.access(os.path.join(DEST, f), os.X_OK), f"{f} is not executable")

    root = os.path.join(DEST, PREFIX.lstrip("/"))
    launcher = check_launcher(root)

    # pkg-config: the header's directory, no libraries, the libraries' paths as variables
    pc_env = {"PKG_CONFIG_PATH": os.path.join(DEST, libdir, "pkgconfig"),
              "PKG_CONFIG_LIBDIR": ""}
    pkg = [PKG_CONFIG, f"--define-variable=prefix={root}"]
    check(run(pkg + ["--modversion", "cacheshim"], env=pc_env).strip() == VERSION, "version")
    cflags = run(pkg + ["--cflags", "cacheshim"], env=pc_env).split()
    check(cflags == [f"-I{os.path.join(DEST, incdir)}"], f"--cflags: {cflags}")
    check(run(pkg + ["--libs", "cacheshim"], env=pc_env).strip() == "", "--libs is not empty")
    for var, lib in (("libcacheshim", "libcacheshim.so"), ("libcacheaudit", "libcacheaudit.so")):
        path = run(pkg + [f"--variable={var}", "cacheshim"], env=pc_env).strip()
        check(path == os.path.join(DEST, libdir, lib), f"{var} = {path}")

    # a program built against the installed header, strict C11 and GNU C, no link flag
    sanitize = [] if SANITIZE == "none" else [f"-fsanitize={SANITIZE}"]
    for std in ("-std=c11", "-std=gnu11"):
        exe = os.path.join(WORK, "api_prog" + std[5:])
        run(shlex.split(CC) + [std, "-Wall", "-Wextra", "-Wpedantic", "-Werror"] + cflags +
            sanitize + [API_SRC, "-o", exe])
        out = run([exe])
        check(out == f"version {VERSION}\nloaded 0\nstats not loaded\ntrim not loaded 0\n",
              f"{std}, without the shim:\n{out}")
        out = run([launcher, "run", exe])
        check(out == f"version {VERSION}\nloaded 1\nstats ok\ntrim ok 0\n",
              f"{std}, under cacheshim run:\n{out}")

    # C++ too, where a C++ compiler is installed (scripts/setup installs only gcc)
    cxx = shutil.which("g++")
    if cxx:
        exe = os.path.join(WORK, "api_prog_cxx")
        run([cxx, "-x", "c++", "-std=c++11", "-Wall", "-Wextra", "-Wpedantic", "-Werror"] +
            cflags + sanitize + [API_SRC, "-o", exe])
        check(run([launcher, "run", exe]) == f"version {VERSION}\nloaded 1\nstats ok\ntrim ok 0\n",
              "C++, under cacheshim run")
    else:
        print("C++: not checked, no g++")

    # relocatable: the whole installation moved elsewhere still runs
    moved = os.path.join(WORK, "moved")
    shutil.move(root, moved)
    check_launcher(moved)


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    print("ok install")
