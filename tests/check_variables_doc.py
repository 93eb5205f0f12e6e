#!/usr/bin/env python3
"""Check that docs/variables.md documents exactly the variables of the options table.

Usage: check_variables_doc.py PRINT_OPTIONS VARIABLES_MD

PRINT_OPTIONS is tests/print_options (built with shim/cs_options.c); it prints the table as
NAME<TAB>TYPE<TAB>DEFAULT<TAB>HELP lines. The doc must hold one Markdown table whose header is
| Variable | Type | Default | Meaning | with the same rows in the same order (cells may be in
backticks), a section headed "## CACHESHIM_NAME" for each variable, and no mention of a
CACHESHIM_ variable that the table does not have.
"""
import re
import subprocess
import sys

HEADER = ["variable", "type", "default", "meaning"]
COLUMNS = ["name", "type", "default", "meaning"]


def code_rows(program):
    out = subprocess.run([program], check=True, stdout=subprocess.PIPE, text=True).stdout
    rows = []
    for line in out.splitlines():
        cells = line.split("\t")
        if len(cells) != 4:
            sys.exit(f"{program}: malformed line {line!r}")
        rows.append(cells)
    if not rows:
        sys.exit(f"{program}: printed no variables")
    return rows


def split_row(line):
    """Cells of a Markdown table row; '\\|' stays inside a cell."""
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    cells = re.split(r"(?<!\\)\|", line)
    return [unquote(c.strip().replace("\\|", "|")) for c in cells]


def unquote(cell):
    if len(cell) >= 2 and cell.startswith("`") and cell.endswith("`"):
        return cell[1:-1].strip()
    return cell


def doc_rows(lines, path):
    tables = [i for i, l in enumerate(lines)
              if l.lstrip().startswith("|") and [c.lower() for c in split_row(l)] == HEADER]
    if len(tables) != 1:
        sys.exit(f"{path}: expected exactly one table headed | Variable | Type | Default | "
                 f"Meaning |, found {len(tables)}")
    i = tables[0] + 1
    if i >= len(lines) or not re.fullmatch(r"\s*\|?(\s*:?-+:?\s*\|)+\s*:?-*:?\s*", lines[i]):
        sys.exit(f"{path}:{i + 1}: the variables table has no separator line")
    rows = []
    for n in range(i + 1, len(lines)):
        if not lines[n].lstrip().startswith("|"):
            break
        cells = split_row(lines[n])
        if len(cells) != 4:
            sys.exit(f"{path}:{n + 1}: expected 4 cells, found {len(cells)}")
        rows.append((n + 1, cells))
    return rows


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    program, path = sys.argv[1], sys.argv[2]
    code = code_rows(program)
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    doc = doc_rows(lines, path)

    errors = []
    code_names = [r[0] for r in code]
    doc_names = [cells[0] for _, cells in doc]
    for name in code_names:
        if name not in doc_names:
            errors.append(f"{path}: {name} is in the code's table but not in the doc's table")
    for lineno, cells in doc:
        if cells[0] not in code_names:
            errors.append(f"{path}:{lineno}: {cells[0]} is not a variable of the code's table")
    if not errors and doc_names != code_names:
        errors.append(f"{path}: the table's order is {doc_names}, the code's is {code_names}")
    by_name = {r[0]: r for r in code}
    for lineno, cells in doc:
        want = by_name.get(cells[0])
        if want is None:
            continue
        for col in range(1, 4):
            if cells[col] != want[col]:
                errors.append(f"{path}:{lineno}: {cells[0]} {COLUMNS[col]} is {cells[col]!r}, "
                              f"the code says {want[col]!r}")

    headings = {m.group(1) for l in lines
                if (m := re.fullmatch(r"#{2,3}\s+`?(CACHESHIM_[A-Z0-9_]+)`?\s*", l.strip()))}
    for name in code_names:
        if name not in headings:
            errors.append(f"{path}: no section headed '## {name}'")

    for n, l in enumerate(lines, 1):
        for m in re.finditer(r"CACHESHIM_[A-Z0-9_]*[A-Z0-9]", l):
            if m.group(0) not in code_names:
                errors.append(f"{path}:{n}: mentions {m.group(0)}, which is not a variable")

    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        return 1
    print(f"{path}: documents the {len(code_names)} variables of the table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
