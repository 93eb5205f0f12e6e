#!/usr/bin/env python3
"""Counts the successful cuMemAlloc_v2 calls at the driver in a trace of libcacheaudit.so, in
any of its formats, also when the traced program died: the file of a killed program ends in
zero bytes (a Chrome trace: in spaces after its last event's comma, without its closing "]"),
which are read as docs/tracing.md says. Used by scripts/gpu-check-crash.

Usage: count_trace.py text|jsonl|perfetto FILE
Prints "records=N finished=yes|no" (finished: no zero bytes and, for a Chrome trace, strict
JSON as written); for a Chrome trace also " events=N" (complete events, every call) and, when
unfinished, " perfetto_reads=yes|no": whether it is what Perfetto's JSON reader takes as it is
(the array form, no zero byte, events up to a trailing comma, blanks after).
"""
import json
import sys

fmt, path = sys.argv[1:3]
raw = open(path, "rb").read()
finished = b"\0" not in raw
text = raw.replace(b"\0", b"").decode("utf-8", "replace")
extra = ""
if fmt == "perfetto":
    try:
        events = json.loads(text)
    except ValueError:
        finished = False
        body = text.rstrip().rstrip(",")
        events = json.loads(body + "]") if body else []  # empty: killed before any was written
        reads = b"\0" not in raw and body.lstrip().startswith("[")
        extra = f" perfetto_reads={'yes' if reads else 'no'}"
    extra = f" events={sum(e.get('ph') == 'X' for e in events)}{extra}"
    n = sum(e.get("ph") == "X" and e.get("name") == "cuMemAlloc_v2" and e.get("cat") == "driver"
            and e["args"].get("result") == "CUDA_SUCCESS" for e in events)
elif fmt == "jsonl":
    n = 0
    for line in text.splitlines():
        if line.startswith("{"):
            e = json.loads(line)
            n += e.get("name") == "cuMemAlloc_v2" and e.get("lib") == "driver" and e["result"] == 0
else:
    n = sum(l.startswith("[Intercepted] cuMemAlloc_v2(") and ") = CUDA_SUCCESS" in l and
            "[driver," in l for l in text.splitlines())
print(f"records={n} finished={'yes' if finished else 'no'}{extra}")
