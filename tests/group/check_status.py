#!/usr/bin/env python3
"""`cacheshim status` on groups made by tests/group/group_member: members and bytes per
device, a member killed with SIGKILL shown dead, and a spoiled segment refused in one line.

Usage: check_status.py CACHESHIM GROUP_MEMBER
"""
import os
import signal
import subprocess
import sys
import tempfile

cacheshim, member = sys.argv[1], sys.argv[2]
uid = os.getuid()
UUID = "GPU-3f2a1100-dead-beef-0102-030405060708"


def status(d, *groups):
    r = subprocess.run([cacheshim, "status", "--dir", d, *groups], capture_output=True, text=True)
    return r.returncode, r.stdout


def expect(cond, what, out):
    if not cond:
        sys.exit(f"FAIL: {what}\n--- output:\n{out}")


with tempfile.TemporaryDirectory() as d:
    rc, out = status(d)
    expect(rc == 0 and out == f"no groups of uid {uid} in {d}\n", "no groups", out)

    procs = []
    for size in (100 << 20, 200 << 20):
        p = subprocess.Popen([member, d, "train", str(size)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        expect(p.stdout.readline() == "ready\n", "member ready", "")
        procs.append(p)
    rc, out = status(d)
    lines = out.splitlines()
    expect(rc == 0, "exit 0", out)
    expect(lines[0] == f"group train ({d}/cacheshim-{uid}-train): 2 members", "group line", out)
    expect(lines[1] == f"  device {UUID}: 300 MiB held, cap 1.00 GiB", "device line", out)
    rows = sorted(lines[2:])
    expect(len(rows) == 2 and all(r.startswith("    pid ") for r in rows), "member rows", out)
    expect(any(f"pid {procs[0].pid:<8d} group_member" in r and r.endswith(" 100 MiB")
               for r in rows), "first member's row", out)

    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    rc, out = status(d, "train")
    expect(rc == 0 and f"pid {procs[0].pid:<8d} group_member     100 MiB (dead: freed at the "
           "next allocation that needs it)" in out, "the killed member shown dead", out)
    expect("300 MiB held" in out, "its bytes still counted until someone needs them", out)

    # A spoiled segment: refused in one line, the others still listed, exit 1.
    with open(f"{d}/cacheshim-{uid}-spoilt", "wb") as f:
        f.write(b"\0" * 8192)
    os.chmod(f"{d}/cacheshim-{uid}-spoilt", 0o600)
    rc, out = status(d)
    expect(rc == 1, "exit 1 with a refused segment", out)
    expect(f"group spoilt ({d}/cacheshim-{uid}-spoilt): is malformed (not a segment this "
           "cacheshim writes): refused\n" in out, "the refusal", out)
    expect("group train (" in out, "the good group still listed", out)

    rc, out = status(d, "absent")
    expect(rc == 1 and out.startswith(f"group absent ({d}/cacheshim-{uid}-absent): cannot be used"),
           "a named group that does not exist", out)
    for p in procs[1:]:
        p.stdin.close()
        p.wait()
print("ok")
