#!/usr/bin/env python3
"""torch_pluggable: runs a PyTorch script with cacheshim plugged in as PyTorch's allocator
(torch.cuda.memory.CUDAPluggableAllocator, docs/usage.md), no LD_PRELOAD needed.

    python3 torch_pluggable.py LIBCACHESHIM SCRIPT [ARGS...]

The three lines of docs/usage.md, then SCRIPT as __main__. At the end, one line from the
shim's statistics: "torch_pluggable: requests=N hits=N cap_refusals=N" (the script passes
when SCRIPT did; the caller checks the numbers).
"""
import ctypes
import runpy
import sys

lib = sys.argv[1]
import torch  # noqa: E402

alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, "cacheshim_torch_alloc", "cacheshim_torch_free")
torch.cuda.memory.change_current_allocator(alloc)
# A pluggable allocator has no device statistics in PyTorch 2.11 ("CUDAPluggableAllocator does
# not yet support getDeviceStats"): scripts that print torch.cuda.max_memory_allocated() (as
# torch_train.py does) get 0, as with PyTorch's cache off; the shim's own numbers follow below.
torch.cuda.max_memory_allocated = lambda *args, **kwargs: 0


class Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "requests", "hits", "misses", "frees", "foreign_frees", "bytes_in_use",
        "bytes_requested", "bytes_cached", "peak_in_use", "peak_requested", "peak_reserved",
        "driver_allocs", "driver_frees", "releases", "fences", "fence_waits", "oom_recoveries",
        "oom_failures", "cap_refusals", "cap_bytes", "ordered_hits", "work_calls", "moves",
        "bytes_outside")]


sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
st = Stats()
shim = ctypes.CDLL(lib)
if shim.cacheshim_get_stats(-1, ctypes.byref(st), ctypes.sizeof(st)) != 0:
    print("torch_pluggable: no statistics from the shim")
    sys.exit(1)
print(f"torch_pluggable: requests={st.requests} hits={st.hits} cap_refusals={st.cap_refusals} "
      f"peak_reserved_MiB={st.peak_reserved >> 20}")
