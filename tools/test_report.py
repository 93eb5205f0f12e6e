#!/usr/bin/env python3
"""Tests of cacheshim-report.

    test_report.py exact REPORT TESTDATA
    test_report.py malformed REPORT TESTDATA VERSION
    test_report.py html REPORT TESTDATA
    test_report.py render REPORT TESTDATA RENDER_SCRIPT
    test_report.py recorded REPORT AUDIT_LIB PROG FAKE_DIR CUDART_DIR SHIM_LIB

exact: the hand-written traces in TESTDATA (report-basic.jsonl, report-basic.trace), every
number worked out by hand (see the comments below), plain and gzipped. malformed: every kind
of bad line with its line number, unsupported formats, bad options; exit 2 (1 for an
unwritable page). html: the page parsed with html.parser (the same cells as the text tables,
no scripts, no external resources, escaping) and its SVG with xml.etree (each line's peak and
every column's height against this file's own computation from the trace). render: the page
drawn by headless Chromium through RENDER_SCRIPT, the PNG decoded here (a failure without
Chromium, which scripts/setup installs), then the memory timeline alone: its bands and the
driver's reserved line counted in its pixels. recorded: traces recorded by running
tests/audit/audit_prog under libcacheaudit.so on the fake driver, reported, and checked
against the trace.
Python standard library only.
"""
import gzip
import html.parser
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zlib

MiB = 1 << 20
failures = []


def check(what, got, want):
    if got != want:
        failures.append(f"{what}: got {got!r}, want {want!r}")


def run(report, *args, rc=0):
    p = subprocess.run([report, *args], capture_output=True, timeout=120)
    out, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    if rc is not None and p.returncode != rc:
        failures.append(f"{' '.join(args)}: exit {p.returncode}, want {rc}: {err.strip()[:500]}")
    return out, err


# ---------------------------------------------------------------- reading the text tables

def parse_tables(text):
    """{title: {"note": str, "head": [...], "rows": [[...]]}} from the text output. Columns
    are found from the dashes under the header; a table without them is "key  value"."""
    tables = {}
    for block in text.strip("\n").split("\n\n"):
        lines = block.split("\n")
        title, body = lines[0], lines[1:]
        dash = next((i for i, l in enumerate(body) if re.fullmatch(r"  -+(  -+)*", l)), None)
        t = {"note": "", "head": [], "rows": []}
        if dash is None:
            note_end = 0
            if body and not re.search(r"\S  +\S", body[0]):  # a note has no column gap
                note_end = next((i for i, l in enumerate(body) if re.search(r"\S  +\S", l)),
                                len(body))
            t["note"] = " ".join(l.strip() for l in body[:note_end])
            t["rows"] = [re.split(r"\s{2,}", l.strip(), maxsplit=1) for l in body[note_end:]]
        else:
            t["note"] = " ".join(l.strip() for l in body[:dash - 1])
            spans = [m.span() for m in re.finditer(r"-+", body[dash])]

            def cells(line):
                return [line[a:(b if k + 1 < len(spans) else None)].strip()
                        for k, (a, b) in enumerate(spans)]
            t["head"] = cells(body[dash - 1])
            t["rows"] = [cells(l) for l in body[dash + 1:]]
        tables[title] = t
    return tables


def table(report, *args):
    out, _ = run(report, *args)
    return parse_tables(out)


def expect_rows(what, tables, title, want, head=None):
    t = tables.get(title)
    if t is None:
        failures.append(f"{what}: no table {title!r} in {list(tables)}")
        return
    if head is not None:
        check(f"{what}: {title} head", t["head"], head)
    check(f"{what}: {title} rows", t["rows"], want)


# ---------------------------------------------------------------- an independent reference

ROLES = {}
for n in ["cuMemAlloc", "cuMemAlloc_v2", "cuMemAllocManaged", "cuMemAllocAsync",
          "cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"]:
    ROLES[n] = ("alloc", "dptr", "bytesize")
ROLES["cuMemCreate"] = ("alloc", "handle", "size")
for n in ["cudaMalloc", "cudaMallocAsync", "cudaMallocAsync_ptsz"]:
    ROLES[n] = ("alloc", "devPtr", "size")
ROLES["cuMemAllocPitch"] = ROLES["cuMemAllocPitch_v2"] = ("pitch", "dptr", None)
for n in ["cuMemFree", "cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz"]:
    ROLES[n] = ("free", "dptr", None)
ROLES["cuMemRelease"] = ("free", "handle", None)
for n in ["cudaFree", "cudaFreeAsync", "cudaFreeAsync_ptsz"]:
    ROLES[n] = ("free", "devPtr", None)


def num(v):
    return int(v, 16) if isinstance(v, str) else v


def jsonl_events(path):
    """The trace's records as dicts with: line, lib, name, t, dur, result, result_name,
    role ('alloc', 'free' or None), ptr, size, space ('h' for handles)."""
    evs = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            line = raw.decode("utf-8", "surrogateescape")
            if not line.lstrip().startswith("{"):
                continue
            r = json.loads(line)
            if "object" in r:  # where a library was loaded (call sites)
                continue
            e = dict(line=n, lib=r["lib"], frm=r["from"], name=r["name"], t=r["ts_ns"],
                     dur=r["dur_ns"], result=r["result"], result_name=r.get("result_name"),
                     pid=r["pid"], tid=r["tid"], role=None, ptr=0, size=0, space="")
            role = ROLES.get(r["name"])
            if role:
                kind, pk, sk = role
                e["space"] = "h" if pk == "handle" else ""
                if kind == "free":
                    e["role"], e["ptr"] = "free", num(r["args"][pk])
                else:
                    e["role"] = "alloc"
                    if kind == "pitch":
                        a = r["args"]
                        e["size"] = (r["out"]["pPitch"] * a["Height"] if r["result"] == 0
                                     else a["WidthInBytes"] * a["Height"])
                    else:
                        e["size"] = r["args"][sk]
                    if r["result"] == 0:
                        e["ptr"] = num(r["out"][pk])
            evs.append(e)
    return evs


def when(e):
    return e["t"] if e["role"] == "free" else e["t"] + e["dur"]


