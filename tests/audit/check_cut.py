#!/usr/bin/env python3
"""The tools read the trace of a program that died: cacheshim-report and cacheshim-replay on
JSON Lines recorded by tests/audit/audit_prog under LD_AUDIT=libcacheaudit.so on the fake
driver.

Usage: check_cut.py REPORT REPLAY AUDIT_LIB PROG FAKE_DIR CUDART_DIR

- cut: a trace of N allocations cut at every byte boundary of its last record, with and
  without a zero tail (what a killed program leaves: the rest of the file's last step of
  growth): both tools succeed, count N-1 allocations (N once the record is whole, its
  newline aside), and say on stderr that a record was cut off.
- busy: a program killed by SIGKILL while 8 threads are in the middle of driver calls: its
  trace is whole lines and zero bytes, the rest of its calls in TRACE.pending; cacheshim-report
  formats them into the file first (and says so), then both tools count every record of it.
- unsealed: a record whose thread was killed before it wrote even its length, in the ring of
  a killed program: passed over, the records after it formatted; also where its length field
  still holds a length an earlier lap left there, longer than the record.
- live: a tool reads the trace of a program still running: its pending file left alone,
  said once; the program then ends by SIGTERM and finishes its trace itself.
- finishers: two tools finish the same killed program's trace at once: the second waits for
  the first, then reads the finished trace.
- perfetto: the same as a Chrome trace: the file as the killed program left it is what
  Perfetto's JSON reader opens (tested against the rules of its reader, perfetto_reads), also
  cut inside an event after its last, and so says the GPU check's reader
  (tests/gpu/count_trace.py); `cacheshim finish` makes it strict JSON.
- version-1: a pending file of the version before the clock (times in ns) is still read.
- pending: a killed program's TRACE.pending damaged (cut short, a header of another kind,
  positions and lengths out of range, an error text without its end): cacheshim-report says
  one line about it, never crashes, and reads the trace; what it formats is valid JSON.
"""
import fcntl
import importlib.util
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

REPORT, REPLAY, AUDIT, PROG, FAKE_DIR, CUDART_DIR = sys.argv[1:7]
COUNT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu", "count_trace.py")
_spec = importlib.util.spec_from_file_location("count_trace", COUNT)
COUNT_TRACE = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(COUNT_TRACE)
WORK = tempfile.mkdtemp(prefix="cacheaudit-cut-")
N = 10
failures = []


def check(what, got, want):
    if got != want:
        failures.append(f"{what}: got {got!r}, want {want!r}")


def record(scenario, *args, rc, path=None, **variables):
    path = path or os.path.join(WORK, f"{scenario}.jsonl")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESHIM_")}
    env.update({"LD_AUDIT": AUDIT, "LD_LIBRARY_PATH": FAKE_DIR + ":" + CUDART_DIR,
                "CACHESHIM_TRACE_FORMAT": "jsonl", "CACHESHIM_TRACE_FILE": path, **variables})
    env.setdefault("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=16777216")
    p = subprocess.run([PROG, scenario, *args], env=env, capture_output=True, timeout=120)
    check(f"{scenario} exit status", p.returncode, rc)
    with open(path, "rb") as f:
        return f.read()


def record_killed_unformatted(path, left=1, **variables):
    """The trace of `die kill N`, recorded again until at least `left` allocations are left
    unformatted in the ring at the kill: the formatter thread, woken every millisecond, now
    and then formats all N first (on a loaded machine)."""
    for _ in range(50):
        for leftover in (path, path + ".pending"):
            if os.path.exists(leftover):
                os.unlink(leftover)
        trace = record("die", "kill", str(N), rc=-9, path=path, **variables)
        if trace.count(b'"cuMemAlloc_v2"') <= N - left:
            break
    check("allocations left in the ring", trace.count(b'"cuMemAlloc_v2"') <= N - left, True)
    return trace


def counts(data):
    """(report's allocation count, replay's allocation count, stderr of both) for a file."""
    path = os.path.join(WORK, "cut.jsonl")
    with open(path, "wb") as f:
        f.write(data)
    rep = subprocess.run([REPORT, path], capture_output=True, text=True, timeout=60)
    rpl = subprocess.run([REPLAY, path], capture_output=True, text=True, timeout=60)
    if rep.returncode or rpl.returncode:
        return None, None, rep.stderr + rpl.stderr
    m = re.search(r"^  cuMemAlloc_v2 +driver +(\d+) ", rep.stdout, re.M)
    r = re.search(r"^  allocations +(\d+)", rpl.stdout, re.M)
    return (int(m.group(1)) if m else 0), (int(r.group(1)) if r else None), rep.stderr + rpl.stderr


