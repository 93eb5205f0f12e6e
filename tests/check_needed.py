#!/usr/bin/env python3
"""Check that the preloaded libraries need nothing beyond libc, libdl and pthreads.

Usage: check_needed.py LIBRARY...

Reads each library's DT_NEEDED entries with readelf -d. libcacheshim.so and libcacheaudit.so
run inside every traced or cached program: a dependency there (zlib, jansson, libdw: the
tools' libraries) would be loaded into programs that never asked for it.
"""
import re
import subprocess
import sys

# The sanitizer runtimes come with sanitized builds (scripts/test's ASan+UBSan and TSan).
ALLOWED = re.compile(r"(libc|libdl|libpthread|ld-linux[-\w.]*|libasan|libubsan|libtsan)"
                     r"\.so(\.\d+)*$")
bad = []
for lib in sys.argv[1:]:
    out = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    print(f"{lib}: {' '.join(needed) or '(none)'}")
    bad += [f"{lib} needs {n}" for n in needed if not ALLOWED.fullmatch(n)]
for b in bad:
    print(b, file=sys.stderr)
sys.exit(1 if bad or len(sys.argv) < 2 else 0)
