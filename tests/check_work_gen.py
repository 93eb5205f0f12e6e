#!/usr/bin/env python3
"""scripts/gen-work-wrappers: what it selects from this toolkit's cuda.h, and that it fails
loudly instead of dropping a function silently.

Usage: check_work_gen.py GENERATOR CC INCLUDE_DIR CS_WORK_GEN_H
"""
import os
import re
import subprocess
import sys
import tempfile

MUST_HAVE = ["cuLaunchKernel", "cuLaunchKernelEx", "cuMemcpyHtoDAsync_v2", "cuMemsetD8Async",
             "cuGraphLaunch", "cuLaunchHostFunc", "cuStreamWaitEvent", "cuMemcpy",
             "cuMemsetD8_v2"]
# Work of every kind the brief names, and their per-thread versions.
ALSO = ["cuLaunchKernel_ptsz", "cuLaunchKernelEx_ptsz", "cuLaunchCooperativeKernelMultiDevice",
        "cuLaunch", "cuLaunchGrid", "cuMemcpy_ptds", "cuMemcpyHtoDAsync_v2_ptsz",
        "cuStreamWaitValue32_v2", "cuStreamWriteValue64", "cuStreamBatchMemOp_v2",
        "cuStreamAddCallback", "cuGraphUpload", "cuMemPrefetchAsync_v2", "cuSignalExternalSemaphoresAsync",
        "cuWaitExternalSemaphoresAsync_ptsz", "cuGraphicsMapResources",
        "cuGraphicsUnmapResources"]
# Not work: the stream is only read, waited for, or switched to capture.
NEVER = ["cuStreamQuery", "cuStreamSynchronize_ptsz", "cuStreamDestroy_v2", "cuStreamGetFlags",
         "cuStreamGetCaptureInfo_v3", "cuStreamSetAttribute", "cuStreamCopyAttributes",
         "cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuStreamIsCapturing",
         "cuStreamUpdateCaptureDependencies_v2", "cuEventRecord", "cuEventRecordWithFlags_ptsz",
         "cuStreamCreate", "cuMemAlloc_v2", "cuOccupancyMaxActiveClusters",
         # the shim wraps these itself and tracks their work there (shim/cs_paths.c)
         "cuMemAllocAsync", "cuMemFreeAsync_ptsz", "cuMemAllocFromPoolAsync"]

failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    failures += not ok


def run(gen, *args):
    return subprocess.run([gen, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def main():
    gen, cc, inc, gen_h = sys.argv[1:5]

    r = run(gen, "--list", cc, inc)
    check(r.returncode == 0, f"--list exits 0 ({r.stderr.strip()})")
    names = r.stdout.split()
    print(f"     {len(names)} functions selected")
    check(len(names) >= 60, "at least 60 functions")
    check(len(names) == len(set(names)), "no name twice")
    for n in MUST_HAVE + ALSO:
        check(n in names, f"{n} selected")
    for n in NEVER:
        check(n not in names, f"{n} not selected")
    with open(gen_h) as f:
        count = re.search(r"#define CS_WORK_COUNT (\d+)", f.read())
    check(count and int(count.group(1)) == len(names), "cs_work_gen.h has the listed count")

    with open(os.path.join(inc, "cuda.h")) as f:
        cuda_h = f.read()
    with tempfile.TemporaryDirectory() as tmp:
        # A toolkit whose cuda.h lost a must-have (every declaration of cuLaunchHostFunc).
        fake_inc = os.path.join(tmp, "include")
        os.mkdir(fake_inc)
        cut, n = re.subn(r"CUresult\s+CUDAAPI\s+cuLaunchHostFunc\s*\([^;]*\);", "", cuda_h)
        check(n >= 1, "the test removed cuLaunchHostFunc from a copy of cuda.h")
        with open(os.path.join(fake_inc, "cuda.h"), "w") as f:
            f.write(cut)
        r = run(gen, "--list", cc, fake_inc)
        check(r.returncode != 0 and "cuLaunchHostFunc" in r.stderr,
              f"a missing must-have fails the generator ({r.stderr.strip()})")

        # A shim that already defines one of the names.
        shim = os.path.join(tmp, "shim")
        os.mkdir(shim)
        with open(os.path.join(shim, "cs_entry.c"), "w") as f:
            f.write("CS_EXPORT CUresult cuStreamCreate(CUstream *p, unsigned int flags)\n{}\n"
                    "CS_EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char c,\n"
                    "                                  size_t n, CUstream s)\n{}\n")
        r = run(gen, "--shim", shim, "--list", cc, inc)
        check(r.returncode != 0 and "cuMemsetD8Async" in r.stderr
              and "cuStreamCreate" not in r.stderr,
              f"a name the shim defines fails the generator ({r.stderr.strip()})")

    print(f"{len(names)} selected; {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