def part_cut():
    data = record("die", "_exit", str(N), rc=3)
    lines = data.splitlines(keepends=True)
    check("recorded allocations", sum(b'"cuMemAlloc_v2"' in l for l in lines), N)
    start = len(data) - len(lines[-1])
    for tail in (b"", b"\0" * 4096):
        for cut in range(start, len(data) + 1):
            got_rep, got_rpl, err = counts(data[:cut] + tail)
            whole = cut >= len(data) - 1  # the record is complete without its newline
            want = N if whole else N - 1
            what = f"cut at byte {cut - start} of {len(lines[-1])}, {len(tail)} zero bytes after"
            check(f"report, {what}", got_rep, want)
            check(f"replay, {what}", got_rpl, want)
            cut_off = cut > start and not whole
            said = f"1 record cut off where the traced program died, {want} read" in err
            check(f"the note, {what}: {err.strip()!r}", said, cut_off)


def whole_records(data):
    """cuMemAlloc_v2 records in whole JSON lines, and how many other lines are there. A line
    with zero bytes, or a last line without its newline, is a record cut off where a killed
    program stopped copying text into its file (the readers skip it): neither."""
    text = data.rstrip(b"\0").decode("utf-8", "replace")
    whole, other = 0, 0
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not line or "\0" in line or (i == len(lines) - 1 and not text.endswith("\n")):
            continue
        try:
            whole += json.loads(line)["name"] == "cuMemAlloc_v2"
        except ValueError:
            other += 1
    return whole, other


def part_busy():
    path = os.path.join(WORK, "busy.jsonl")
    before, other = whole_records(record("die-busy", "kill", rc=-9, path=path))
    check("a killed program's file: whole lines, records cut off and zero bytes", other, 0)
    check("its TRACE.pending", os.path.exists(path + ".pending"), True)
    rep = subprocess.run([REPORT, path], capture_output=True, text=True, timeout=60)
    check("report on a killed program's trace", rep.returncode, 0)
    check(f"report says it finished the trace ({rep.stderr.strip()!r})",
          "formatted into it" in rep.stderr, True)
    check("TRACE.pending after report", os.path.exists(path + ".pending"), False)
    with open(path, "rb") as f:
        data = f.read()
    whole, other = whole_records(data)
    check("the finished file: whole records only", (other, b"\0" in data), (0, False))
    check("no record lost in finishing", whole >= before, True)
    got_rep, got_rpl, err = counts(data)
    check(f"report's allocations of a killed 8-thread program ({err.strip()!r})", got_rep, whole)
    check("replay's allocations of a killed 8-thread program", got_rpl, whole)
    check("at least 200 pairs a thread", whole >= 8 * 200, True)


# Offsets in the header of TRACE.pending (audit/ca_ring.h, ca_ring_head).
GEN, DONE, ERROR, CLOCK_GEN, CLOCK = 56, 64, 112, 272, 280


def part_pending():
    path = os.path.join(WORK, "pending.jsonl")
    trace = record("die-busy", "kill", rc=-9, path=path)
    with open(path + ".pending", "rb") as f:
        pending = f.read()
    slot = DONE + 24 * (struct.unpack_from("<Q", pending, GEN)[0] & 1)

    def patched(at, fmt, value):
        p = bytearray(pending)
        struct.pack_into(fmt, p, at, value)
        return bytes(p)

    unended = bytearray(patched(slot + 16, "<Q", 3))  # 3 calls lost, and an error text
    unended[ERROR:ERROR + 160] = b"A" * 160           # without its 0 byte
    cases = {"empty": b"", "cut in its header": pending[:100],
             "cut in its ring": pending[:5000], "another magic": b"X" + pending[1:],
             "raw_done out of range": patched(slot, "<Q", 2**64 - 8),
             "text_end past the trace": patched(slot + 8, "<Q", 2**62),
             "an error without its end": bytes(unended)}
    for what, data in cases.items():
        with open(path, "wb") as f:
            f.write(trace)
        with open(path + ".pending", "wb") as f:
            f.write(data)
        rep = subprocess.run([REPORT, path], capture_output=True, timeout=60)
        err = rep.stderr.decode("utf-8", "replace")
        said = [l for l in err.splitlines() if "formatted into it" in l or "cannot finish" in l]
        check(f"{what}: report's exit status ({err[-300:]!r})", rep.returncode, 0)
        check(f"{what}: one line about the pending file ({err[-300:]!r})", len(said), 1)
        with open(path, "rb") as f:
            text = f.read().rstrip(b"\0")
        # Where the pending file could not be used the trace is as the killed program left
        # it: a batch of text being copied into the file when it died can be there in part
        # (zero bytes, then the rest of a record; or, at the end of the text, a record cut
        # where the copy stopped), which the readers skip and count. Every other line must be
        # JSON: what the tools wrote, the note included.
        lines = text.splitlines()
        for n, line in enumerate(lines):
            if b"\0" in line or (n == len(lines) - 1 and not text.endswith(b"\n")):
                continue
            try:
                json.loads(line)
            except ValueError:
                check(f"{what}: a line of the trace that is not JSON", line[-200:], None)
                break
    try:
        note = json.loads(text.splitlines()[-1])
    except ValueError:
        note = text.splitlines()[-1][-80:]
    check("the note of an error without its end", note, {"cacheshim_lost": 3, "error": "A" * 159})


