"""The driver API as cuda.h declares it: shared by the generators (gen-audit-wrappers,
gen-work-wrappers), so that both see the very same list of functions and parameters.

The C preprocessor runs on INCLUDE_DIR/cuda.h with __CUDA_API_VERSION_INTERNAL defined, so
that every versioned entry point (cuMemAlloc and cuMemAlloc_v2, cuMemcpy_ptds, ...) is a real
declaration instead of a macro alias; then every `CUresult cuXxx(...);` declaration is read.
There is no hand-written list of functions: a new toolkit gives new wrappers.

Errors end the program with a message that names the calling script.
"""
import os
import re
import subprocess
import sys


def _fail(message):
    sys.exit(f"{os.path.basename(sys.argv[0])}: {message}")


def preprocess(cc, inc):
    """cuda.h, preprocessed with every versioned name declared."""
    cmd = cc.split() + ["-E", "-P", "-D__CUDA_API_VERSION_INTERNAL", "-I" + inc,
                        inc + "/cuda.h"]
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout


def normalize(src):
    """All whitespace runs as one space: a declaration is then on one line."""
    return " ".join(src.split())


def split_param(text):
    """'const CUDA_MEMCPY2D *pCopy' -> ('const CUDA_MEMCPY2D *', 'pCopy')."""
    m = re.fullmatch(r"(.*?)(\w+)\s*", text)
    if not m or not m.group(1).strip():
        _fail(f"cannot read parameter {text!r}")
    return m.group(1).strip(), m.group(2)


def declarations(src):
    """Every `CUresult cu...(...)` declaration of normalized `src`, sorted by name:
    [(name, [(type, parameter name), ...]), ...]."""
    funcs = {}
    for m in re.finditer(r"\bCUresult\s+(cu\w+)\s*\(([^;{}()]*)\)\s*;", src):
        name, plist = m.group(1), m.group(2).strip()
        params = []
        if plist not in ("", "void"):
            for p in plist.split(","):
                params.append(split_param(p.strip()))
        if name in funcs and funcs[name] != params:
            _fail(f"{name} declared twice with different parameters")
        funcs[name] = params
    if len(funcs) < 100:
        _fail(f"only {len(funcs)} declarations found; is this cuda.h?")
    return sorted(funcs.items())


def result_codes(src):
    """The CUresult values of normalized `src`: [(name, value as text), ...] in order."""
    enum = re.search(r"enum cudaError_enum\s*\{(.*?)\}", src)
    if not enum:
        _fail("enum cudaError_enum not found")
    return re.findall(r"(CUDA_\w+)\s*=\s*(\d+)", enum.group(1))


def base_of(ptype):
    """'const CUDA_MEMCPY2D *' -> 'CUDA_MEMCPY2D': the type without qualifiers and stars."""
    t = ptype.replace("const", " ").replace("*", " ")
    return " ".join(t.split())
