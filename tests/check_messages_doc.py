#!/usr/bin/env python3
"""Check that docs/troubleshooting.md shows every message the shim and the tracer can print.

Usage: check_messages_doc.py TROUBLESHOOTING_MD SOURCE_DIR...

A message is the format string (adjacent literals joined, PRIu64 and the like read as one
conversion) of a call to cs_log, emit or emitf (which print it after "cacheshim: "), or any
other string literal of the sources that starts with "cacheshim: " (printed as it is).
Each message must match, with every printf conversion standing for some text, at least one
code span (`...`) of the doc that starts with "cacheshim: "; and each such code span of the
doc must match some message, so that the doc shows no message the code no longer prints.
"""
import glob
import os
import re
import sys

PREFIX = "cacheshim: "
CALLS = ("cs_log", "emit", "emitf")
CONVERSION = re.compile(r"%[-+ #0]*(?:\*|\d+)?(?:\.(?:\*|\d+))?(?:hh|h|ll|l|z|j|t)?[diouxXsfgcp]")
ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'"}
LEXEME = re.compile(r"""
    (?P<skip> \s+ | /\*.*?\*/ | //[^\n]* | '(?:[^'\\\n]|\\.)*' )
  | (?P<str> "(?:[^"\\\n]|\\.)*" )
  | (?P<id> [A-Za-z_][A-Za-z0-9_]* )
  | (?P<other> . )""", re.S | re.X)


def tokens(text):
    """(kind, value) of a C file: 'str' for adjacent string literals joined (a PRI... macro
    between them read as the conversion letter d), 'id', or one character of anything else."""
    out = []
    for m in LEXEME.finditer(text):
        kind = m.lastgroup
        if kind == "skip":
            continue
        value = m.group(kind)
        if kind == "str":
            value = re.sub(r"\\(.)", lambda e: ESCAPES.get(e.group(1), e.group(1)), value[1:-1])
        elif kind == "id" and value.startswith("PRI") and out and out[-1][0] == "str":
            kind, value = "str", "d"  # "%" PRIu64 -> "%d"
        if kind == "str" and out and out[-1][0] == "str":
            out[-1] = ("str", out[-1][1] + value)
        else:
            out.append((kind, value))
    return out


def messages(path):
    toks = tokens(open(path, encoding="utf-8").read())
    found = []
    for i, (kind, value) in enumerate(toks):
        if kind == "id" and value in CALLS and i + 1 < len(toks) and toks[i + 1] == ("other", "("):
            # The first literal among the call's arguments (emitf(emit, arg, "...")).
            depth = 0
            for k, v in toks[i + 1:]:
                if k == "str" and depth >= 1:
                    found.append(v if v.startswith(PREFIX) else PREFIX + v)
                    break
                depth += {"(": 1, ")": -1}.get(v, 0) if k == "other" else 0
                if depth == 0:
                    break
    for kind, value in toks:
        if kind == "str" and value.startswith(PREFIX) and value not in found:
            found.append(value)
    # "cacheshim: " alone, or "cacheshim: %s" (a line passed through): no message of its own.
    return [f for f in found if CONVERSION.sub("", f[len(PREFIX):]).strip()]


def pattern(fmt):
    pieces = []
    for part in re.split("(%%|" + CONVERSION.pattern + ")", fmt):
        if part == "%%":
            pieces.append("%")
        elif CONVERSION.fullmatch(part or ""):
            pieces.append(None)
        elif part:
            pieces.append(part)
    return re.compile("".join(".+?" if p is None else re.escape(p) for p in pieces) + r"\Z")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    doc_path, dirs = sys.argv[1], sys.argv[2:]
    sources = sorted(f for d in dirs for f in glob.glob(os.path.join(d, "*.c")))
    if not sources:
        sys.exit(f"no C sources under {dirs}")
    msgs = [(os.path.relpath(f), fmt) for f in sources for fmt in messages(f)]
    doc = open(doc_path, encoding="utf-8").read()
    spans = [s for s in re.findall(r"`([^`\n]+)`", doc) if s.startswith(PREFIX)]

    errors = []
    for src, fmt in msgs:
        p = pattern(fmt)
        if not any(p.match(s) for s in spans):
            errors.append(f"{doc_path}: no `{fmt}` (printed by {src}): show it, with its cause "
                          "and what to do")
    pats = [pattern(fmt) for _, fmt in msgs]
    for s in spans:
        if not any(p.match(s) for p in pats):
            errors.append(f"{doc_path}: `{s}` is no message the sources print")
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        return 1
    print(f"{doc_path}: shows the {len(msgs)} messages of {len(sources)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