def part_unsealed():
    """A thread killed right after taking its record's room, before it wrote even the
    record's length: the record is passed over, and the records after it are formatted. What
    its length field holds then is what was there before: zero in the ring's first lap; in a
    later one, what a record of an earlier lap left there, say the length of one that began
    at the same place and was as long as this record and the next together (its end is where
    a whole record of this lap begins): believed, it would pass over the next record too."""
    path = os.path.join(WORK, "unsealed.jsonl")
    trace = record_killed_unformatted(path, left=2)
    with open(path + ".pending", "rb") as f:
        pending = f.read()
    size = struct.unpack_from("<Q", pending, 32)[0]
    pos = struct.unpack_from("<Q", pending,
                             DONE + 24 * (struct.unpack_from("<Q", pending, GEN)[0] & 1))[0]
    ring = 4096

    def sealed(pos):
        return struct.unpack_from("<Q", pending, ring + pos % size)[0] == (~pos & (2**64 - 1))

    # The records: seal (~position), length, then the values; arg[1] of an allocation is its
    # size (audit/ca_ring.h, ca_raw_head: 56 bytes, then the arguments).
    for _ in range(1000):
        at = ring + pos % size
        if not sealed(pos):
            break
        length = struct.unpack_from("<I", pending, at + 8)[0]
        if struct.unpack_from("<Q", pending, at + 56 + 8)[0] == 1 << 20:
            break
        pos += length
    else:
        check("an allocation's record in the ring", None, "found")
    check("a whole record after it", sealed(pos + length), True)
    following = struct.unpack_from("<I", pending, ring + (pos + length) % size + 8)[0]
    for what, stale in (("neither seal nor length", 0),
                        ("an earlier lap's length", length + following)):
        p = bytearray(pending)
        p[at:at + 8] = bytes(8)  # not sealed
        struct.pack_into("<I", p, at + 8, stale)
        with open(path, "wb") as f:
            f.write(trace)
        with open(path + ".pending", "wb") as f:
            f.write(bytes(p))
        rep = subprocess.run([REPORT, path], capture_output=True, text=True, timeout=60)
        check(f"{what}: report says it passed one over ({rep.stderr.strip()!r})",
              "(some cut off in the middle)" in rep.stderr, True)
        with open(path, "rb") as f:
            whole, other = whole_records(f.read())
        check(f"{what}: the allocations after the record never sealed", (whole, other),
              (N - 1, 0))


def part_version_1():
    """A pending file of the version before the clock (cacheshim-pending-1): read, its times
    taken as ns whatever its header holds where the clock now is; a file of this version
    whose clock says ticks makes them ns with it."""
    path = os.path.join(WORK, "v1.jsonl")
    trace = record_killed_unformatted(path, CACHESHIM_TRACE_CLOCK="monotonic")
    with open(path + ".pending", "rb") as f:
        pending = bytearray(f.read())
    check("the version", bytes(pending[:20]), b"cacheshim-pending-2\n")
    # A clock that says ticks, with a single pair (1, 1) (first, slow, slow_next): every time
    # 1 ns when used.
    struct.pack_into("<9Q", pending, CLOCK_GEN, 0, 1, 0, 1, 1, 1, 1, 1, 1)
    for version, ts_zero in ((b"1", 0), (b"2", N)):
        v = version.decode()
        pending[18:19] = version
        with open(path, "wb") as f:
            f.write(trace)
        with open(path + ".pending", "wb") as f:
            f.write(pending)
        rep = subprocess.run([REPORT, path], capture_output=True, text=True, timeout=60)
        check(f"-{v}: report's exit status ({rep.stderr[-300:]!r})", rep.returncode, 0)
        with open(path, "rb") as f:
            data = f.read()
        check(f"-{v}: the allocations", whole_records(data), (N, 0))
        # Made ns by that clock, what the ring held is at the origin (ts 0, clamped); as ns,
        # none is. The file's records (formatted before the kill) are never at 0.
        lines = [json.loads(l) for l in data.rstrip(b"\0").split(b"\n") if l and b"\0" not in l]
        at_zero = sum(e.get("ts_ns") == 0 for e in lines if e.get("name") == "cuMemAlloc_v2")
        check(f"-{v}: allocations at ts 0", at_zero > 0, ts_zero > 0)


