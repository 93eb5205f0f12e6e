#!/usr/bin/env python3
"""Counts the successful cuMemAlloc_v2 calls at the driver in a trace of libcacheaudit.so, in
any of its formats, also when the traced program died: the file of a killed program ends in
zero bytes (a Chrome trace: in spaces after its last event's comma, without its closing "]"),
which are read as docs/tracing.md says. Used by scripts/gpu-check-crash.

Usage: count_trace.py text|jsonl|perfetto FILE
Prints "records=N finished=yes|no" (finished: no zero bytes and, for a Chrome trace, strict
JSON as written); for a Chrome trace also " events=N" (complete events, every call) and, when
unfinished, " perfetto_reads=yes|no": whether it is what Perfetto's JSON reader takes as it is
(the array form, no zero byte, events up to a trailing comma, then blanks, or the first part of
an event cut off at the end, which is not counted).
"""
import json
import re
import sys

SPACE = re.compile(r"[ \t\r\n]*")
STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\.)*', re.S)
NUMBER = re.compile(r"[-+.eE0-9]+")


def json_end(text, i):
    """Where the JSON value at text[i] ends; None when the text ends inside it (its first part:
    what Perfetto's reader leaves out at the end of a file); ValueError when it is not JSON."""
    n = len(text)
    if i == n:
        return None
    c = text[i]
    if c == '"':
        e = STRING.match(text, i).end()
        if e == n or (text[e] == "\\" and e + 1 == n):
            return None
        if text[e] != '"':
            raise ValueError("a control character in a string")
        return e + 1
    if c in "{[":
        close = "}" if c == "{" else "]"
        i = SPACE.match(text, i + 1).end()
        if i < n and text[i] == close:
            return i + 1
        while True:
            if close == "}":
                if i < n and text[i] != '"':
                    raise ValueError("expected a key")
                i = json_end(text, i)
                if i is None or SPACE.match(text, i).end() == n:
                    return None
                i = SPACE.match(text, i).end()
                if text[i] != ":":
                    raise ValueError("expected ':'")
                i = SPACE.match(text, i + 1).end()
            i = json_end(text, i)
            if i is None or SPACE.match(text, i).end() == n:
                return None
            i = SPACE.match(text, i).end()
            if text[i] == close:
                return i + 1
            if text[i] != ",":
                raise ValueError(f"expected ',' or {close!r}")
            i = SPACE.match(text, i + 1).end()
    for word in ("true", "false", "null"):
        if text.startswith(word, i):
            return i + len(word)
        if n - i < len(word) and word.startswith(text[i:]):
            return None
    m = NUMBER.match(text, i)
    if not m:
        raise ValueError("not a JSON value")
    return None if m.end() == n else m.end()


def perfetto_reads(text):
    """The events Perfetto's JSON reader takes from a file as it is (its
    json_trace_tokenizer.cc), and whether it takes it: "[" first; objects with whitespace and
    at most one comma between them; then "]", or nothing but whitespace, or the first part of
    an object that the end of the file cuts off (a death in the middle of its copy), which it
    leaves out. (A zero byte it refuses: the caller looks at the raw bytes.)"""
    pos = SPACE.match(text).end()
    if text[pos:pos + 1] != "[":
        return [], False
    decoder, events, pos = json.JSONDecoder(), [], pos + 1
    while True:
        pos = SPACE.match(text, pos).end()
        if text[pos:pos + 1] == ",":
            pos = SPACE.match(text, pos + 1).end()
        if pos == len(text) or text[pos] == "]":
            return events, pos == len(text) or SPACE.match(text, pos + 1).end() == len(text)
        try:
            event, pos = decoder.raw_decode(text, pos)
            if not isinstance(event, dict):
                return events, False
            events.append(event)
        except ValueError:
            try:
                return events, text[pos] == "{" and json_end(text, pos) is None
            except ValueError:
                return events, False


def main():
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
            events, reads = perfetto_reads(text)
            reads = reads and b"\0" not in raw
            extra = f" perfetto_reads={'yes' if reads else 'no'}"
        extra = f" events={sum(e.get('ph') == 'X' for e in events)}{extra}"
        n = sum(e.get("ph") == "X" and e.get("name") == "cuMemAlloc_v2" and
                e.get("cat") == "driver" and e["args"].get("result") == "CUDA_SUCCESS"
                for e in events)
    elif fmt == "jsonl":
        n = 0
        for line in text.splitlines():
            if line.startswith("{"):
                e = json.loads(line)
                n += (e.get("name") == "cuMemAlloc_v2" and e.get("lib") == "driver" and
                      e["result"] == 0)
    else:
        n = sum(l.startswith("[Intercepted] cuMemAlloc_v2(") and ") = CUDA_SUCCESS" in l and
                "[driver," in l for l in text.splitlines())
    print(f"records={n} finished={'yes' if finished else 'no'}{extra}")


if __name__ == "__main__":
    main()
