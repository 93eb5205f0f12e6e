#!/usr/bin/env python3
"""Tests of cacheshim-replay.

    test_replay.py PART REPLAY TESTDATA TRACES

PART: exact (hand-written traces, every number worked out by hand from the cache's rules in
shim/cs_cache.c: see the comments in each trace), malformed (each bad line with its line
number, exit 2), sweep (the sweep's SVG parsed as XML), jsonl (traces of libcacheaudit.so:
the same events as basic.trace give the same numbers, from the driver's or the shim's calls),
shared (the recorded traces in TRACES; exit 77 when they are absent). Python standard library only."""
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

MiB = 1 << 20
failures = []


def run(replay, *args):
    return subprocess.run([replay, *args], capture_output=True, text=True, timeout=60)


def check(what, got, want):
    if got != want:
        failures.append(f"{what}: got {got!r}, want {want!r}")


def replay_json(replay, *args):
    p = run(replay, "--json", *args)
    if p.returncode != 0:
        failures.append(f"{args}: exit {p.returncode}: {p.stderr.strip()}")
        return []
    return json.loads(p.stdout)["runs"]


def expect(replay, args, want):
    runs = replay_json(replay, *args)
    if len(runs) != 1:
        failures.append(f"{args}: {len(runs)} runs, want 1")
        return
    for k, v in want.items():
        check(f"{' '.join(args)}: {k}", runs[0][k], v)


def part_exact(replay, data):
    t = lambda name: os.path.join(data, name)
    basic = dict(events=8, allocs=3, frees=3, skipped_frees=1, failed_allocs=1,
                 replay_failures=0, hits=1, misses=2, driver_allocs=2, driver_frees=0,
                 peak_live=MiB, peak_reserved=MiB + 4096, releases=0, oom_recoveries=0,
                 oom_failures=0, cap_refusals=0, fences=3, fence_queries=1)
    expect(replay, [t("basic.trace")], basic)
    # The same as gzip, recognised by its magic bytes, whatever the name.
    with tempfile.TemporaryDirectory() as d:
        gz = os.path.join(d, "basic.data")
        with open(t("basic.trace"), "rb") as src, gzip.open(gz, "wb") as dst:
            shutil.copyfileobj(src, dst)
        expect(replay, [gz], basic)
    # Driver time: (3 allocs x 45 + 3 frees x 31) - (2 x 45 + 3 x 0.36 + 1 x 0.30) us: every
    # free of the trace follows work, so each records a fence.
    expect(replay, [t("basic.trace")], dict(baseline_us=228.0, cached_us=91.38, saved_us=136.62))
    expect(replay, ["--alloc-us", "10", "--free-us=1", "--fence-record-us", "0",
                    "--fence-query-us", "0", t("basic.trace")],
           dict(baseline_us=33.0, cached_us=20.0, saved_us=13.0))
    # The GPU 100 us behind: the fence recorded at 20 ns has not completed by 30 ns. Ordered
    # reuse hands the block out all the same; completed reuse takes a new one.
    expect(replay, ["--gpu-lag-us", "100", t("basic.trace")],
           dict(hits=1, misses=2, driver_allocs=2, peak_reserved=MiB + 4096, fences=3))
    expect(replay, ["--gpu-lag-us", "100", "--reuse", "completed", t("basic.trace")],
           dict(hits=0, misses=3, driver_allocs=3, peak_reserved=2 * MiB + 4096, fences=3))
    # Lag 0.011 us = 11 ns: the fence recorded at 20 ns is queried at 30 ns (not yet); with
    # 10 ns it completes at 30 ns, just in time.
    expect(replay, ["--gpu-lag-us", "0.011", t("basic.trace")], dict(hits=1, misses=2))
    expect(replay, ["--gpu-lag-us", "0.011", "--reuse", "completed", t("basic.trace")],
           dict(hits=0, misses=3))
    expect(replay, ["--gpu-lag-us", "0.01", "--reuse", "completed", t("basic.trace")],
           dict(hits=1, misses=2))
    expect(replay, ["--threshold", "1M", t("threshold.trace")],
           dict(hits=1, misses=2, driver_allocs=2, driver_frees=1, releases=1,
                peak_live=2 * MiB, peak_reserved=2 * MiB))
    # A percentage of --device-size: 1/80 of 80 MiB = 1 MiB, the same run.
    expect(replay, ["--device-size", "80M", "--threshold", "1.25%", t("threshold.trace")],
           dict(threshold=MiB, releases=1, driver_frees=1))
    expect(replay, [t("threshold.trace")], dict(releases=0, driver_frees=0, peak_reserved=2 * MiB))
    expect(replay, ["--device-size", "2M", t("oom.trace")],
           dict(hits=0, misses=3, driver_allocs=4, driver_frees=1, releases=1,
                oom_recoveries=1, oom_failures=1, replay_failures=1, dropped_frees=1,
                peak_live=2 * MiB, peak_reserved=2 * MiB, fences=2))
    expect(replay, [t("oom.trace")], dict(oom_recoveries=0, oom_failures=0, driver_allocs=3))
    expect(replay, ["--cap", "3M", t("cap.trace")],
           dict(events=9, allocs=5, frees=4, hits=1, misses=4, driver_allocs=3,
                driver_frees=2, releases=2, cap_refusals=1, replay_failures=1,
                peak_live=3 * MiB, peak_reserved=3 * MiB, cap=3 * MiB))
    # Options and usage.
    p = run(replay, "--version")
    check("--version", (p.returncode, p.stdout.startswith("cacheshim-replay ")), (0, True))
    p = run(replay, "--help")
    check("--help", (p.returncode, "--sweep" in p.stdout), (0, True))
    for bad in (["--cap", "lots", t("basic.trace")], ["--frob", t("basic.trace")], [],
                ["--device-size", "50%", t("basic.trace")], ["--gpu-lag-us", "-1", t("basic.trace")],
                ["--reuse", "soon", t("basic.trace")],
                [os.path.join(data, "no-such.trace")], ["--cap"]):
        p = run(replay, *bad)
        check(f"{bad}: exit", p.returncode, 2)
        check(f"{bad}: message", p.stderr.startswith("cacheshim-replay: ") or
              p.stderr.startswith("usage:"), True)


