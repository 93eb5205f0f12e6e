#!/usr/bin/env python3
"""The launcher's documentation cannot drift from the launcher:

- every option of `cacheshim run --help` and `cacheshim trace --help` is in docs/cli.md and
  in docs/man/cacheshim.1;
- every variable of the options table (print_options) is in docs/man/cacheshim.1;
- every message the launcher's sources print on stderr is in docs/cli.md: each fixed piece
  of its format (the text between the %-conversions) with at least four letters.

Usage: check_cli_docs.py LAUNCHER PRINT_OPTIONS CLI_MD MAN1 SOURCE...
Exit 0 on success, 1 listing what is missing.
"""
import re
import subprocess
import sys

LAUNCHER, PRINT_OPTIONS, CLI_MD, MAN1 = sys.argv[1:5]
SOURCES = sys.argv[5:]
MACROS = {"LAUNCH_NAME": "cacheshim"}
missing = []


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def man_text(roff):
    """The words of a roff page without its escapes: \\- is -, \\fB... fonts go."""
    text = re.sub(r"\\f[BIRP]", "", roff).replace("\\-", "-").replace("\\e", "\\")
    return re.sub(r"^\.[A-Z]+ ?", "", text, flags=re.M).replace('"', "")


def help_options(cmd):
    out = subprocess.run([LAUNCHER, cmd, "--help"], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    opts = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-z])\b", out))
    if not {"--help", "-h"} <= opts or len(opts) < 5:
        missing.append(f"{cmd} --help: found only {sorted(opts)}")
    return opts


# C string literals, identifiers and single punctuation characters, in order
TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|([A-Za-z_]\w*)|(\S)')


def stderr_formats(source):
    """The format of every fprintf(stderr, ...) and fputs(..., stderr), adjacent literals
    joined and LAUNCH_NAME expanded."""
    code = re.sub(r"/\*.*?\*/", "", read(source), flags=re.S)
    toks = [(m.group(1), m.group(2), m.group(3)) for m in TOKEN.finditer(code)]

    def literal_at(i):
        parts = []
        while i < len(toks):
            s, ident, _ = toks[i]
            if s is not None:
                parts.append(bytes(s, "utf-8").decode("unicode_escape"))
            elif ident in MACROS:
                parts.append(MACROS[ident])
            else:
                break
            i += 1
        return "".join(parts) if parts else None, i

    formats = []
    for i in range(len(toks) - 3):
        name = toks[i][1]
        if name == "fprintf" and toks[i + 1][2] == "(" and toks[i + 2][1] == "stderr":
            fmt, _ = literal_at(i + 4)
            if fmt:
                formats.append(fmt)
        elif name == "fputs" and toks[i + 1][2] == "(":
            fmt, j = literal_at(i + 2)
            if fmt and j + 1 < len(toks) and toks[j + 1][1] == "stderr":
                formats.append(fmt)
    return formats


def main():
    cli, man = read(CLI_MD), man_text(read(MAN1))
    for opt in sorted(help_options("run") | help_options("trace")):
        if f"`{opt}" not in cli and f" {opt}" not in cli:
            missing.append(f"docs/cli.md: option {opt}")
        if opt not in man:
            missing.append(f"docs/man/cacheshim.1: option {opt}")
    variables = [l.split("\t")[0] for l in subprocess.run(
        [PRINT_OPTIONS], stdout=subprocess.PIPE, text=True, check=True).stdout.splitlines()]
    for var in variables:
        if var not in man:
            missing.append(f"docs/man/cacheshim.1: variable {var}")
    count = 0
    for source in SOURCES:
        for fmt in stderr_formats(source):
            count += 1
            for piece in re.split(r"%[-0-9.*]*[sdzuxXlp]+", fmt.replace("%%", "%")):
                piece = piece.strip(" \n'")
                if sum(c.isalpha() for c in piece) >= 4 and piece not in cli:
                    missing.append(f"docs/cli.md: message piece {piece!r} (of {fmt!r})")
    if count < 20:
        missing.append(f"only {count} messages found in the sources: is the parser broken?")
    if missing:
        print("\n".join(missing), file=sys.stderr)
        sys.exit(1)
    print(f"ok: options, {len(variables)} variables, {count} messages")


main()
