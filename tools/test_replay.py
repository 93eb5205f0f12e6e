#!/usr/bin/env python3
"""Tests of cacheshim-replay.

    test_replay.py PART REPLAY TESTDATA TRACES

PART: exact (hand-written traces, every number worked out by hand from the cache's rules in
shim/cs_cache.c: see the comments in each trace), malformed (each bad line with its line
number, exit 2), sweep (the sweep's SVG parsed as XML), jsonl (traces of libcacheaudit.so:
the same events as basic.trace give the same numbers, from the driver's or the shim's calls),
expandable (--vs-expandable: the model of PyTorch's expandable segments on hand-written
traces, every number worked out by hand from its rules in tools/replay_expandable.c; the
output without the flag unchanged; the recorded traces), shared (the recorded traces in TRACES;
exit 77 when they are absent). Python standard library only."""
import gzip
import json
import os
import re
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
    classic = ["--backend", "classic"]
    # Pooled (the default, 2 MiB granules): 1 MiB and 4 KiB are slots of one small range; the
    # 4 KiB slab is made on its free pages with no driver call: a hit.
    basic = dict(events=8, allocs=3, frees=3, skipped_frees=1, failed_allocs=1,
                 replay_failures=0, hits=2, misses=1, driver_allocs=1, driver_frees=0,
                 peak_live=MiB, peak_reserved=2 * MiB, releases=0, oom_recoveries=0,
                 oom_failures=0, cap_refusals=0, fences=3, fence_queries=0,
                 backend="pooled", granularity=2 * MiB, moves=0, chunk_creates=1,
                 chunk_releases=0, chunk_maps=1, chunk_unmaps=0)
    expect(replay, [t("basic.trace")], basic)
    # Classic: a block of each, one cuMemAlloc each.
    basic_classic = dict(basic, hits=1, misses=2, driver_allocs=2, peak_reserved=MiB + 4096,
                         backend="classic",
                         chunk_creates=0, chunk_maps=0)
    expect(replay, classic + [t("basic.trace")], basic_classic)
    # The same as gzip, recognised by its magic bytes, whatever the name.
    with tempfile.TemporaryDirectory() as d:
        gz = os.path.join(d, "basic.data")
        with open(t("basic.trace"), "rb") as src, gzip.open(gz, "wb") as dst:
            shutil.copyfileobj(src, dst)
        expect(replay, [gz], basic)
    # Driver time: 3 allocs x 45 + 3 frees x 31 = 228 us without the cache. Every free of the
    # trace follows work, so each records a fence: 3 x 0.36; no query (the trace is one stream:
    # a hit is ordered after the work instead of asking). Pooled: 1 chunk created (12) and
    # mapped (33); classic: 2 cuMemAlloc (2 x 45).
    expect(replay, [t("basic.trace")], dict(baseline_us=228.0, cached_us=46.08, saved_us=181.92))
    expect(replay, classic + [t("basic.trace")],
           dict(baseline_us=228.0, cached_us=91.08, saved_us=136.92))
    expect(replay, classic + ["--alloc-us", "10", "--free-us=1", "--fence-record-us", "0",
                              "--fence-query-us", "0", t("basic.trace")],
           dict(baseline_us=33.0, cached_us=20.0, saved_us=13.0))
    # The pooled costs have options of their own; --alloc-us is then only the baseline's.
    expect(replay, ["--alloc-us", "10", "--free-us=1", "--fence-record-us", "0",
                    "--fence-query-us", "0", "--create-us", "2", "--map-us=3", t("basic.trace")],
           dict(baseline_us=33.0, cached_us=5.0, saved_us=28.0))
    # The GPU 100 us behind: the fence recorded at 20 ns has not completed by 30 ns. Ordered
    # reuse hands the block out all the same; completed reuse takes a new one (classic: a
    # cuMemAlloc; pooled: the second 1 MiB slab of the same granule, no new memory). Pooled,
    # the two 1 MiB slabs then fill the granule, so 4 KiB takes a second one: both 1 MiB
    # blocks are still busy, nothing can move. (A slot on free pages of a slab: a hit.)
    expect(replay, ["--gpu-lag-us", "100", t("basic.trace")],
           dict(hits=2, misses=1, driver_allocs=1, peak_reserved=2 * MiB, fences=3))
    expect(replay, ["--gpu-lag-us", "100", "--reuse", "completed", t("basic.trace")],
           dict(hits=1, misses=2, driver_allocs=2, peak_reserved=4 * MiB, fences=3,
                chunk_creates=2, moves=0))
    expect(replay, classic + ["--gpu-lag-us", "100", t("basic.trace")],
           dict(hits=1, misses=2, driver_allocs=2, peak_reserved=MiB + 4096, fences=3))
    expect(replay, classic + ["--gpu-lag-us", "100", "--reuse", "completed", t("basic.trace")],
           dict(hits=0, misses=3, driver_allocs=3, peak_reserved=2 * MiB + 4096, fences=3))
    # Lag 0.011 us = 11 ns: the fence recorded at 20 ns is queried at 30 ns (not yet); with
    # 10 ns it completes at 30 ns, just in time.
    expect(replay, ["--gpu-lag-us", "0.011", t("basic.trace")], dict(hits=2, misses=1))
    expect(replay, ["--gpu-lag-us", "0.011", "--reuse", "completed", t("basic.trace")],
           dict(hits=2, misses=1))  # both carved out of the granule's free pages
    expect(replay, ["--gpu-lag-us", "0.01", "--reuse", "completed", t("basic.trace")],
           dict(hits=2, misses=1))
    # Threshold: classic gives the oldest block back to the driver. Pooled: its slot goes
    # back to the pool, the granule stays (the other 1 MiB slab is in use).
    expect(replay, classic + ["--threshold", "1M", t("threshold.trace")],
           dict(hits=1, misses=2, driver_allocs=2, driver_frees=1, releases=1,
                peak_live=2 * MiB, peak_reserved=2 * MiB))
    expect(replay, ["--threshold", "1M", t("threshold.trace")],
           dict(hits=2, misses=1, driver_allocs=1, driver_frees=0, releases=0,
                peak_live=2 * MiB, peak_reserved=2 * MiB, chunk_creates=1, chunk_unmaps=0,
                fence_queries=1))
    # 1 MiB granules: each block a granule, the oldest's chunk unmapped and released.
    expect(replay, ["--granularity", "1M", "--threshold", "1M", t("threshold.trace")],
           dict(granularity=MiB, hits=1, misses=2, driver_allocs=2, driver_frees=1,
                releases=1, peak_reserved=2 * MiB, chunk_creates=2, chunk_maps=2,
                chunk_unmaps=1, chunk_releases=1, moves=0))
    # A percentage of --device-size: 1/80 of 80 MiB = 1 MiB, the same run.
    expect(replay, classic + ["--device-size", "80M", "--threshold", "1.25%",
                              t("threshold.trace")],
           dict(threshold=MiB, releases=1, driver_frees=1))
    expect(replay, [t("threshold.trace")], dict(releases=0, driver_frees=0, peak_reserved=2 * MiB))
    expect(replay, classic + [t("threshold.trace")],
           dict(releases=0, driver_frees=0, peak_reserved=2 * MiB))
    # Out of memory: classic recovers by giving the idle block back (the refused call is no
    # driver allocation); pooled has the freed large block's memory in the pool's free space
    # already (it joined at its free), and its chunk moves to the arena's top for the small
    # range: no new memory, no out-of-memory.
    expect(replay, classic + ["--device-size", "2M", t("oom.trace")],
           dict(hits=0, misses=3, driver_allocs=2, driver_frees=1, releases=1,
                oom_recoveries=1, oom_failures=1, replay_failures=1, dropped_frees=1,
                peak_live=2 * MiB, peak_reserved=2 * MiB, fences=2))
    expect(replay, ["--device-size", "2M", t("oom.trace")],
           dict(hits=0, misses=3, driver_allocs=1, driver_frees=0, releases=0,
                oom_recoveries=0, oom_failures=1, replay_failures=1, dropped_frees=1,
                peak_live=2 * MiB, peak_reserved=2 * MiB, fences=2, moves=0,
                chunk_creates=1, chunk_releases=0, chunk_maps=2, chunk_unmaps=1,
                cached_us=99.02))
    expect(replay, classic + [t("oom.trace")],
           dict(oom_recoveries=0, oom_failures=0, driver_allocs=3))
    expect(replay, [t("oom.trace")],
           dict(oom_recoveries=0, oom_failures=0, driver_allocs=2, moves=0, chunk_creates=3))
    # The cap: see the trace's comment for both backends.
    expect(replay, classic + ["--cap", "3M", t("cap.trace")],
           dict(events=9, allocs=5, frees=4, hits=0, misses=5, driver_allocs=3,
                driver_frees=1, releases=1, cap_refusals=2, replay_failures=2,
                dropped_frees=1, peak_live=3 * MiB, peak_reserved=3 * MiB, cap=3 * MiB,
                fences=3))
    expect(replay, ["--cap", "3M", t("cap.trace")],
           dict(events=9, allocs=5, frees=4, hits=0, misses=5, driver_allocs=1,
                driver_frees=1, releases=1, cap_refusals=4, replay_failures=4,
                dropped_frees=3, peak_live=2 * MiB, peak_reserved=2 * MiB, cap=3 * MiB,
                fences=1, moves=0, chunk_creates=1, chunk_releases=1, chunk_maps=1,
                chunk_unmaps=1))
    # headroom.trace: a large block's memory joins the pool's free space at its free whatever
    # the headroom, and the next block is carved out of its span (carved: no driver call, a
    # hit; no move).
    moved = dict(hits=2, misses=1, driver_allocs=1, driver_frees=0, moves=0,
                 chunk_creates=2, chunk_releases=0, chunk_maps=2, chunk_unmaps=0,
                 peak_live=4 * MiB, peak_reserved=4 * MiB, releases=0)
    for headroom in ([], ["--headroom", "0"], ["--headroom", "49"], ["--headroom", "50"],
                     ["--headroom=1000"]):
        expect(replay, headroom + [t("headroom.trace")], moved)
    expect(replay, classic + ["--headroom", "0", t("headroom.trace")],
           dict(hits=1, misses=2, driver_allocs=2, driver_frees=0, moves=0, chunk_creates=0,
                peak_reserved=6 * MiB))
    # headroom-small.trace: the idle small block goes back to its slab before new memory
    # whatever the headroom (its range a free granule at the arena's top); what the headroom
    # decides is whether that granule's chunk moves into the new block (below 500 %) or the
    # block takes new memory (from 500 % on).
    small_moved = dict(hits=0, misses=2, driver_allocs=2, driver_frees=0, moves=1,
                       chunk_creates=2, chunk_releases=0, chunk_maps=3, chunk_unmaps=1,
                       peak_reserved=4 * MiB)
    small_kept = dict(small_moved, chunk_creates=3, chunk_maps=3, chunk_unmaps=0,
                      peak_reserved=6 * MiB)
    expect(replay, [t("headroom-small.trace")], small_moved)
    expect(replay, ["--headroom", "499", t("headroom-small.trace")], small_moved)
    expect(replay, ["--headroom", "500", t("headroom-small.trace")], small_kept)
    expect(replay, ["--headroom", "1000", t("headroom-small.trace")], small_kept)
    # Slabs: nine 256 KiB blocks and 1 MiB in two granules (see the trace).
    expect(replay, [t("slab.trace")],
           dict(hits=8, misses=2, driver_allocs=2, chunk_creates=2, chunk_maps=2, moves=0,
                peak_live=9 * 256 * 1024, peak_reserved=4 * MiB))
    expect(replay, classic + [t("slab.trace")],
           dict(hits=0, misses=10, driver_allocs=10, peak_live=9 * 256 * 1024,
                peak_reserved=9 * 256 * 1024 + MiB))
    # The text report: the pooled line for pooled runs only, and the share served without
    # new memory.
    p = run(replay, "--headroom", "0", t("headroom.trace"))
    check("text: backend", ", backend pooled\n" in p.stdout, True)
    check("text: pooled line", "  pooled              0 moves, 2 chunks created, 0 released, "
          "2 mapped, 0 unmapped\n" in p.stdout, True)
    check("text: driver allocs", "  driver allocs       1  (allocations that took new memory: "
          "66.67 % served without)\n" in p.stdout, True)
    p = run(replay, *classic, t("headroom.trace"))
    check("text classic: backend", ", backend classic\n" in p.stdout, True)
    check("text classic: no pooled line", "  pooled " in p.stdout, False)
    check("text classic: driver allocs", "  driver allocs       2  (allocations that took new "
          "memory: 33.33 % served without)\n" in p.stdout, True)
    # Options and usage.
    p = run(replay, "--version")
    check("--version", (p.returncode, p.stdout.startswith("cacheshim-replay ")), (0, True))
    p = run(replay, "--help")
    check("--help", (p.returncode, "--sweep" in p.stdout), (0, True))
    for bad in (["--cap", "lots", t("basic.trace")], ["--frob", t("basic.trace")], [],
                ["--device-size", "50%", t("basic.trace")], ["--gpu-lag-us", "-1", t("basic.trace")],
                ["--reuse", "soon", t("basic.trace")], ["--backend", "vmm", t("basic.trace")],
                ["--headroom", "1001", t("basic.trace")], ["--headroom", "12.5", t("basic.trace")],
                ["--headroom", "25%", t("basic.trace")], ["--granularity", "3M", t("basic.trace")],
                ["--granularity", "2K", t("basic.trace")], ["--map-us", "-1", t("basic.trace")],
                [os.path.join(data, "no-such.trace")], ["--cap"]):
        p = run(replay, *bad)
        check(f"{bad}: exit", p.returncode, 2)
        check(f"{bad}: message", p.stderr.startswith("cacheshim-replay: ") or
              p.stderr.startswith("usage:"), True)