def part_malformed(replay, data):
    cases = {"bad-kind.trace": (2, "x 1024 10 2"), "bad-number.trace": (3, "a 12x4 20 3"),
             "bad-fields.trace": (4, "f 10"), "bad-null.trace": (1, "a 1024 0 1")}
    for name, (line, text) in cases.items():
        path = os.path.join(data, name)
        p = run(replay, path)
        check(f"{name}: exit", p.returncode, 2)
        check(f"{name}: stderr", p.stderr,
              f"cacheshim-replay: {path}:{line}: malformed line: {text}\n")
        check(f"{name}: stdout", p.stdout, "")
    # A bad file among good ones fails before anything is replayed.
    p = run(replay, os.path.join(data, "basic.trace"), os.path.join(data, "bad-kind.trace"))
    check("good+bad: exit", p.returncode, 2)
    check("good+bad: stdout", p.stdout, "")
    # Generated: a NUL byte, a truncated line, garbage after a valid line, in gzip too.
    with tempfile.TemporaryDirectory() as d:
        for i, (content, line) in enumerate([(b"a 1 10 1\nf 1\x00 2\n", 2),
                                             (b"a 1 10 1\nf", 2),
                                             (b"a 1 10 1 junk\n", 1),
                                             (b"e 1 2\n", 1),
                                             (b"a -5 10 1\n", 1)]):
            for gz in (False, True):
                path = os.path.join(d, f"case{i}{'.gz' if gz else ''}")
                with (gzip.open if gz else open)(path, "wb") as f:
                    f.write(content)
                p = run(replay, path)
                check(f"case {i} gz={gz}: exit", p.returncode, 2)
                check(f"case {i} gz={gz}: prefix",
                      p.stderr.startswith(f"cacheshim-replay: {path}:{line}: malformed line: "),
                      True)