def reference(evs, nslices, ncols=840):
    """What the report must say about bytes in use, worked out here from the definitions in
    docs/report.md."""
    evs = sorted(evs, key=lambda e: (when(e), e["line"]))
    t0 = min(e["t"] for e in evs)
    t1 = max(e["t"] + e["dur"] for e in evs)
    span = t1 - t0
    series = {}
    for e in evs:
        if not e["role"]:
            continue
        s = series.setdefault(e["lib"], dict(cur=0, peak=0, peak_t=0, live={}, unknown=0,
                                             changes=[], failed=[]))
        if e["result"] != 0:
            if e["role"] == "alloc":
                s["failed"].append((e, s["cur"]))
            continue
        key = (e.get("pid"), e["space"], e["ptr"])
        if e["role"] == "alloc":
            s["cur"] += e["size"] - s["live"].get(key, 0)
            s["live"][key] = e["size"]
            if s["cur"] > s["peak"]:
                s["peak"], s["peak_t"] = s["cur"], when(e)
        elif key in s["live"]:
            s["cur"] -= s["live"].pop(key)
        else:
            s["unknown"] += 1
        s["changes"].append((when(e), s["cur"]))

    def slices(s, n):
        n = min(n, max(span, 1))
        start = [t0 + span * i // n for i in range(n)] + [t1]
        out = []
        for i in range(n):
            before = [v for w, v in s["changes"] if w <= start[i]]
            inside = [v for w, v in s["changes"]
                      if start[i] <= w and (w < start[i + 1] or i == n - 1)]
            out.append(max([before[-1] if before else 0] + inside))
        return start, out

    for s in series.values():
        s["slices"] = slices(s, nslices)
        s["cols"] = slices(s, ncols)[1]
    return dict(t0=t0, t1=t1, series=series)


def fmt_bytes(b):
    """cs_bytes_format (shim/cs_options.c), line for line."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    if b < 1024:
        return f"{b} B"
    u, v = 0, float(b)
    while v >= 1024.0 and u < 6:
        v /= 1024.0
        u += 1
    while True:
        d = 2 if v < 10.0 else 1 if v < 100.0 else 0
        scale = 10 ** d
        n = int(v * scale + 0.5)
        if d > 0 and n >= 1000:
            v = n / scale
            continue
        if d == 0 and n >= 1024 and u < 6:
            v, u = n / 1024.0, u + 1
            continue
        return f"{n} {units[u]}" if d == 0 else f"{n // scale}.{n % scale:0{d}d} {units[u]}"


def fmt_s(ns):
    return f"{ns // 10**9}.{ns % 10**9 // 1000:06d}"


def fmt_ms(ns):
    return f"{ns // 10**6}.{ns // 1000 % 1000:03d}"


def check_against_reference(what, report, path, nslices):
    """The report's bytes-in-use and timeline tables equal the reference computation, and
    its calls table the counts and times of the trace."""
    evs = jsonl_events(path)
    ref = reference(evs, nslices)
    tables = table(report, "--slices", str(nslices), path)
    libs = [l for l in ["driver", "shim", "runtime"] if l in ref["series"]]
    want = [[l, fmt_bytes(s["peak"]), str(s["peak"]), fmt_s(s["peak_t"]),
             fmt_bytes(s["cur"]), str(len(s["live"])), str(s["unknown"])]
            for l, s in ((l, ref["series"][l]) for l in libs)]
    expect_rows(what, tables, "Bytes in use", want)
    start = ref["series"][libs[0]]["slices"][0] if libs else []
    rows = []
    for i in range(len(start) - 1):
        rows.append([str(i + 1), fmt_s(start[i]), fmt_s(start[i + 1])] +
                    [fmt_bytes(ref["series"][l]["slices"][1][i]) for l in libs])
    if libs:
        expect_rows(what, tables, "Timeline", rows)
    calls = {}
    for e in evs:
        c = calls.setdefault((e["name"], e["lib"]), [0, 0, 0])
        c[0] += 1
        c[1] += e["result"] != 0
        c[2] += e["dur"]
    got = {(r[0], r[1]): r[2:5] for r in tables.get("Calls by name", {"rows": []})["rows"]}
    check(f"{what}: calls by name", got,
          {k: [str(v[0]), str(v[1]), fmt_ms(v[2])] for k, v in calls.items()})
    fails = sorted((e for e in evs if e["role"] == "alloc" and e["result"] != 0),
                   key=lambda e: (when(e), e["line"]))
    got = [r[0] for r in tables.get("Failed allocations", {"rows": []})["rows"]]
    check(f"{what}: failed allocations", got, [str(e["line"]) for e in fails][:20])
    return ref, tables


# ---------------------------------------------------------------- exact: hand-written traces

def part_exact(report, data):
    jl = os.path.join(data, "report-basic.jsonl")
    # report-basic.jsonl: pid 100; thread 100 runs a program with the cache loaded (app ->
    # shim, shim -> driver), thread 101 one using cudart (app -> runtime, cudart -> driver),
    # its lines written last, out of time order. Times in us below (the file has ns).
    # driver: +2 MiB at 3500 (end of the shim's cuMemAlloc_v2), failed 1 GiB at 10000,
    #   +3000000 at 15000 -> 5097152 (peak), -3000000 at 18200 (a free counts at its start),
    #   pitch 1024 x 10 at 20100, cuMemCreate 2 MiB at 21100 -> 4204544, cuMemRelease at 22000,
    #   cuMemFree_v2(0) at 23000: unknown. End 2107392, 2 live.
    # shim: +1 MiB at 5000, +4096 at 7000 -> 1052672 (peak), -1 MiB at 8000, failed 1 GiB.
    # runtime: +3000000 at 17000 (peak), -3000000 at 18000.
    # Span 1000..24100 us: 4 slices start at 1000, 6775, 12550, 18325.
    t = table(report, "--slices", "4", jl)
    expect_rows("jsonl", t, "Trace", [
        ["file", jl], ["format", "JSON Lines (libcacheaudit.so)"], ["events", "18 calls"],
        ["processes", "1"], ["threads", "2"],
        ["time", "0.001000 s to 0.024100 s (0.023100 s)"],
        ["other lines", "1 line not starting with '{' skipped (the program's own output?)"]])
    # Sorted by total time; ties by name. Percentiles: nearest rank of the sorted durations.
    expect_rows("jsonl", t, "Calls by name", [
        ["cuMemAlloc_v2", "shim", "3", "1", "6.000", "2000.000", "2000.000", "3000.000", "3000.000"],
        ["cudaMalloc", "runtime", "1", "0", "4.000", "4000.000", "4000.000", "4000.000", "4000.000"],
        ["cuMemAlloc_v2", "driver", "3", "1", "2.500", "833.333", "1000.000", "1000.000", "1000.000"],
        ["cudaFree", "runtime", "1", "0", "1.000", "1000.000", "1000.000", "1000.000", "1000.000"],
        ["cuMemFree_v2", "driver", "3", "1", "0.560", "186.666", "50.000", "500.000", "500.000"],
        ["cuInit", "driver", "1", "0", "0.500", "500.000", "500.000", "500.000", "500.000"],
        ["cuMemFree_v2", "shim", "2", "1", "0.300", "150.000", "100.000", "200.000", "200.000"],
        ["cuMemAllocPitch_v2", "driver", "1", "0", "0.100", "100.000", "100.000", "100.000", "100.000"],
        ["cuMemCreate", "driver", "1", "0", "0.100", "100.000", "100.000", "100.000", "100.000"],
        ["cuMemRelease", "driver", "1", "0", "0.100", "100.000", "100.000", "100.000", "100.000"],
        ["cuStreamCreate", "driver", "1", "0", "0.100", "100.000", "100.000", "100.000", "100.000"]],
        head=["call", "lib", "calls", "failed", "total ms", "mean us", "p50 us", "p99 us", "max us"])
    expect_rows("jsonl", t, "Calls by caller", [
        ["app", "driver", "6", "0", "0.910", "2", "2.01 MiB", "2"],
        ["app", "shim", "5", "2", "6.300", "2", "1.00 MiB", "1"],
        ["app", "runtime", "2", "0", "5.000", "1", "2.86 MiB", "1"],
        ["shim", "driver", "3", "2", "1.550", "1", "2.00 MiB", "0"],
        ["cudart", "driver", "2", "0", "1.500", "1", "2.86 MiB", "1"]],
        head=["caller", "lib", "calls", "failed", "total ms", "allocations", "bytes allocated",
              "frees"])
    expect_rows("jsonl", t, "Allocation sizes", [
        ["4 KiB", "8 KiB", "0", "0 B", "1", "4.00 KiB", "0", "0 B"],
        ["8 KiB", "16 KiB", "1", "10.0 KiB", "0", "0 B", "0", "0 B"],
        ["1 MiB", "2 MiB", "0", "0 B", "1", "1.00 MiB", "0", "0 B"],
        ["2 MiB", "4 MiB", "3", "6.86 MiB", "0", "0 B", "1", "2.86 MiB"]],
        head=["size from", "below", "driver allocs", "driver bytes", "shim allocs", "shim bytes",
              "runtime allocs", "runtime bytes"])
    expect_rows("jsonl", t, "Bytes in use", [
        ["driver", "4.86 MiB", "5097152", "0.015000", "2.01 MiB", "2", "1"],
        ["shim", "1.00 MiB", "1052672", "0.007000", "4.00 KiB", "1", "0"],
        ["runtime", "2.86 MiB", "3000000", "0.017000", "0 B", "0", "0"]],
        head=["lib", "peak", "peak bytes", "peak at s", "at end", "live at end", "unknown frees"])
    expect_rows("jsonl", t, "Timeline", [
        ["1", "0.001000", "0.006775", "2.00 MiB", "1.00 MiB", "0 B"],
        ["2", "0.006775", "0.012550", "2.00 MiB", "1.00 MiB", "0 B"],
        ["3", "0.012550", "0.018325", "4.86 MiB", "4.00 KiB", "2.86 MiB"],
        ["4", "0.018325", "0.024100", "4.01 MiB", "4.00 KiB", "0 B"]],
        head=["slice", "from s", "to s", "driver max", "shim max", "runtime max"])
    expect_rows("jsonl", t, "Failed allocations", [
        ["8", "0.010000", "cuMemAlloc_v2", "driver", "shim", "1.00 GiB",
         "CUDA_ERROR_OUT_OF_MEMORY", "2.00 MiB"],
        ["7", "0.011000", "cuMemAlloc_v2", "shim", "app", "1.00 GiB", "CUDA_ERROR_OUT_OF_MEMORY",
         "4.00 KiB"]])
    check("jsonl: note of the failures", t["Failed allocations"]["note"],
          "2 failed allocations; in use then: bytes in use through the same library when it "
          "failed.")
    check("jsonl: the cache note", "The cache was loaded: shim is the program's own demand, "
          "driver what the process held on the device (in use plus cached)."
          in t["Bytes in use"]["note"], True)
    check_against_reference("jsonl reference", report, jl, 4)

    # report-basic.trace (allocation format), times in s: +1 MiB at 1, +4096 at 2, +3000 at
    # 3 -> 1055672 (peak), -1 MiB at 4 -> 7096, e 1 GiB at 5, f of an unknown pointer at 6,
    # +8192 at 7 -> 15288, -4096 at 8, +100 at 9, +0 at 9.5, +200 at 10 to a pointer still
    # live (its 100 replaced) -> 11392. Slices of 3 s from 1 s.
    tr = os.path.join(data, "report-basic.trace")
    want = {
        "Trace": [["file", None], ["format", "allocation trace (a, f, e lines)"],
                  ["events", "11 lines"], ["time", "1.000000 s to 10.000000 s (9.000000 s)"]],
        "Calls by name": [["alloc", "trace", "8", "1"], ["free", "trace", "3", "0"]],
        "Allocation sizes": [["0 B", "1 B", "1", "0 B"], ["64 B", "128 B", "1", "100 B"],
                             ["128 B", "256 B", "1", "200 B"], ["2 KiB", "4 KiB", "1", "2.93 KiB"],
                             ["4 KiB", "8 KiB", "1", "4.00 KiB"], ["8 KiB", "16 KiB", "1", "8.00 KiB"],
                             ["1 MiB", "2 MiB", "1", "1.00 MiB"]],
        "Bytes in use": [["trace", "1.01 MiB", "1055672", "3.000000", "11.1 KiB", "4", "1"]],
        "Timeline": [["1", "1.000000", "4.000000", "1.01 MiB"],
                     ["2", "4.000000", "7.000000", "6.93 KiB"],
                     ["3", "7.000000", "10.000000", "14.9 KiB"]],
        "Failed allocations": [["7", "5.000000", "alloc", "trace", "-", "1.00 GiB", "2",
                                "6.93 KiB"]],
    }
    with tempfile.TemporaryDirectory() as d:
        gz = os.path.join(d, "basic.data")  # gzip is told by its magic bytes, not its name
        with open(tr, "rb") as src, gzip.open(gz, "wb") as dst:
            shutil.copyfileobj(src, dst)
        for path in (tr, gz):
            t = table(report, "--slices=3", path)
            want["Trace"][0][1] = path
            for title, rows in want.items():
                expect_rows(path, t, title, rows)
            check(f"{path}: no callers table", "Calls by caller" in t, False)
            check(f"{path}: reused note", "1 allocation returned a pointer still live in the "
                  "trace (its free was not traced): counted as replacing it."
                  in t["Bytes in use"]["note"], True)
    # A trace without memory calls: the tables say so, there is no timeline.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "init.jsonl")
        with open(path, "w") as f:
            f.write(rec(name="cuInit", args={"Flags": 0}, out={}) + "\n")
        t = table(report, path)
        check("no memory calls: tables", list(t), ["Trace", "Calls by name", "Calls by caller",
                                                   "Allocation sizes", "Bytes in use",
                                                   "Failed allocations"])
        check("no memory calls: sizes", t["Allocation sizes"], {
            "note": "No successful allocations.", "head": [], "rows": []})
        check("no memory calls: in use", t["Bytes in use"]["note"],
              "No allocations or frees in the trace.")
        check("no memory calls: failures", t["Failed allocations"]["note"], "None.")
    # Fewer slices than asked when the trace spans fewer nanoseconds.
    with tempfile.TemporaryDirectory() as d:
        short = os.path.join(d, "short.trace")
        with open(short, "w") as f:
            f.write("a 10 1000 100\na 20 2000 102\nf 1000 103\n")
        t = table(report, "--slices", "10", short)
        # slices of 1 ns from 100: [100, 101) 10, [101, 102) 10, [102, 103] 30 then 20
        expect_rows("short", t, "Timeline", [["1", "0.000000", "0.000000", "10 B"],
                                             ["2", "0.000000", "0.000000", "10 B"],
                                             ["3", "0.000000", "0.000000", "30 B"]])
        check("short: note", t["Timeline"]["note"], "The trace's time in 3 equal slices; each "
              "cell is the highest bytes in use during the slice.")


# ---------------------------------------------------------------- malformed input, options

REC = ('{"pid":1,"tid":1,"ts_ns":5,"dur_ns":2,"lib":"driver","from":"app",'
       '"name":"cuMemAlloc_v2","args":{"dptr":"0x10","bytesize":64},"out":{"dptr":"0x20"},'
       '"result":0,"result_name":"CUDA_SUCCESS"}')


DROP = object()  # rec(KEY=DROP): a record without KEY


def rec(**changes):
    r = json.loads(REC)
    r.update(changes)
    for k in [k for k, v in changes.items() if v is DROP]:
        del r[k]
    return json.dumps(r, separators=(",", ":"))


def part_malformed(report, data, version):
    d = tempfile.mkdtemp(prefix="report-malformed-")

    def bad(name, content, want_err, rc=2):
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(content if isinstance(content, bytes) else content.encode())
        out, err = run(report, path, rc=rc)
        check(f"{name}: stderr", err.replace(path, "FILE"), want_err + "\n")
        check(f"{name}: nothing on stdout", out, "")

    def line(n, why, text, col=None):
        at = f" at column {col}" if col else ""
        return f"cacheshim-report: FILE:{n}: malformed line ({why}{at}): {text}"

    cases = [
        # JSON errors in jansson's words, with its column.
        ("truncated", '{"pid":1,"tid"', 2, "JSON: ':' expected near end of file", 14),
        ("member-name", '{"pid":1,}', 2, "JSON: string or '}' expected near '}'", 10),
        ("separator", '{"pid":1 "tid":2}', 2, "JSON: '}' expected near '\"tid\"'", 14),
        ("escape", '{"name":"a\\q"}', 2, "JSON: invalid escape near '\"a\\q'", 12),
        ("uescape", '{"name":"\\u12g4"}', 2, "JSON: invalid escape near '\"\\u12g'", 14),
        ("nul-escape", '{"name":"a\\u0000"}', 2,
         "JSON: \\u0000 is not allowed without JSON_ALLOW_NUL near '\"a\\u0000\"'", 17),
        ("control", '{"name":"a\tb"}', 2, "JSON: control character 0x9 near '\"a'", 10),
        ("unterminated", '{"name":"ab', 2, "JSON: premature end of input near '\"ab'", 11),
        ("leading-zero", '{"pid":01}', 2, "JSON: invalid token near '0'", 8),
        ("number", '{"pid":-}', 2, "JSON: invalid token near '-'", 8),
        ("literal", '{"pid":nul}', 2, "JSON: invalid token near 'nul'", 10),
        ("after", REC + " x", 2, "JSON: end of file expected near 'x'", len(REC) + 2),
        ("args", rec(args=[1]), 2, '"args" and "out" must be objects', None),
        ("stack", rec(stack="0x1"), 2, '"stack" must be an array of at most 64 addresses', None),
        ("stack-item", rec(stack=["0x1", 5.5]), 2,
         '"stack" must be an array of at most 64 addresses', None),
        ("object", '{"pid":1,"object":"/lib/x.so"}', 2,
         'an object record needs "pid", "object" (a path) and "base" (an address)', None),
        ("pid", rec(pid=1.5), 2, '"pid" and "tid" must be integers', None),
        ("tid", rec(tid=DROP), 2, '"pid" and "tid" must be integers', None),
        ("ts", rec(ts_ns=-1), 2, '"ts_ns" and "dur_ns" must be integers >= 0', None),
        ("dur", rec(dur_ns="5"), 2, '"ts_ns" and "dur_ns" must be integers >= 0', None),
        ("lib", rec(lib="gpu"), 2, '"lib" must be "driver", "shim" or "runtime"', None),
        ("from", rec(**{"from": "x"}), 2, '"from" must be "app", "shim" or "cudart"', None),
        ("name", rec(name=""), 2, '"name" must be a non-empty string', None),
        ("result", rec(result="0"), 2, '"result" must be an integer', None),
        ("result-name", rec(result_name=5), 2, '"result_name" must be a string or null', None),
        ("out", rec(out={}), 2, 'a successful allocation without its pointer in "out"', None),
        ("size", rec(args={"dptr": "0x10"}), 2, 'an allocation without its size in "args"', None),
        ("free", rec(name="cuMemFree_v2", args={}), 2, 'a free without its pointer in "args"',
         None),
        ("scope-name", rec(name="cacheshim_scope_begin", lib="shim", args={"name": 5}), 2,
         'cacheshim_scope_begin without its name (a string or null) in "args"', None),
        ("pitch", rec(name="cuMemAllocPitch_v2", args={"dptr": "0x1"}), 2,
         'cuMemAllocPitch without WidthInBytes and Height in "args"', None),
        ("hex", rec(name="cuMemFree_v2", args={"dptr": "0xzz"}), 2,
         'a free without its pointer in "args"', None),
    ]
    for name, text, n, why, col in cases:
        bad(f"{name}.jsonl", REC + "\n" + text + "\n" + REC + "\n", line(n, why, text[:200], col))
    bad("utf8.jsonl", (REC + "\n" + rec(name="bad@@").replace("@@", "\udcff") + "\n").encode(
        "utf-8", "surrogateescape"), line(2, "JSON: unable to decode byte 0xff near '\"bad'",
                                          rec(name="bad@@").replace("@@", "\ufffd"), 77))
    # Zero bytes: a record cut off where the traced program died, followed by the zeros of
    # its space in the file and another thread's record on the same line (docs/report.md);
    # read on. The tracer's note of calls it could not write is said, and read past.
    nul = os.path.join(d, "nul.jsonl")
    with open(nul, "wb") as f:
        f.write((REC + "\n" + REC + "\n{\"a\0\0" + REC + "\n\0\0").encode())
    out, err = run(report, nul, rc=0)
    check("nul.jsonl: stderr", err.replace(nul, "FILE"),
          "cacheshim-report: FILE: 1 record cut off where the traced program died, 3 read\n")
    # A trace read while its program writes it: where a thread had not copied its record
    # yet the tool reads zero bytes, and then the rest of the record, copied by the time it
    # reads on; after part of the record (counted once) or none of it, the rest starting
    # inside a string or with an object (as a record does).
    obj = REC.index('{"dptr"')
    for name, body in (("live-part", REC[:40] + "\0\0\0" + REC[40:]),
                       ("live-part-object", REC[:obj] + "\0" + REC[obj:]),
                       ("live-none", "\0" * obj + REC[obj:])):
        path = os.path.join(d, name + ".jsonl")
        with open(path, "wb") as f:
            f.write((REC + "\n" + body + "\n" + REC + "\n").encode())
        out, err = run(report, path, rc=0)
        check(f"{name}: stderr", err.replace(path, "FILE"),
              "cacheshim-report: FILE: 1 record cut off where the traced program died, 2 read\n")
    note = '{"cacheshim_lost":                  123,"error":"No space left on device"}'
    lost = os.path.join(d, "lost.jsonl")
    with open(lost, "w") as f:
        f.write(REC + "\n" + note + "\n")
    out, err = run(report, lost, rc=0)
    check("lost.jsonl: stderr", err.replace(lost, "FILE"),
          f"cacheshim-report: FILE:2: 123 calls were not written (the tracer's note: {note})\n")
    alloc_why = "expected a SIZE PTR NS, f PTR NS or e SIZE ERR NS"
    bad("alloc-ptr.trace", "a 12 7f00 5\na 12 zz 6\n", line(2, alloc_why, "a 12 zz 6"))
    bad("alloc-kind.trace", "# c\na 12 7f00 5\n\nx 1 2\n", line(4, alloc_why, "x 1 2"))
    bad("alloc-fields.trace", "f 7f00 5 9\n", line(1, alloc_why, "f 7f00 5 9"))
    bad("alloc-after-text.trace", "hello\na 12 7f00 5\n", line(1, alloc_why, "hello"))
    bad("empty.jsonl", "", "cacheshim-report: FILE: no events (expected JSON Lines of "
        "libcacheaudit.so, CACHESHIM_TRACE_FORMAT=jsonl, or an allocation trace: a SIZE PTR NS, "
        "f PTR NS, e SIZE ERR NS)")
    bad("no-records.log", "starting\n\ndone\n", "cacheshim-report: FILE: no events (expected "
        "JSON Lines of libcacheaudit.so, CACHESHIM_TRACE_FORMAT=jsonl, or an allocation trace: "
        "a SIZE PTR NS, f PTR NS, e SIZE ERR NS)")
    bad("perfetto.json", '{"displayTimeUnit":"ns","traceEvents":[\n{"name":"x"}\n]}\n',
        "cacheshim-report: FILE: a Perfetto (Chrome trace event) file; this tool reads JSON "
        "Lines: record again with CACHESHIM_TRACE_FORMAT=jsonl")
    bad("perfetto-array.json", '[\n{"name":"x","ph":"X"},\n{"name":"y","ph":"X"}\n]\n',
        "cacheshim-report: FILE: a Perfetto (Chrome trace event) file; this tool reads JSON "
        "Lines: record again with CACHESHIM_TRACE_FORMAT=jsonl")
    # The program's own output before the first record of a trace on stderr (report.md: lines
    # not starting with '{' are skipped), here a Python list of dicts printed: not a Perfetto
    # file, whose lines are events ("ph") after a first line "[".
    path = os.path.join(d, "printed-list.jsonl")
    with open(path, "w") as f:
        f.write("hello\n[{'step': 1, 'loss': 0.5}]\n"
                '{"pid":1,"tid":1,"ts_ns":1000,"dur_ns":10,"lib":"driver","from":"app","name":'
                '"cuInit","args":{"Flags":0},"out":{},"result":0,"result_name":"CUDA_SUCCESS"}\n')
    expect_rows("printed-list.jsonl", parse_tables(run(report, path)[0]), "Trace", [
        ["file", path], ["format", "JSON Lines (libcacheaudit.so)"], ["events", "1 calls"],
        ["processes", "1"], ["threads", "1"], ["time", "0.000001 s to 0.000001 s (0.000000 s)"],
        ["other lines", "2 lines not starting with '{' skipped (the program's own output?)"]])
    bad("text.log", "[Intercepted] cuInit(Flags=0) = CUDA_SUCCESS [driver, from app, pid 1, "
        "tid 1, at 0.000001 s, 1.000 us]\n", "cacheshim-report: FILE: a text trace "
        "([Intercepted] lines); this tool reads JSON Lines: record again with "
        "CACHESHIM_TRACE_FORMAT=jsonl")
    with open(os.path.join(d, "broken.gz"), "wb") as f:
        f.write(b"\x1f\x8b" + b"\x00" * 30)
    out, err = run(report, os.path.join(d, "broken.gz"), rc=2)
    check("broken gzip: message", err, f"cacheshim-report: {os.path.join(d, 'broken.gz')}: "
          "unknown compression method\n")
    missing = os.path.join(d, "missing.jsonl")
    out, err = run(report, missing, rc=2)
    check("missing file", err, f"cacheshim-report: {missing}: No such file or directory\n")

    # A trace cut anywhere in its last record (a program killed while the tracer wrote it),
    # with and without a zero-filled tail: the records before it are reported, the cut one
    # skipped with a note; a complete last record without its newline counts.
    free = rec(name="cuMemFree_v2", args={"dptr": "0x20"}, out={}, ts_ns=9)
    full = (REC + "\n" + free + "\n").encode()
    last = len(REC) + 1
    for cut in range(last, len(full) + 1):
        for tail in (b"", b"\0" * 5000):
            path = os.path.join(d, f"cut-{cut}-{len(tail)}.jsonl")
            with open(path, "wb") as f:
                f.write(full[:cut] + tail)
            out, err = run(report, path)
            what = f"cut at {cut} of {len(full)}, {len(tail)} zeros"
            whole = full[last:cut].rstrip(b"\n") == free.encode()
            check(f"{what}: events", re.search(r"events +(\d+) calls", out).group(1)
                  if re.search(r"events +(\d+) calls", out) else None, "2" if whole else "1")
            check(f"{what}: note", err, "" if whole or cut == last else
                  f"cacheshim-report: {path}: 1 record cut off where the traced program died, "
                  "1 read\n")

    good = os.path.join(d, "good.jsonl")
    with open(good, "w") as f:
        f.write(REC + "\n")
    usage = [
        ([], None),
        (["--slices", "0", good], "cacheshim-report: --slices: bad value '0' (expected a whole "
         "number from 1 to 1000)"),
        (["--slices=1001", good], "cacheshim-report: --slices: bad value '1001' (expected a "
         "whole number from 1 to 1000)"),
        (["--slices", "4x", good], "cacheshim-report: --slices: bad value '4x' (expected a "
         "whole number from 1 to 1000)"),
        ([good, "--slices"], "cacheshim-report: --slices needs a value (try --help)"),
        ([good, "--html"], "cacheshim-report: --html needs a value (try --help)"),
        (["--html=", good], "cacheshim-report: --html: bad value '' (expected a file name)"),
        (["--bogus", good], "cacheshim-report: unknown option --bogus (try --help)"),
        ([good, good], f"cacheshim-report: one trace at a time: {good} and {good} (try --help)"),
    ]
    for args, want in usage:
        out, err = run(report, *args, rc=2)
        if want is None:
            check(f"{args}: usage", err.startswith("usage: cacheshim-report [OPTIONS] TRACE"), True)
        else:
            check(f"{args}: stderr", err, want + "\n")
        check(f"{args}: stdout", out, "")
    out, err = run(report, "--help")
    check("--help", out.startswith("usage: cacheshim-report [OPTIONS] TRACE\n"), True)
    for opt in ["--html FILE", "--slices N", "--help, --version"]:
        check(f"--help mentions {opt}", opt in out, True)
    out, err = run(report, "--version")
    check("--version", out, f"cacheshim-report {version}\n")
    # A page that cannot be written: exit 1 before any table is printed.
    page = os.path.join(d, "no-such-dir", "r.html")
    out, err = run(report, "--html", page, good, rc=1)
    check("unwritable page", err, f"cacheshim-report: {page}: No such file or directory\n")
    check("unwritable page: no tables", out, "")
    # Never the page over the trace.
    out, err = run(report, "--html", good, good, rc=2)
    check("page over the trace", err, f"cacheshim-report: --html: {good} is the trace itself\n")
    check("page over the trace: the trace is kept", open(good).read(), REC + "\n")
    # `--` ends the options: a trace named like an option.
    dashed = os.path.join(d, "--slices")
    shutil.copy(good, dashed)
    os.chdir(d)
    out, err = run(report, "--", "--slices")
    check("-- then a file", out.startswith("Trace\n"), True)
    shutil.rmtree(d)


# ---------------------------------------------------------------- html: the page and its plot

class Page(html.parser.HTMLParser):
    """Tables by data-table (cell texts), every start tag, the SVG's source span."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.tables, self.cur, self.cell = [], {}, None, None
        self.title, self.in_title = "", False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "table":
            self.cur = self.tables.setdefault(a.get("data-table"), [])
        elif tag == "tr" and self.cur is not None:
            self.cur.append([])
        elif tag in ("td", "th") and self.cur is not None:
            self.cell = ""
        elif tag == "title" and not self.title:
            self.in_title = True  # the page's, not the SVG's

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.cur[-1].append(self.cell)
            self.cell = None
        elif tag == "table":
            self.cur = None
        elif tag == "title":
            self.in_title = False

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data
        if self.in_title:
            self.title += data


def load_page(report, trace, *args):
    d = tempfile.mkdtemp(prefix="report-html-")
    page = os.path.join(d, "r.html")
    out, err = run(report, "--html", page, *args, trace)
    raw = open(page, "rb").read() if os.path.exists(page) else b""
    shutil.rmtree(d)
    try:
        text = raw.decode("utf-8")  # strict: the page must be valid UTF-8
    except UnicodeDecodeError as e:
        failures.append(f"{trace}: page is not UTF-8: {e}")
        text = raw.decode("utf-8", "replace")
    p = Page()
    p.feed(text)
    p.close()
    return out, text, p


def svg_of(what, text):
    m = re.search(r"<svg .*?</svg>", text, re.S)
    if not m:
        failures.append(f"{what}: no <svg> in the page")
        return None
    return ET.fromstring(m.group(0))  # well-formed XML, or the test fails here


NS = "{http://www.w3.org/2000/svg}"


def path_points(d):
    """M x y H x V y H x ... as (x0, x1, y) steps."""
    toks = re.findall(r"[MHV]|-?[0-9.]+", d)
    steps, i = [], 0
    x = y = None
    while i < len(toks):
        c = toks[i]
        if c == "M":
            x, y = float(toks[i + 1]), float(toks[i + 2])
            i += 3
        elif c == "H":
            nx = float(toks[i + 1])
            steps.append((x, nx, y))
            x = nx
            i += 2
        elif c == "V":
            y = float(toks[i + 1])
            i += 2
        else:
            failures.append(f"path: unexpected {c!r}")
            break
    return steps


def check_plot(what, svg, ref):
    """Every series line and peak marker against the reference computed from the trace."""
    if svg is None:
        return
    left, top = float(svg.get("data-left")), float(svg.get("data-top"))
    width, height = float(svg.get("data-width")), float(svg.get("data-height"))
    ymax = float(svg.get("data-y-max-bytes"))
    t0, t1 = int(svg.get("data-t-first-ns")), int(svg.get("data-t-last-ns"))
    check(f"{what}: plot time span", (t0, t1), (ref["t0"], ref["t1"]))
    peak_all = max((s["peak"] for s in ref["series"].values()), default=0)
    check(f"{what}: axis top holds the highest peak", peak_all <= ymax, True)
    y_of = lambda v: top + height - v / ymax * height
    paths = {p.get("data-lib"): p for p in svg.iter(NS + "path") if p.get("class") == "series"}
    peaks = {c.get("data-lib"): c for c in svg.iter(NS + "circle") if c.get("class") == "peak"}
    check(f"{what}: one line per library", sorted(paths), sorted(ref["series"]))
    for lib, s in ref["series"].items():
        p = paths.get(lib)
        if p is None:
            continue
        check(f"{what}: {lib} data-peak-bytes", int(p.get("data-peak-bytes")), s["peak"])
        steps = path_points(p.get("d"))
        check(f"{what}: {lib} columns", len(steps), len(s["cols"]))
        check(f"{what}: {lib} x range", (round(steps[0][0], 2), round(steps[-1][1], 2)),
              (left, left + width))
        ys = [round(y, 2) for _, _, y in steps]
        check(f"{what}: {lib} every column's height", ys, [round(y_of(v), 2) for v in s["cols"]])
        c = peaks.get(lib)
        if s["peak"] == 0:
            check(f"{what}: {lib} no peak marker at 0", c, None)
            continue
        if c is None:
            failures.append(f"{what}: {lib}: no peak marker")
            continue
        check(f"{what}: {lib} marker bytes", int(c.get("data-peak-bytes")), s["peak"])
        check(f"{what}: {lib} marker y", round(float(c.get("cy")), 2), round(y_of(s["peak"]), 2))
        check(f"{what}: {lib} marker on the line's top", round(float(c.get("cy")), 2), min(ys))
        span = t1 - t0
        want_x = left + ((s["peak_t"] - t0) / span * width if span else 0)
        check(f"{what}: {lib} marker x", round(float(c.get("cx")), 2), round(want_x, 2))
        labels = [x.text for x in svg.iter(NS + "text") if x.get("class") == "peak-label"]
        want = f"{lib} peak {fmt_bytes(s['peak'])} at {fmt_s(s['peak_t'])} s"
        check(f"{what}: {lib} peak label", want in labels, True)
    ticks = [float(x.text) for x in svg.iter(NS + "text") if x.get("class") == "tick"]
    titles = [x.text for x in svg.iter(NS + "text") if x.get("class") == "axis-title"]
    check(f"{what}: axis titles", len(titles), 2)
    check(f"{what}: y axis unit", bool(re.fullmatch(r"bytes in use \((B|KiB|MiB|GiB|TiB)\)",
                                                     titles[0] if titles else "")), True)
    check(f"{what}: x axis unit", bool(re.match(r"time \((ns|µs|ms|s)\) after the first event",
                                               titles[1] if len(titles) > 1 else "")), True)
    check(f"{what}: ticks", len(ticks) >= 4, True)


def check_page_tables(what, text_out, page):
    """The page's tables hold the same cells as the text output."""
    tables = parse_tables(text_out)
    ids = {"Trace": "trace", "Calls by name": "calls", "Calls by caller": "callers",
           "Allocation sizes": "sizes", "Bytes in use": "in_use", "Timeline": "timeline",
           "Allocation sites at the peak": "sites", "Failed allocations": "failures",
           "Scopes": "scopes"}
    for title, t in tables.items():
        rows = page.tables.get(ids[title])
        if not t["rows"]:
            check(f"{what}: {title} has no table", rows, None)
            continue
        want = ([t["head"]] if t["head"] else []) + t["rows"]
        check(f"{what}: {title} cells", rows, want)


def check_timeline(what, text, evs):
    """The memory timeline's SVG: well-formed, one band per allocation of the program's
    library (the shim's when there are any) up to the budget, each band's bytes, the
    driver's reserved line when the cache's driver calls are in the trace."""
    m = re.search(r'<svg [^>]*class="plot timeline".*?</svg>', text, re.S)
    if not m:
        failures.append(f"{what}: no memory timeline")
        return
    svg = ET.fromstring(m.group(0))
    libs = {e["lib"] for e in evs if e["role"]}
    prog = "shim" if "shim" in libs else "runtime" if "runtime" in libs else "driver"
    sizes = sorted((e["size"] for e in evs
                    if e["lib"] == prog and e["role"] == "alloc" and e["result"] == 0),
                   reverse=True)
    check(f"{what}: timeline allocations", svg.get("data-allocations"), str(len(sizes)))
    bands = [int(p.get("data-bytes")) for p in svg.iter(NS + "path") if p.get("class") == "band"]
    # Under the budget of 2000 every allocation is a band.
    check(f"{what}: timeline bands", sorted(bands, reverse=True), sizes)
    reserved = [p for p in svg.iter(NS + "path") if p.get("class") == "reserved"]
    check(f"{what}: reserved line", len(reserved), int(prog != "driver" and "driver" in libs))


def check_scope_marks(what, text, names):
    """The memory timeline shades each scope entry, named in its title."""
    m = re.search(r'<svg [^>]*class="plot timeline".*?</svg>', text, re.S)
    if not m:
        failures.append(f"{what}: no memory timeline")
        return
    svg = ET.fromstring(m.group(0))
    marks = [r.get("data-scope") for r in svg.iter(NS + "rect") if r.get("class") == "scope"]
    check(f"{what}: scope marks", marks, names)


def part_html(report, data):
    jl = os.path.join(data, "report-basic.jsonl")
    out, text, page = load_page(report, jl, "--slices", "4")
    check_page_tables("basic", out, page)
    check_plot("basic", svg_of("basic", text), reference(jsonl_events(jl), 4))
    tags = {t for t, _ in page.tags}
    check("no scripts", "script" in tags, False)
    for tag, a in page.tags:
        for k in ("src", "href"):
            if k in a:
                failures.append(f"external resource: <{tag} {k}={a[k]!r}>")
    check("no url() or @import in the style", re.search(r"url\(|@import", text), None)
    check("two svgs: the plot and the memory timeline", sum(t == "svg" for t, _ in page.tags), 2)
    check_timeline("basic", text, jsonl_events(jl))

    # A random trace: 3 threads of a program with the cache loaded, written thread by thread
    # as the tracer does; the plot and the timeline against the reference.
    rnd = random.Random(5)
    d = tempfile.mkdtemp(prefix="report-rand-")
    lines, live = [], {}
    for tid in (11, 12, 13):
        t = rnd.randrange(1000, 5000)
        mine = []
        for i in range(700):
            t += rnd.randrange(100, 20000)
            dur = rnd.randrange(50, 3000)
            if mine and rnd.random() < 0.45:
                ptr = mine.pop(rnd.randrange(len(mine)))
                for lib, frm in (("shim", "app"), ("driver", "shim")):
                    lines.append(dict(pid=7, tid=tid, ts_ns=t, dur_ns=dur, lib=lib, **{"from": frm},
                                      name="cuMemFree_v2", args={"dptr": hex(ptr + (lib == "driver"))},
                                      out={}, result=0, result_name="CUDA_SUCCESS"))
            else:
                size = rnd.choice([512, 4096, 70000, MiB, 3 * MiB + 5, 64 * MiB])
                ptr = (tid << 32) + i * 0x10000
                ok = rnd.random() > 0.03
                for lib, frm in (("shim", "app"), ("driver", "shim")):
                    lines.append(dict(pid=7, tid=tid, ts_ns=t, dur_ns=dur, lib=lib, **{"from": frm},
                                      name="cuMemAlloc_v2",
                                      args={"dptr": "0x7ffc", "bytesize": size + (lib == "driver")},
                                      out={"dptr": hex(ptr + (lib == "driver"))} if ok else {},
                                      result=0 if ok else 2,
                                      result_name="CUDA_SUCCESS" if ok else "CUDA_ERROR_OUT_OF_MEMORY"))
                if ok:
                    mine.append(ptr)
    path = os.path.join(d, "random.jsonl")
    with open(path, "w") as f:
        for r in lines:
            f.write(json.dumps(r) + "\n")
    ref, _ = check_against_reference("random", report, path, 7)
    out, text, page = load_page(report, path, "--slices", "7")
    check_page_tables("random", out, page)
    check_plot("random", svg_of("random", text), ref)
    check_timeline("random", text, jsonl_events(path))
    check("random: failures listed", len(page.tables.get("failures", [])) - 1,
          min(20, sum(len(s["failed"]) for s in ref["series"].values())))

    # Over the budget: 2500 allocations, the 2000 covering most bytes x time get bands.
    many = os.path.join(d, "many.trace")
    allocs = []
    with open(many, "w") as f:
        for i in range(2500):
            size, life = rnd.randrange(1, 1 << 20), rnd.randrange(1, 10 ** 6)
            f.write(f"a {size} {0x1000 + i:x} {10 * i + 1}\n")
            allocs.append((size, 10 * i + 1, life))
        end = 10 * 2500 + 10 ** 6
        for i, (size, t, life) in sorted(enumerate(allocs), key=lambda x: x[1][1] + x[1][2]):
            f.write(f"f {0x1000 + i:x} {t + life}\n")
    out, text, page = load_page(report, many)
    svg = ET.fromstring(re.search(r'<svg [^>]*class="plot timeline".*?</svg>', text, re.S).group(0))
    check("many: bands", svg.get("data-bands"), "2000")
    by_area = sorted(range(2500), key=lambda i: (-allocs[i][0] * allocs[i][2], i))[:2000]
    bands = sorted(int(p.get("data-bytes")) for p in svg.iter(NS + "path")
                   if p.get("class") == "band")
    check("many: the largest by bytes x lifetime", bands, sorted(allocs[i][0] for i in by_area))

    # Names, results and the file name from the trace are escaped; bytes that are not UTF-8
    # become U+FFFD; control characters too.
    evil_name = "<script>alert(\"x\")</script>&'"
    evil = os.path.join(d, "a<b>&c.jsonl")
    with open(evil, "wb") as f:
        f.write(rec(name=evil_name).encode() + b"\n")
        f.write(rec(result=2, result_name="<b>bold</b>", out={}).encode() + b"\n")
        # json.dumps writes the bell as \u0007 and U+FFFD as \ufffd
        f.write(rec(name="bad\ufffd\ufffdbytes\u0007bell").encode() + b"\n")
    out, text, page = load_page(report, evil)
    check("escaped: no script element", any(t == "script" for t, _ in page.tags), False)
    check("escaped: no b element", any(t == "b" for t, _ in page.tags), False)
    names = [r[0] for r in page.tables.get("calls", [])[1:]]
    check("escaped: names", sorted(names),
          sorted([evil_name, "cuMemAlloc_v2", "bad\ufffd\ufffdbytes\ufffdbell"]))
    check("escaped: title", page.title, f"cacheshim report: {evil}")
    fails = page.tables.get("failures", [])
    check("escaped: result name", fails[1][6] if len(fails) > 1 else None, "<b>bold</b>")
    check("text output: control characters shown as ?", "bad\ufffd\ufffdbytes?bell" in out, True)
    shutil.rmtree(d)


# ---------------------------------------------------------------- render: headless Chromium

def png_pixels(path):
    """(width, height, rows of RGB(A) tuples) of an 8-bit RGB or RGBA PNG."""
    raw = open(path, "rb").read()
    if raw[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, hdr = 8, b"", None
    while pos < len(raw):
        n, kind = struct.unpack(">I4s", raw[pos:pos + 8])
        body = raw[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype = hdr[:4]
    if depth != 8 or ctype not in (2, 6):
        raise ValueError(f"PNG depth {depth} colour type {ctype}")
    bpp = 3 if ctype == 2 else 4
    data, stride, prev, rows = zlib.decompress(idat), w * bpp, bytearray(w * bpp), []
    for y in range(h):
        f, line = data[y * (stride + 1)], bytearray(data[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def part_render(report, data, script):
    # Never skipped: scripts/setup installs Chromium (Debian package chromium), in CI too.
    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")):
        print("FAIL render: no chromium found: run scripts/setup (it installs the Debian "
              "package chromium)", file=sys.stderr)
        sys.exit(1)
    d = tempfile.mkdtemp(prefix="report-render-")
    page, png = os.path.join(d, "r.html"), os.path.join(d, "r.png")
    run(report, "--html", page, os.path.join(data, "report-basic.jsonl"))
    p = subprocess.run([script, page, png, "1200x900"], capture_output=True, text=True,
                       timeout=180)
    if p.returncode != 0:
        failures.append(f"render-report: exit {p.returncode}: {p.stderr.strip()}")
    else:
        w, h, bpp, rows = png_pixels(png)
        check("png size", (w, h), (1200, 900))
        colours, blue, red = set(), 0, 0
        for row in rows[::2]:
            for x in range(0, w * bpp, bpp * 2):
                px = row[x:x + 3]
                colours.add(px)
                # the driver line (#1f77b4) and the shim line (#d62728), antialiased
                blue += abs(px[0] - 0x1f) < 40 and abs(px[1] - 0x77) < 40 and abs(px[2] - 0xb4) < 40
                red += abs(px[0] - 0xd6) < 40 and abs(px[1] - 0x27) < 40 and abs(px[2] - 0x28) < 40
        check("png is not blank", len(colours) > 20, True)
        check("the driver line is drawn", blue > 30, True)
        check("the shim line is drawn", red > 30, True)
    # The memory timeline as a browser draws it: its SVG alone on a page of its own size, the
    # pixels inside its plot counted by colour. resnet's recorded trace: its 2,000 largest
    # allocations as bands of the palette's colours; report-basic: the driver's reserved
    # bytes, a dashed black line, over its two bands.
    for trace, want in (("torch-resnet.trace.gz", "bands"), ("report-basic.jsonl", "reserved")):
        run(report, "--html", page, os.path.join(data, trace))
        with open(page) as f:
            html = f.read()
        start = html.find('<svg xmlns="http://www.w3.org/2000/svg" class="plot timeline"')
        end = html.find("</svg>", start)
        check(f"{trace}: a timeline in the page", start >= 0 and end > start, True)
        svg = html[start:end + 6]
        m = re.search(r'width="(\d+)" height="(\d+)"', svg)
        sw, sh = int(m.group(1)), int(m.group(2))
        alone = os.path.join(d, "timeline.html")
        with open(alone, "w") as f:
            f.write('<!DOCTYPE html><html><body style="margin:0">' + svg + "</body></html>")
        p = subprocess.run([script, alone, png, f"{sw}x{sh}"], capture_output=True, text=True,
                           timeout=180)
        if p.returncode != 0:
            failures.append(f"render-report (timeline of {trace}): exit {p.returncode}: "
                            f"{p.stderr.strip()}")
            continue
        w, h, bpp, rows = png_pixels(png)
        # The plot's rectangle (tools/report_timeline.c: ML 90, MT 68, PH 360, MR 30), inside
        # its frame.
        counts = {}
        for y in range(68 + 3, 68 + 360 - 3):
            for x in range(90 + 3, w - 30 - 3):
                px = bytes(rows[y][x * bpp:x * bpp + 3])
                counts[px] = counts.get(px, 0) + 1
        palette = [bytes.fromhex(c) for c in (
            "1f77b4 ff7f0e 2ca02c d62728 9467bd 8c564b e377c2 bcbd22 17becf aec7e8 ffbb78 "
            "98df8a ff9896 c5b0d5 c49c94 f7b6d2 dbdb8d 9edae5 393b79 637939").split()]
        drawn = [c for c in palette if counts.get(c, 0) >= 20]
        # The dashed black line, antialiased: dark grey pixels (no band colour is grey).
        grey = sum(n for px, n in counts.items() if max(px) < 128 and max(px) - min(px) < 16)
        if want == "bands":  # 18 of the 20 colours on 20 pixels or more when this was written
            check(f"{trace}: band colours drawn ({len(drawn)} of the palette's 20)",
                  len(drawn) >= 10, True)
            check(f"{trace}: no reserved line ({grey} dark grey pixels)", grey < 100, True)
        else:  # 1,928 dark grey pixels; the 1 MiB band 7,276 pixels of its colour
            check(f"{trace}: the reserved line drawn ({grey} dark grey pixels)", grey >= 500,
                  True)
            check(f"{trace}: the band drawn ({counts.get(palette[0], 0)} pixels)",
                  counts.get(palette[0], 0) >= 2000, True)
    # The script's own errors.
    p = subprocess.run([script, page], capture_output=True, text=True)
    check("render-report usage", p.returncode, 2)
    p = subprocess.run([script, page, png, "12x"], capture_output=True, text=True)
    check("render-report bad size", (p.returncode, p.stderr.strip()),
          (2, "render-report: size '12x' is not WIDTHxHEIGHT (e.g. 1280x2200)"))
    shutil.rmtree(d)


# ---------------------------------------------------------------- recorded: a real trace

def has_line_tables(path):
    """Does the ELF file at path have a .debug_line section (a build with -g)?"""
    with open(path, "rb") as f:
        elf = f.read()
    if elf[:4] != b"\x7fELF" or elf[4] != 2:  # 64-bit ELF only
        return False
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    strtab_off, = struct.unpack_from("<Q", elf, shoff + shstrndx * shentsize + 0x18)
    for i in range(shnum):
        name, = struct.unpack_from("<I", elf, shoff + i * shentsize)
        end = elf.index(b"\0", strtab_off + name)
        if elf[strtab_off + name:end] == b".debug_line":
            return True
    return False


def part_recorded(report, audit, prog, fake_dir, cudart_dir, shim):
    d = tempfile.mkdtemp(prefix="report-recorded-")

    def record(scenario, name, preload=None, **extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESHIM_")}
        path = os.path.join(d, name)
        env.update(LD_AUDIT=audit, LD_LIBRARY_PATH=fake_dir + ":" + cudart_dir,
                   CACHESHIM_TRACE_FORMAT="jsonl", CACHESHIM_TRACE_FILE=path, **extra)
        # As in tests/audit/check_trace.py: static TLS for a TSan-built program under
        # LD_AUDIT; the shim ahead of the ASan runtime, and no LeakSanitizer with both.
        env.setdefault("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=16777216")
        if preload:
            env["LD_PRELOAD"] = preload
            env["ASAN_OPTIONS"] = "verify_asan_link_order=0:detect_leaks=0"
        p = subprocess.run([prog, scenario], env=env, cwd=d, capture_output=True, text=True,
                           timeout=120)
        if p.returncode != 0:
            failures.append(f"{scenario}: exit {p.returncode}: {p.stderr[-2000:]}")
        return path

    # The program with the cache loaded: 3 allocations asked of the shim (1 MiB, 4 KiB,
    # 70 KiB, each freed), each a driver allocation the cache keeps; a failing free.
    path = record("shim", "shim.jsonl", preload=shim, CACHESHIM_TRACE_FILTER="all")
    ref, t = check_against_reference("shim", report, path, 5)
    rows = {r[0]: r for r in t.get("Bytes in use", {"rows": []})["rows"]}
    check("shim: program's peak", rows.get("shim", [None] * 3)[2], str(MiB))
    check("shim: nothing live in the program at the end", rows.get("shim", [None] * 6)[5], "0")
    callers = {(r[0], r[1]): r for r in t.get("Calls by caller", {"rows": []})["rows"]}
    check("shim: app -> shim allocations", callers.get(("app", "shim"), [None] * 6)[5], "3")
    out, text, page = load_page(report, path)
    check_page_tables("shim page", out, page)
    check_plot("shim page", svg_of("shim page", text), reference(jsonl_events(path), 10))

    # Call sites (CACHESHIM_TRACE_STACK): the allocation sites at the peak, symbolized from
    # the objects the tracer recorded, down to audit_prog.c's line.
    path = record("runtime", "sites.jsonl", CACHESHIM_TRACE_STACK="4")
    objects = [json.loads(l) for l in open(path) if '"object"' in l]
    check("sites: objects recorded", any(o["object"].endswith("audit_prog") for o in objects), True)
    check("sites: build-ids", all(re.fullmatch(r"[0-9a-f]{40}", o["build_id"]) for o in objects),
          True)
    stacks = [json.loads(l)["stack"] for l in open(path) if '"stack"' in l]
    check("sites: every allocation has a stack of at most 4", bool(stacks) and
          all(1 <= len(st) <= 4 for st in stacks), True)
    t = table(report, path)
    sites = t.get("Allocation sites at the peak", {"rows": []})["rows"]
    check("sites: one site holds the runtime peak", [r[1:4] for r in sites],
          [["2.00 MiB", "100.0 %", "1"]])
    # Down to the line where the program has line tables (a release build has none: then
    # the object's name, as the report prints for code without them).
    where = r"audit_prog\.c:\d+" if has_line_tables(prog) else r"audit_prog"
    check("sites: symbolized to the line, or the object without line tables", bool(sites) and
          re.match(r"main \(" + where + r"\) < ", sites[0][4]) is not None, True)
    out, text, page = load_page(report, path)
    check_page_tables("sites page", out, page)

    # Through a shared cudart: the program's cudaMalloc and cudart's cuMemAlloc_v2.
    path = record("runtime", "runtime.jsonl")
    ref, t = check_against_reference("runtime", report, path, 10)
    rows = {r[0]: r for r in t.get("Bytes in use", {"rows": []})["rows"]}
    check("runtime: libraries", sorted(rows), ["driver", "runtime"])
    check("runtime: peak", rows.get("runtime", [None] * 3)[2], str(2 * MiB))

    # Scopes (audit_prog scopes, cacheshim.h): "outer" holds two entries of "inner"; another
    # thread frees outer's first block and allocates 8 MiB that no scope counts.
    path = record("scopes", "scopes.jsonl", preload=shim)
    head = ["scope", "entered", "still open", "allocations", "bytes", "peak", "held at end"]
    t = table(report, path)
    # outer: 1 MiB, 2 x (4 KiB + 64 KiB), 512 KiB = 1712128 B; peak 1 MiB + 2 x 64 KiB + 4 KiB
    # = 1183744 B; held at end 2 x 64 KiB + 512 KiB. inner: 139264 B, peak 69632 B, 64 KiB.
    expect_rows("scopes", t, "Scopes", [
        ["outer", "1", "0", "6", "1.63 MiB", "1.13 MiB", "640 KiB"],
        ["inner", "2", "0", "4", "136 KiB", "68.0 KiB", "64.0 KiB"],
        ['odd "name"?\u00e9???', "1", "0", "0", "0 B", "0 B", "0 B"]], head)
    out, text, page = load_page(report, path)
    check_page_tables("scopes page", out, page)
    check_scope_marks("scopes page", text, ["outer", "inner", "inner", 'odd "name"\ufffd\u00e9???'])
    # The trace cut inside the second "inner" (a program killed there), after its two
    # allocations: both scopes still open, counted to the end of the trace.
    lines = open(path).read().splitlines(keepends=True)
    begins = [i for i, l in enumerate(lines) if '"name":"inner"' in l]
    allocs = [i for i, l in enumerate(lines) if i > begins[1] and '"lib":"shim"' in l and
              '"cuMemAlloc_v2"' in l]
    cut = os.path.join(d, "scopes-cut.jsonl")
    with open(cut, "w") as f:
        f.write("".join(lines[:allocs[1] + 1]) + lines[allocs[1] + 1][:40])
    t = table(report, cut)
    expect_rows("scopes cut", t, "Scopes", [
        ["outer", "1", "1", "5", "1.13 MiB", "1.13 MiB", "1.13 MiB *"],
        ["inner", "2", "1", "4", "136 KiB", "68.0 KiB", "68.0 KiB *"]], head)
    out, text, page = load_page(report, cut)
    check_page_tables("scopes cut page", out, page)
    check_scope_marks("scopes cut page", text, ["outer", "inner", "inner"])
    # Without scopes, no table.
    check("no scopes", "Scopes" in table(report, record("direct", "direct.jsonl")), False)

    # 8 threads of 700 pairs: records written thread by thread, out of time order.
    path = record("threads", "threads.jsonl")
    ref, t = check_against_reference("threads", report, path, 10)
    calls = {(r[0], r[1]): r for r in t.get("Calls by name", {"rows": []})["rows"]}
    check("threads: allocations", calls.get(("cuMemAlloc_v2", "driver"), [None] * 3)[2], "5600")
    rows = {r[0]: r for r in t.get("Bytes in use", {"rows": []})["rows"]}
    check("threads: no unknown frees (a free counts from its start)",
          rows.get("driver", [None] * 7)[6], "0")
    check("threads", t["Trace"]["rows"][4], ["threads", "8"])
    out, text, page = load_page(report, path)
    check_plot("threads page", svg_of("threads page", text), reference(jsonl_events(path), 10))
    shutil.rmtree(d)


if __name__ == "__main__":
    part, args = sys.argv[1], sys.argv[2:]
    args[0] = os.path.abspath(args[0])  # the report binary, from meson relative to the build
    parts = {"exact": part_exact, "malformed": part_malformed, "html": part_html,
             "render": part_render, "recorded": part_recorded}
    if part not in parts:
        sys.exit(f"unknown part {part}; known: {' '.join(parts)}")
    parts[part](*args)
    if failures:
        print("\n".join(failures), file=sys.stderr)
        print(f"{part}: {len(failures)} failures", file=sys.stderr)
        sys.exit(1)
    print(f"{part}: ok")