# PyTorch with its cache off, recorded under the shim on the H100 (tools/testdata/torch-*.trace.gz,
# see their first lines): the replay's numbers with the defaults, and the offline goal
# (reserved / live at most 1.10 with at least 95 % of requests served without new memory), met
# by all three (GPT-2 1.099, since small idle blocks go back to their slabs before new memory
# and the arena's halves keep small ranges and large blocks apart).
RECORDED = {
    "torch-resnet.trace.gz": dict(allocs=16470, hits=16360, misses=110, driver_allocs=108,
                                  moves=1209, peak_live=1065375132, peak_reserved=1115684864,
                                  chunk_creates=501, chunk_maps=516, chunk_unmaps=15),
    "torch-train.trace.gz": dict(allocs=25432, hits=25266, misses=166, driver_allocs=166,
                                 moves=3011, peak_live=1495369356, peak_reserved=1600126976,
                                 chunk_creates=732, chunk_maps=735, chunk_unmaps=3),
    "torch-gpt2.trace.gz": dict(allocs=77279, hits=77158, misses=121, driver_allocs=121,
                                moves=4780, peak_live=694732296, peak_reserved=763363328,
                                chunk_creates=270, chunk_maps=271, chunk_unmaps=1),
}


def part_recorded(replay, data):
    for name, want in RECORDED.items():
        runs = replay_json(replay, os.path.join(data, name))
        if len(runs) != 1:
            failures.append(f"{name}: {len(runs)} runs, want 1")
            continue
        r = runs[0]
        for k, v in want.items():
            check(f"{name}: {k}", r[k], v)
        check(f"{name}: served without new memory >= 95 %",
              r["driver_allocs"] <= r["allocs"] // 20, True)
        check(f"{name}: reserved / live <= 1.10", r["reserved_over_live"] <= 1.10, True)


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
    # Generated: a NUL byte (what comes before it a record cut off, what follows it the rest
    # of that record, and the next line read on: here not a record), a truncated line,
    # garbage after a valid line, in gzip too.
    with tempfile.TemporaryDirectory() as d:
        for i, (content, line) in enumerate([(b"a 1 10 1\nf 1\x00 2\nzz 3\n", 3),
                                             (b"a 1 10 1\nf\na 2 20 3\n", 2),
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


    # A trace cut anywhere in its last record (a program killed while it was written), with
    # and without a zero-filled tail, plain and gzipped (a gzip stream cut short too): the
    # records before it are replayed, the cut one left out and counted in a note.
    full = b"a 4096 10 1\na 8192 20 2\nf 10 3\nf 20 4\n"
    last = full.rindex(b"f 20 4")
    with tempfile.TemporaryDirectory() as d:
        for cut in range(last, len(full)):
            for tail in (b"", b"\0" * 4096):
                for gz in (False, True):
                    path = os.path.join(d, f"cut{cut}-{len(tail)}{'.gz' if gz else ''}")
                    body = full[:cut] + tail
                    with open(path, "wb") as f:
                        f.write(gzip.compress(full)[:len(gzip.compress(full)) - 8 - (len(full) - cut)]
                                if gz and not tail else gzip.compress(body) if gz else body)
                    p = run(replay, path)
                    what = f"cut at {cut} tail {len(tail)} gz={gz}"
                    check(f"{what}: exit", p.returncode, 0)
                    partial = full[last:cut].rstrip(b"\n") not in (b"", b"f 20 4")
                    if partial and not gz:
                        check(f"{what}: note", "1 record cut off where the traced program "
                              "died, 3 read" in p.stderr, True)

    # A trace read while its program writes it: zero bytes where a thread had not copied its
    # record yet, then the rest of that record (trace_input.h), after part of it or none.
    with tempfile.TemporaryDirectory() as d:
        for name, body in (("part", b"a 4096 10 1\na 81\0\0\092 20 2\nf 10 3\n"),
                           ("none", b"a 4096 10 1\n\0\0\0\0 20 2\nf 10 3\n")):
            path = os.path.join(d, name)
            with open(path, "wb") as f:
                f.write(body)
            p = run(replay, path)
            check(f"live {name}: exit", (p.returncode, p.stderr.count("record cut off")), (0, 1))
            check(f"live {name}: note", "1 record cut off where the traced program died, 2 read"
                  in p.stderr, True)


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


# The replay of the recorded traces is deterministic (the real cache on the simulated
# device): these are its numbers, per backend. Classic is cross-checked against the real shim
# on the fake driver by tests/run_replay.sh (the same hits and driver allocations); pooled too,
# where moves are few (with moves, the real shim's frees share fence epochs and blocks come
# back from the thread caches in class order, so which idle block moves first can differ).
SHARED = {
    "resnet.trace.gz": {
        (): dict(hits=6543, misses=110, driver_allocs=110, driver_frees=0, moves=713,
                 peak_reserved=1092616192, chunk_creates=490, chunk_releases=0,
                 chunk_maps=490, chunk_unmaps=0),
        ("--backend", "classic"): dict(hits=6209, misses=444, driver_allocs=444, driver_frees=0,
                                       moves=0, peak_reserved=3534678016, chunk_creates=0),
        ("--headroom", "25"): dict(hits=6543, misses=110, driver_allocs=110, driver_frees=0,
                                   moves=713, peak_reserved=1092616192, chunk_creates=490,
                                   chunk_releases=0, chunk_maps=490, chunk_unmaps=0),
    },
    "cupy.trace.gz": {
        (): dict(hits=1392, misses=13, driver_allocs=13, driver_frees=0, moves=913,
                 peak_reserved=136314880, chunk_creates=34, chunk_releases=0, chunk_maps=36,
                 chunk_unmaps=2),
        ("--backend", "classic"): dict(hits=1372, misses=33, driver_allocs=33, driver_frees=0,
                                       moves=0, peak_reserved=144532480, chunk_creates=0),
        ("--headroom", "25"): dict(hits=1392, misses=13, driver_allocs=13, driver_frees=0,
                                   moves=913, peak_reserved=136314880, chunk_creates=34,
                                   chunk_releases=0, chunk_maps=36, chunk_unmaps=2),
    },
}


def part_shared(replay, traces):
    files = {"resnet.trace.gz": (6653, 6520, 1010.7), "cupy.trace.gz": (1405, 1410, 119.0)}
    present = [f for f in files if os.path.exists(os.path.join(traces, f))]
    if not present:
        print(f"no traces in {traces}: skipped")
        sys.exit(77)
    for name in present:
        allocs, free_lines, peak_mib = files[name]
        path = os.path.join(traces, name)
        runs = {}
        for args, want in SHARED[name].items():
            got = replay_json(replay, *args, path)
            if not got:
                continue
            r = runs[args] = got[0]
            what = f"{name} {' '.join(args) or 'pooled'}"
            print(what, json.dumps(r))
            for k, v in want.items():
                check(f"{what}: {k}", r[k], v)
            # The numbers of shared/traces/README.md.
            check(f"{what}: allocs", r["allocs"], allocs)
            check(f"{what}: free lines", r["frees"] + r["skipped_frees"], free_lines)
            check(f"{what}: peak live MiB", round(r["peak_live"] / MiB, 1), peak_mib)
            check(f"{what}: requests", r["hits"] + r["misses"], allocs)
            check(f"{what}: no failures", (r["replay_failures"], r["oom_failures"]), (0, 0))
            check(f"{what}: saves time", r["saved_us"] > 0, True)
            # Every miss of classic is a driver allocation; pooled takes new memory for few.
            if "classic" in args:
                check(f"{what}: misses = driver allocs", r["misses"], r["driver_allocs"])
                check(f"{what}: hit rate >= 0.9", r["hit_rate"] >= 0.9, True)
            else:
                check(f"{what}: served without new memory >= 0.95",
                      r["driver_allocs"] <= allocs // 20, True)
                check(f"{what}: chunks mapped >= created",
                      r["chunk_maps"] >= r["chunk_creates"], True)
                check(f"{what}: chunks alive >= mapped",
                      r["chunk_creates"] - r["chunk_releases"] >= r["chunk_maps"] - r["chunk_unmaps"],
                      True)
        # The expandable segments model, measured.
        model = replay_json(replay, "--vs-expandable", path)
        check(f"{name}: expandable_peak_mapped", model[0].get("expandable_peak_mapped")
              if model else None, EXPANDABLE_SHARED[name])
        pooled, classic, roomy = runs.get(()), runs.get(("--backend", "classic")), \
            runs.get(("--headroom", "25"))
        if pooled and classic and roomy:
            # Pooled holds within 10 % of the program's peak (resnet: 1.029, cupy: 1.093);
            # more headroom trades memory for no more mappings (cupy: 1 unmap instead of 80;
            # resnet, whose freed memory coalesces, maps the same without any) and holds at
            # least as much.
            check(f"{name}: pooled reserved/live <= 1.10", pooled["reserved_over_live"] <= 1.10,
                  True)
            check(f"{name}: pooled holds less than classic",
                  pooled["peak_reserved"] < classic["peak_reserved"], True)
            check(f"{name}: headroom 25: at least as many hits", roomy["hit_rate"] >= pooled["hit_rate"], True)
            check(f"{name}: headroom 25: no more maps", roomy["chunk_maps"] <= pooled["chunk_maps"], True)
            check(f"{name}: headroom 25: at least as much held",
                  roomy["peak_reserved"] >= pooled["peak_reserved"], True)
            check(f"{name}: headroom 25: within 25 % (and rounding)",
                  roomy["reserved_over_live"] <= 1.25 * pooled["reserved_over_live"], True)
        # A tight cap costs hits and never lets reserved exceed it, with either backend.
        for args in ((), ("--backend", "classic")):
            r = runs.get(args)
            if not r:
                continue
            cap = r["peak_live"] * 5 // 4
            c = replay_json(replay, *args, "--cap", str(cap), path)[0]
            what = f"{name} {' '.join(args) or 'pooled'} capped"
            check(f"{what}: reserved <= cap", c["peak_reserved"] <= cap, True)
            check(f"{what}: hit rate <= uncapped", c["hit_rate"] <= r["hit_rate"], True)
            check(f"{what}: no failures", (c["replay_failures"], c["oom_failures"]), (0, 0))


# --vs-expandable on hand-written traces: (peak mapped, peak live), derived in each trace's
# comments.
EXPANDABLE = {
    "expandable-pools.trace": (24 * MiB, 6598657),
    "expandable-coalesce.trace": (20 * MiB, 20 * MiB),
    "expandable-extend.trace": (40 * MiB, 38 * MiB),
    "expandable-bestfit.trace": (20 * MiB, 20 * MiB),
    "expandable-equal.trace": (20 * MiB, 20 * MiB),
    "expandable-last.trace": (40 * MiB, 18 * MiB),
    "expandable-split.trace": (4 * MiB, 4193145),
    "expandable-again.trace": (60 * MiB, 52 * MiB),
}
# The recorded traces, measured (the rules checked by hand on the traces above): peak mapped.
EXPANDABLE_RECORDED = {"torch-resnet.trace.gz": 1113587712, "torch-train.trace.gz": 1614807040,
                       "torch-gpt2.trace.gz": 771751936}
EXPANDABLE_SHARED = {"resnet.trace.gz": 1113587712, "cupy.trace.gz": 153092096}
JSON_MODEL_FIELDS = re.compile(r',\n     "expandable_peak_mapped": \d+, "expandable_over_live": [\d.]+')


def expect_model(replay, path, mapped, live, *args):
    runs = replay_json(replay, "--vs-expandable", *args, path)
    what = f"{os.path.basename(path)} {' '.join(args)}".strip()
    if not runs:
        failures.append(f"{what}: no runs")
    for r in runs:
        check(f"{what}: expandable_peak_mapped", r.get("expandable_peak_mapped"), mapped)
        check(f"{what}: expandable_over_live", r.get("expandable_over_live"),
              round(mapped / live, 6))


def model_line(r, mapped):
    """The text report's line for a run r (from --json) of a trace whose model maps mapped."""
    return (f"  expandable model    {mapped} B ({mapped / MiB:.1f} MiB) mapped at peak: "
            f"{mapped / r['peak_live']:.3f} of peak live, peak reserved "
            f"{r['peak_reserved'] / mapped:.3f} of it\n")


def part_expandable(replay, data):
    t = lambda name: os.path.join(data, name)
    for name, (mapped, live) in EXPANDABLE.items():
        expect_model(replay, t(name), mapped, live)
    # Rounding: a 1 B request takes 512 B, so 4096 of them fill one 2 MiB page and 4097 need a
    # second; 513 B takes 1024, 2048 fill the page. (Unrounded, all would fit one page.)
    with tempfile.TemporaryDirectory() as d:
        for size, count, pages in ((1, 4096, 1), (1, 4097, 2), (513, 2048, 1), (513, 2049, 2)):
            path = os.path.join(d, f"round-{size}-{count}.trace")
            with open(path, "w") as f:
                f.writelines(f"a {size} {i + 1:x} {i}\n" for i in range(count))
            expect_model(replay, path, pages * 2 * MiB, size * count)
    # The model depends on the trace alone: the same in every run whatever the options.
    expect_model(replay, t("expandable-last.trace"), 40 * MiB, 18 * MiB, "--caps", "none,8M",
                 "--thresholds", "none,1M", "--backend", "classic", "--gpu-lag-us", "100")
    expect_model(replay, t("expandable-last.trace"), 40 * MiB, 18 * MiB, "--device-size", "30M")
    for name, mapped in EXPANDABLE_RECORDED.items():
        runs = replay_json(replay, "--vs-expandable", t(name))
        check(f"{name}: expandable_peak_mapped", runs[0].get("expandable_peak_mapped") if runs
              else None, mapped)
    # Without the flag, basic.trace's text and JSON byte for byte as before the flag existed
    # (basic.expected.*: written by the build before it, the path and version made symbols).
    basic = t("basic.trace")
    version = run(replay, "--version").stdout.split()[-1]
    for args, golden in (([], "basic.expected.txt"), (["--json"], "basic.expected.json")):
        with open(t(golden)) as f:
            want = f.read().replace("TRACE", basic).replace("VERSION", version)
        check(f"{golden}: unchanged", run(replay, *args, basic).stdout, want)
    # Text: the line after "reserved / live", and nothing else changed; without the flag,
    # text and JSON exactly as before (the JSON with the flag is the JSON without it plus the
    # model's two fields).
    for name in ("basic.trace", "expandable-pools.trace"):
        plain, model = run(replay, t(name)), run(replay, "--vs-expandable", t(name))
        r = replay_json(replay, t(name))[0]
        mapped = replay_json(replay, "--vs-expandable", t(name))[0]["expandable_peak_mapped"]
        check(f"{name}: text without the flag", "expandable model" in plain.stdout, False)
        ratio = f"  reserved / live     {r['reserved_over_live']:.3f}\n"
        check(f"{name}: text with the flag", model.stdout,
              plain.stdout.replace(ratio, ratio + model_line(r, mapped)))
        plain, model = run(replay, "--json", t(name)), run(replay, "--json", "--vs-expandable",
                                                           t(name))
        check(f"{name}: json without the flag", '"expandable_' in plain.stdout, False)
        check(f"{name}: json with the flag, less the model's fields",
              JSON_MODEL_FIELDS.sub("", model.stdout), plain.stdout)
        check(f"{name}: json model fields", len(JSON_MODEL_FIELDS.findall(model.stdout)), 1)
    # A sweep: the model's line once under each trace's header, the table as without it.
    traces = [t("expandable-extend.trace"), t("expandable-split.trace")]
    plain = run(replay, "--caps", "none,2M", *traces).stdout
    model = run(replay, "--caps", "none,2M", "--vs-expandable", *traces).stdout
    check("sweep: model lines", [l for l in model.splitlines() if "expandable model" in l],
          ["  expandable model    41943040 B (40.0 MiB) mapped at peak: 1.053 of peak live",
           "  expandable model    4194304 B (4.0 MiB) mapped at peak: 1.000 of peak live"])
    check("sweep: the rest unchanged",
          "\n".join(l for l in model.splitlines() if "expandable model" not in l) + "\n", plain)
    check("sweep without the flag", "expandable model" in plain, False)
    p = run(replay, "--help")
    check("--help", "--vs-expandable" in p.stdout, True)


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
     "recorded": lambda: part_recorded(replay, data),
     "expandable": lambda: part_expandable(replay, data),
     "shared": lambda: part_shared(replay, traces)}[part]()
    for f in failures:
        print("FAIL", f)
    print(f"{part}: {'FAIL' if failures else 'PASS'} ({len(failures)} failures)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