def part_sweep(replay, data):
    traces = [os.path.join(data, "cap.trace"), os.path.join(data, "threshold.trace")]
    caps, thresholds = ["none", "2M", "3M"], ["none", "1M"]
    with tempfile.TemporaryDirectory() as d:
        svg = os.path.join(d, "sweep.svg")
        p = run(replay, "--sweep", "caps=" + ",".join(caps), "--sweep",
                "thresholds=" + ",".join(thresholds), "--plot", svg, *traces)
        check("sweep: exit", (p.returncode, p.stderr), (0, ""))
        check("sweep: table rows", sum(1 for l in p.stdout.splitlines()
                                       if l.startswith("  ") and "cap" not in l), 12)
        root = ET.parse(svg).getroot()
        ns = "{http://www.w3.org/2000/svg}"
        check("svg root", root.tag, ns + "svg")
        points = [c for c in root.iter(ns + "circle") if c.get("class") == "point"]
        check("svg points", len(points), len(traces) * len(caps) * len(thresholds))
        labels = {t.text for t in root.iter(ns + "text") if t.get("class") == "label"}
        want = {f"cap={c} thr={t}" for c in caps for t in thresholds}
        check("svg labels", labels, want)
        check("svg series", {c.get("data-series") for c in points},
              {"cap.trace", "threshold.trace"})
        titles = {t.get("class"): t.text for t in root.iter(ns + "text") if t.get("class")}
        check("svg axis titles", ("peak reserved" in titles.get("xtitle", ""),
                                  "driver calls" in titles.get("ytitle", ""),
                                  bool(titles.get("title"))), (True, True, True))
        # Each point carries its run's numbers: the same as --json gives.
        runs = replay_json(replay, "--caps", ",".join(caps), "--thresholds",
                           ",".join(thresholds), *traces)
        check("json runs", len(runs), 12)
        got = sorted((c.get("data-series"), c.get("data-label"), float(c.get("data-x")),
                      float(c.get("data-y"))) for c in points)
        want = sorted((os.path.basename(r["trace"]), f"cap={r['cap_spec']} thr={r['threshold_spec']}",
                       float(r["peak_reserved"]), float(r["driver_allocs"] + r["driver_frees"]))
                      for r in runs)
        check("svg points = json runs", got, want)
        # cap.trace under a 2 MiB cap: 1 MiB is refused while 2 MiB is held.
        r = [x for x in runs if x["trace"].endswith("cap.trace") and x["cap_spec"] == "2M"][0]
        check("cap 2M refusals", r["cap_refusals"] > 0, True)


def part_shared(replay, traces):
    files = {"resnet.trace.gz": (6653, 6520, 1010.7), "cupy.trace.gz": (1405, 1410, 119.0)}
    present = [f for f in files if os.path.exists(os.path.join(traces, f))]
    if not present:
        print(f"no traces in {traces}: skipped")
        sys.exit(77)
    for name in present:
        allocs, free_lines, peak_mib = files[name]
        runs = replay_json(replay, os.path.join(traces, name))
        if not runs:
            continue
        r = runs[0]
        print(name, json.dumps(r))
        # The numbers of shared/traces/README.md.
        check(f"{name}: allocs", r["allocs"], allocs)
        check(f"{name}: free lines", r["frees"] + r["skipped_frees"], free_lines)
        check(f"{name}: peak live MiB", round(r["peak_live"] / MiB, 1), peak_mib)
        check(f"{name}: requests", r["hits"] + r["misses"], allocs)
        check(f"{name}: hit rate >= 0.9", r["hit_rate"] >= 0.9, True)
        check(f"{name}: no failures", (r["replay_failures"], r["oom_failures"]), (0, 0))
        check(f"{name}: saves time", r["saved_us"] > 0, True)
        # A tight cap costs hits and never lets reserved exceed it.
        cap = r["peak_live"] * 5 // 4
        c = replay_json(replay, "--cap", str(cap), os.path.join(traces, name))[0]
        check(f"{name}: capped reserved <= cap", c["peak_reserved"] <= cap, True)
        check(f"{name}: capped hit rate <= uncapped", c["hit_rate"] <= r["hit_rate"], True)


def jsonl_record(name, lib, frm, ns, args, out, result):
    return json.dumps({"pid": 7, "tid": 7, "ts_ns": ns, "dur_ns": 0, "lib": lib, "from": frm,
                       "name": name, "args": args, "out": out, "result": result,
                       "result_name": None})


