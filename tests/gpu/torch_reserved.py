# Runs a PyTorch script (argv[1], with the rest of argv as its arguments) and, at its end,
# prints what PyTorch's own allocator reserved and allocated at most:
#
#     RESERVED max_reserved_MiB=R max_allocated_MiB=A ratio=R/A
#
# For the comparison with the shim, whose peak reserved is in its exit table. With PyTorch's
# cache off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) PyTorch reserves nothing it does not use.
import atexit
import runpy
import sys

import torch


def report():
    r = torch.cuda.max_memory_reserved() / 2**20
    a = torch.cuda.max_memory_allocated() / 2**20
    print(f"RESERVED max_reserved_MiB={r:.0f} max_allocated_MiB={a:.0f} "
          f"ratio={r / a if a else 0:.3f}", flush=True)


atexit.register(report)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