def part_finishers():
    """Two tools finish the same trace at once: the second waits for the first (whose lock
    it finds held while the traced process is gone), then reads the finished trace."""
    path = os.path.join(WORK, "twice.jsonl")
    record("die", "kill", str(N), rc=-9, path=path)
    copy = os.path.join(WORK, "twice-copy.jsonl")
    shutil.copy(path, copy)
    shutil.copy(path + ".pending", copy + ".pending")
    subprocess.run([REPLAY, copy], capture_output=True, timeout=60)  # the finished text
    with open(path + ".pending", "rb") as pending:
        fcntl.flock(pending, fcntl.LOCK_EX)  # the first tool, finishing
        second = subprocess.Popen([REPORT, path], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)
        shutil.copy(copy, path)
        os.unlink(path + ".pending")
    out, err = second.communicate(timeout=60)
    check(f"the second tool's exit status ({err.strip()!r})", second.returncode, 0)
    check("the second tool says nothing of the pending file", "pending" in err, False)
    m = re.search(r"^  cuMemAlloc_v2 +driver +(\d+) ", out, re.M)
    check("the second tool's allocations", int(m.group(1)) if m else None, N)


def part_live():
    """A tool reads the trace of a program still running: the pending file is left alone
    (its process holds its lock), said once, and the trace read as far as it is; the
    program, ended by SIGTERM, then finishes its trace itself."""
    path = os.path.join(WORK, "live.jsonl")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESHIM_")}
    env.update(LD_AUDIT=AUDIT, LD_LIBRARY_PATH=FAKE_DIR + ":" + CUDART_DIR,
               CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILE=path,
               CACHESHIM_TRACE_FILTER="all")
    env.setdefault("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=16777216")
    prog = subprocess.Popen([PROG, "bench", "launch", "100000000", "cold"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # Until the first record's text: the file grows by whole steps of zero bytes
    # (posix_fallocate) before the formatter writes into them, so its size says nothing.
    def first_text():
        try:
            with open(path, "rb") as f:
                return b"\n" in f.read(1 << 16)
        except FileNotFoundError:
            return False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (os.path.exists(path + ".pending") and
                                               first_text()):
        time.sleep(0.01)
    # The report reads while the program writes (it reads on as the file grows), and the
    # program is ended while it reads.
    rep = subprocess.Popen([REPORT, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    time.sleep(0.3)
    prog.send_signal(signal.SIGTERM)
    prog.communicate(timeout=60)
    _, err = rep.communicate(timeout=120)
    said = f"is still being written by process {prog.pid}: read as far as it is"
    check(f"report on a live trace ({err.strip()[-300:]!r})", said in err, True)
    check(f"report's exit status on a live trace ({err.strip()[-400:]!r})", rep.returncode, 0)
    check("the program's exit status", prog.returncode, -signal.SIGTERM)
    check("TRACE.pending after the program finished its trace",
          os.path.exists(path + ".pending"), False)
    with open(path, "rb") as f:
        data = f.read()
    check("the finished trace: no zero bytes", b"\0" in data, False)


def perfetto_reads(data):
    """The events Perfetto's JSON reader takes from a Chrome trace as it is (its
    json_trace_tokenizer.cc), or a failure: the array form, whose closing "]" it does
    without (a file of the object form it refuses unclosed); events that whitespace and one
    comma may separate; after the last whole event only whitespace, or the first part of an
    event that the end of the file cuts off (left out). A zero byte, anywhere, is an error
    there. The rules are tests/gpu/count_trace.py's, which the GPU check reads with."""
    check("zero bytes in a Chrome trace left by a killed program", b"\0" in data, False)
    text = data.decode("utf-8", "replace")
    pos = len(text) - len(text.lstrip(" \t\r\n"))
    check("a Chrome trace's first character", text[pos:pos + 1], "[")
    events, reads = COUNT_TRACE.perfetto_reads(text)
    check(f"what Perfetto reads: whole events, then whitespace or the first part of one "
          f"(...{text[-300:]!r})", reads, True)
    return events


def part_perfetto():
    """A program killed by SIGKILL while 8 threads are in the middle of driver calls, traced
    as a Chrome trace: the file as it is is what Perfetto opens (its last events still raw
    in TRACE.pending); `cacheshim finish` then completes it as strict JSON."""
    path = os.path.join(WORK, "busy.json")
    data = record("die-busy", "kill", rc=-9, path=path, CACHESHIM_TRACE_FORMAT="perfetto")
    before = perfetto_reads(data)
    calls = sum(e.get("ph") == "X" for e in before)
    check("calls Perfetto reads in the killed program's file", calls > 0, True)
    check("its TRACE.pending", os.path.exists(path + ".pending"), True)
    # The reader refuses what Perfetto refuses: the first part of an event with another event
    # after it, two commas, the object form left open.
    for bad in ('[\n{"a":"cut   {"b":1},\n  ', '[\n{"a":1,   {"b":1},\n',
                '[\n{"a":1},,\n{"b":1},\n', '{"traceEvents":[\n{"a":1},\n'):
        check(f"perfetto_reads refuses {bad!r}", COUNT_TRACE.perfetto_reads(bad)[1], False)
    # The GPU check's reader (scripts/gpu-check-crash) on that file, and on it cut inside an
    # event after its last (what a death in the middle of a copy leaves): both as Perfetto.
    whole = data[:data.rindex(b"},\n") + 3]  # (a copy that the kill cut short may follow)
    last = whole[whole.rindex(b"\n{", 0, len(whole) - 3) + 1:]
    for what, raw in (("as left", data), ("cut inside an event", whole + last[:57] + b" " * 4096)):
        cut = os.path.join(WORK, "busy-cut.json")
        with open(cut, "wb") as f:
            f.write(raw)
        check(f"Perfetto reads the file {what}", len(perfetto_reads(raw)), len(before))
        got = subprocess.run([sys.executable, COUNT, "perfetto", cut], capture_output=True,
                             text=True, timeout=60)
        check(f"count_trace.py on the file {what} ({got.stderr.strip()[-200:]!r})",
              got.stdout.strip().endswith(f"finished=no events={calls} perfetto_reads=yes"),
              True)
    launcher = os.path.join(os.path.dirname(REPORT), "cacheshim")
    # The same trace as an earlier build wrote it, of the object form: finished with "]}".
    old = os.path.join(WORK, "busy-object.json")
    head = b'{"displayTimeUnit":"ns","traceEvents":[\n'
    with open(path + ".pending", "rb") as f:
        pending = bytearray(f.read())
    slot = DONE + 24 * (struct.unpack_from("<Q", pending, GEN)[0] & 1)
    text_end = struct.unpack_from("<Q", pending, slot + 8)[0]
    struct.pack_into("<Q", pending, slot + 8, text_end + len(head) - 2)
    with open(old, "wb") as f:
        f.write(head + data[2:])
    with open(old + ".pending", "wb") as f:
        f.write(pending)
    fin = subprocess.run([launcher, "finish", old], capture_output=True, text=True, timeout=60)
    check(f"cacheshim finish, object form ({fin.stderr.strip()!r})", fin.returncode, 0)
    with open(old, "rb") as f:
        try:
            doc = json.loads(f.read())
        except ValueError as e:
            doc = str(e)
    check("the object form finished: strict JSON", isinstance(doc, dict) and
          sum(e.get("ph") == "X" for e in doc["traceEvents"]) >= calls, True)
    fin = subprocess.run([launcher, "finish", path], capture_output=True, text=True, timeout=60)
    check(f"cacheshim finish ({fin.stdout.strip()!r} {fin.stderr.strip()!r})",
          (fin.returncode, "formatted into it" in fin.stdout), (0, True))
    with open(path, "rb") as f:
        finished = f.read()
    try:
        after = json.loads(finished)
    except ValueError as e:
        after = []
        check(f"the finished file is strict JSON ({e}): ...{finished[-200:]!r}", False, True)
    check("the finished file: the array form", isinstance(after, list), True)
    after = after if isinstance(after, list) else []
    allocs = sum(e.get("ph") == "X" and e.get("name") == "cuMemAlloc_v2" for e in after)
    check("calls in the finished file", sum(e.get("ph") == "X" for e in after) >= calls, True)
    check("at least 200 allocations a thread", allocs >= 8 * 200, True)


if __name__ == "__main__":
    {"cut": part_cut, "busy": part_busy, "pending": part_pending, "live": part_live,
     "unsealed": part_unsealed, "finishers": part_finishers,
     "version-1": part_version_1, "perfetto": part_perfetto}[sys.argv[7]]()
    for f in failures[:20]:
        print("FAIL", f, file=sys.stderr)
    print(f"{sys.argv[7]}: {len(failures)} failures")
    sys.exit(1 if failures else 0)