def jsonl_of(trace_path, lib, frm):
    """basic.trace's events as libcacheaudit.so records of calls to lib made by frm."""
    lines = []
    for line in open(trace_path):
        f = line.split()
        if not f or f[0].startswith("#"):
            continue
        if f[0] == "a":
            lines.append(jsonl_record("cuMemAlloc_v2", lib, frm, int(f[3]),
                                      {"dptr": "0x10", "bytesize": int(f[1])},
                                      {"dptr": hex(int(f[2], 16))}, 0))
        elif f[0] == "f":
            lines.append(jsonl_record("cuMemFree_v2", lib, frm, int(f[2]),
                                      {"dptr": hex(int(f[1], 16))}, {}, 0))
        else:
            lines.append(jsonl_record("cuMemAlloc_v2", lib, frm, int(f[3]),
                                      {"dptr": "0x10", "bytesize": int(f[1])}, {}, int(f[2])))
    return lines


def part_jsonl(replay, data):
    basic = os.path.join(data, "basic.trace")
    want = replay_json(replay, basic)[0]
    keys = ["events", "allocs", "frees", "skipped_frees", "failed_allocs", "hits", "misses",
            "driver_allocs", "driver_frees", "peak_live", "peak_reserved", "fences"]
    # Program output, a call that is not an allocation, one the shim does not serve
    # (counted as skipped), and in the shim's trace the shim's own driver calls (ignored).
    extra = ["program output", jsonl_record("cuInit", "driver", "app", 1, {"Flags": 0}, {}, 0),
             jsonl_record("cuMemAllocAsync", "driver", "app", 5,
                          {"dptr": "0x10", "bytesize": 64, "hStream": "0x0"},
                          {"dptr": "0x5000"}, 0)]
    shim_own = [jsonl_record("cuMemAlloc_v2", "driver", "shim", 15,
                             {"dptr": "0x10", "bytesize": 8 * MiB}, {"dptr": "0x900000"}, 0)]
    with tempfile.TemporaryDirectory() as d:
        for level, lines in (("driver", extra + jsonl_of(basic, "driver", "app")),
                             ("shim", extra + shim_own + jsonl_of(basic, "shim", "cudart"))):
            path = os.path.join(d, f"{level}.jsonl")
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            runs = replay_json(replay, path)
            if len(runs) != 1:
                failures.append(f"{level}: {len(runs)} runs")
                continue
            for k in keys:
                check(f"jsonl {level}: {k}", runs[0][k], want[k])
            check(f"jsonl {level}: source", runs[0]["source"], "jsonl-" + level)
            check(f"jsonl {level}: skipped_calls", runs[0]["skipped_calls"],
                  1 if level == "driver" else 0)
            p = run(replay, path)
            check(f"jsonl {level}: text", f"  source              JSON Lines: cuMemAlloc/cuMemFree "
                  f"calls at the {level} ({runs[0]['skipped_calls']} other allocation calls "
                  "skipped)\n" in p.stdout, True)
        check("allocation trace: source", want["source"], "alloc")
        # A malformed record: its line number, nothing on stdout, exit 2.
        path = os.path.join(d, "bad.jsonl")
        with open(path, "w") as f:
            f.write(extra[1] + "\n" + '{"pid": 7, "tid": 7, "ts_ns": -1}' + "\n")
        p = run(replay, path)
        check("bad jsonl: exit", p.returncode, 2)
        check("bad jsonl: stderr", p.stderr.startswith(f"cacheshim-replay: {path}:2: malformed "
                                                       "line ("), True)
        check("bad jsonl: stdout", p.stdout, "")


def main():
    part, replay, data, traces = sys.argv[1:5]
    {"exact": lambda: part_exact(replay, data),
     "malformed": lambda: part_malformed(replay, data),
     "sweep": lambda: part_sweep(replay, data),
     "jsonl": lambda: part_jsonl(replay, data),
     "shared": lambda: part_shared(replay, traces)}[part]()
    for f in failures:
        print("FAIL", f)
    print(f"{part}: {'FAIL' if failures else 'PASS'} ({len(failures)} failures)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
