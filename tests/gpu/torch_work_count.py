# Does the shim see all of PyTorch's GPU work? Runs a few steps of the transformer of
# shared/bench/torch_train.py under the profiler and compares the kernels and memory
# operations the profiler counted with the driver calls that put work on a stream which the
# shim saw in those steps (cacheshim_get_stats(-1).work_calls, read before and after).
#
#     LD_PRELOAD=libcacheshim.so PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 torch_work_count.py
#
# Prints `PASS torch_work_count steps=N profiler_ops=P shim_work_calls=W` when W >= P (every
# kernel and memory operation reached the driver through a call the shim saw; W may be larger:
# stream waits, host functions and event-less calls are work too), FAIL otherwise. Exits 77
# without torch or without the shim.
import ctypes
import os
import sys

try:
    import torch
except ImportError:
    print("SKIP torch_work_count: no torch")
    sys.exit(77)


class Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "requests", "hits", "misses", "frees", "foreign_frees", "bytes_in_use",
        "bytes_requested", "bytes_cached", "peak_in_use", "peak_requested", "peak_reserved",
        "driver_allocs", "driver_frees", "releases", "fences", "fence_waits", "oom_recoveries",
        "oom_failures", "cap_refusals", "cap_bytes", "ordered_hits", "work_calls")]


def work_calls():
    lib = ctypes.CDLL(None)
    try:
        get = lib.cacheshim_get_stats
    except AttributeError:
        return None
    get.argtypes = [ctypes.c_int, ctypes.POINTER(Stats), ctypes.c_size_t]
    s = Stats()
    if get(-1, ctypes.byref(s), ctypes.sizeof(s)) != 0:
        return None
    return s.work_calls


if work_calls() is None:
    print("SKIP torch_work_count: libcacheshim.so is not loaded")
    sys.exit(77)

torch.manual_seed(0)
dev = "cuda"
d = 512
model = torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True), 6).to(dev)
head = torch.nn.Linear(d, 1000).to(dev)
opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-4)


def step(T):
    x = torch.randn(16, T, d, device=dev)
    y = torch.randint(0, 1000, (16, T), device=dev)
    loss = torch.nn.functional.cross_entropy(head(model(x)).reshape(-1, 1000), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


for T in (64, 128):
    step(T)
torch.cuda.synchronize()
steps = int(os.environ.get("STEPS", 3))
from torch.profiler import ProfilerActivity, profile

before = work_calls()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for i in range(steps):
        step((64, 96, 128)[i % 3])
    torch.cuda.synchronize()
after = work_calls()

ops = 0
kinds = {}
for e in prof.events():
    if e.device_type != torch.autograd.DeviceType.CUDA:
        continue
    name = e.name.lower()
    kind = "memcpy" if "memcpy" in name else "memset" if "memset" in name else "kernel"
    kinds[kind] = kinds.get(kind, 0) + 1
    ops += 1
seen = after - before
detail = " ".join(f"{k}={v}" for k, v in sorted(kinds.items()))
verdict = "PASS" if seen >= ops and ops > 0 else "FAIL"
print(f"{verdict} torch_work_count steps={steps} profiler_ops={ops} ({detail}) "
      f"shim_work_calls={seen}", flush=True)
sys.exit(0 if verdict == "PASS" else 1)
