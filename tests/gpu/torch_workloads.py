"""Three PyTorch workloads whose memory the shim is measured on, in plain PyTorch.

    python3 tests/gpu/torch_workloads.py WORKLOAD [--steps N] [--warmup W] [--sample-ms MS]
                                                  [--device cuda|cpu] [--train-script PATH]
                                                  [--spin-cycles C]

WORKLOAD:
  resnet  ResNet-18 (BasicBlock, [2, 2, 2, 2], 1000 classes) trained with SGD (momentum 0.9),
          batch 32 of random images and labels; the image size changes every step,
          128, 160, 192, 224 in turn. A step is one training step. Prints the final loss.
  gpt2    GPT-2 small (12 layers, 768 dims, 12 heads, vocabulary 50257, learned positions,
          random weights), eval mode, no_grad, greedy generation with a key/value cache that
          grows by torch.cat at every token (as the legacy cache of Hugging Face's
          transformers does): batch 4, a random prompt of 32 tokens, 128 new tokens. A step
          is one such round. Prints a checksum of all generated tokens. The host reads the
          GPU once a round; with --spin-cycles C a kernel spins C GPU clock cycles
          (torch.cuda._sleep) after each token, so that the GPU falls ever further behind the
          host within a round (the case where freed memory is still in use when it is
          needed again; 1,000,000 cycles are about 0.6 ms on an H100).
  train   shared/bench/torch_train.py (a small transformer trained with AdamW, sequence length
          changing every step), run as it is through runpy with ITERS=N; its RESULT line gives
          it/s and the loss. A step is one of its iterations.
  alloc   the host's cost of allocating: a step allocates 12 tensors (the activation sizes of
          torch_train.py's sequence lengths, 2-8 MiB, and four others from 4 KB to 32 MiB),
          fills each (one kernel), and frees them all; nothing synchronizes. Prints the sum
          of the first elements of the last step's first and last tensors.

Warm-up steps come first (resnet 8: every size twice; gpt2 2; train: its own 8; alloc 200), then the
timed steps, with torch.cuda.synchronize() before each clock reading. The seeds are fixed
(torch.manual_seed(0)), so runs under different allocators do the same work; the loss and
checksum let them be compared (a loss may differ in the last digit between runs: cuDNN and
cuBLAS are not bitwise deterministic; the gpt2 checksum should not).

The last line is

    WORKLOAD name=W steps=N sec=S it_per_s=X max_allocated_MiB=A max_reserved_MiB=R
             loss=L|checksum=C driver_peak_used_MiB=D driver_base_used_MiB=B torch_cache=on|off
             [tok_per_s=T]

(one line; checksum and tok_per_s for gpt2, loss for the others). A and R are
torch.cuda.max_memory_allocated() / max_memory_reserved() over the whole run (warm-up
included, as the shim's peak covers the whole process).

PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1 counts nothing: in c10/cuda/
CUDACachingAllocator.cpp, NativeCachingAllocator::allocate() checks forceUncachedAllocator()
first and then calls uncached_allocate() (a plain cudaMalloc) with uncached_delete (a plain
cudaFree) as the deleter; DeviceCachingAllocator::malloc(), which keeps the allocated and
reserved statistics, is never reached, so max_memory_allocated() stays 0 (measured: the
RESULT lines of torch_train.py under that setting say peak_alloc_MiB=0). This program therefore
prints "-" for A and R, and torch_cache=off, when PyTorch counted nothing; the allocated
reference for a run without the cache is the same workload's run with the cache (the same
seeds, the same tensors).

D and B are the GPU's used memory as NVML reports it (libnvidia-ml.so.1 through ctypes; the
whole GPU, so the machine should run nothing else): B once the CUDA context exists, before the
model is built; D the highest value a sampling thread saw every MS milliseconds (default 5; 0
turns sampling off) during the whole run. D - B is what the run held on the device, whoever
held it: PyTorch's cache, the shim's, or the driver's own rounding. Samples can miss short
peaks. "-" when NVML cannot be loaded.
"""

import argparse
import contextlib
import ctypes
import io
import os
import re
import runpy
import sys
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MiB = 2**20


# --------------------------------------------------------------------------- device memory


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class NvmlSampler:
    """The GPU's used memory from NVML: now(), and the highest value of a background thread
    sampling every interval_ms. Every method answers None when NVML is not available."""

    def __init__(self, device_index, interval_ms):
        self.interval = interval_ms / 1000.0
        self.peak = None
        self._stop = threading.Event()
        self._thread = None
        self._lib = None
        self._handle = ctypes.c_void_p()
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            # The CUDA device's PCI bus id names the same GPU in NVML whatever
            # CUDA_VISIBLE_DEVICES says; fall back to NVML's index.
            ok = False
            try:
                p = torch.cuda.get_device_properties(device_index)
                bus = "%08x:%02x:%02x.0" % (p.pci_domain_id, p.pci_bus_id, p.pci_device_id)
                ok = lib.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(),
                                                          ctypes.byref(self._handle)) == 0
            except (AttributeError, RuntimeError):
                ok = False
            if not ok and lib.nvmlDeviceGetHandleByIndex_v2(device_index,
                                                            ctypes.byref(self._handle)) != 0:
                return
            self._lib = lib
        except (OSError, AttributeError):  # no NVML, or one without these entry points
            self._lib = None

    def now(self):
        if self._lib is None:
            return None
        m = _NvmlMemory()
        if self._lib.nvmlDeviceGetMemoryInfo(self._handle, ctypes.byref(m)) != 0:
            return None
        return m.used

    def _run(self):
        while not self._stop.is_set():
            u = self.now()
            if u is not None and (self.peak is None or u > self.peak):
                self.peak = u
            self._stop.wait(self.interval)

    def start(self):
        if self._lib is None or self.interval <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        u = self.now()  # one last sample, after the work
        if u is not None and (self.peak is None or u > self.peak):
            self.peak = u
        return self.peak


# --------------------------------------------------------------------------- ResNet-18


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity, inplace=True)


class ResNet18(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def run_steps(step, args, sync, warmup):
    """The warm-up steps (--warmup, else `warmup`), then the timed ones between two
    synchronizations: their seconds and the last step's result."""
    for i in range(args.warmup if args.warmup is not None else warmup):
        step(i)
    sync()
    t0 = time.perf_counter()
    for i in range(args.steps):
        last = step(i)
    sync()
    return time.perf_counter() - t0, last


def run_resnet(args, dev, sync):
    sizes = (128, 160, 192, 224)
    batch = 32
    model = ResNet18().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    model.train()

    def step(i):
        s = sizes[i % len(sizes)]
        x = torch.randn(batch, 3, s, s, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    sec, loss = run_steps(step, args, sync, 8)
    return sec, "%.4f" % loss.item(), ""


# --------------------------------------------------------------------------- GPT-2 small


class GPT2Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_out = nn.Linear(4 * d, d)

    def forward(self, x, past):
        """x: (B, T, d); past: None or (k, v), each (B, heads, T_past, d / heads). Returns the
        output and the new (k, v), past and present joined by torch.cat."""
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(B, T, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, d // self.heads).transpose(1, 2)
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        # The prompt (no past, T > 1) is causal. A new token attends to every key: PyTorch's
        # is_causal aligns the mask top-left, so it must not be set when T_q < T_k.
        a = F.scaled_dot_product_attention(q, k, v, is_causal=past is None and T > 1)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, d))
        x = x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x, (k, v)


class GPT2(nn.Module):
    def __init__(self, vocab=50257, positions=1024, d=768, layers=12, heads=12):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(positions, d)
        self.blocks = nn.ModuleList(GPT2Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, past, start):
        """Logits for every position of idx (B, T) (the head is tied to the token embedding,
        as in GPT-2), and the new per-layer caches."""
        pos = torch.arange(start, start + idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        present = []
        for i, blk in enumerate(self.blocks):
            x, kv = blk(x, None if past is None else past[i])
            present.append(kv)
        return F.linear(self.ln_f(x), self.wte.weight), present


def run_gpt2(args, dev, sync):
    batch, prompt_len, new_tokens, vocab = 4, 32, 128, 50257
    model = GPT2(vocab=vocab).to(dev).eval()
    # Position weights for the checksum: token j of row b counts (b * new_tokens + j + 1) times.
    weights = torch.arange(1, batch * new_tokens + 1, device=dev, dtype=torch.int64)
    weights = weights.view(batch, new_tokens)
    state = {"checksum": 0}

    def generate_round():
        prompt = torch.randint(0, vocab, (batch, prompt_len), device=dev)
        logits, past = model(prompt, None, 0)
        tok = logits[:, -1].argmax(-1, keepdim=True)
        out = [tok]
        for i in range(new_tokens - 1):
            logits, past = model(tok, past, prompt_len + i)
            tok = logits[:, -1].argmax(-1, keepdim=True)
            out.append(tok)
            if args.spin_cycles:
                torch.cuda._sleep(args.spin_cycles)
        gen = torch.cat(out, dim=1)
        # One host read per round (the 64-bit sum fits: at most 50256 * 131328).
        s = int((gen * weights).sum().item())
        state["checksum"] = (state["checksum"] * 1000003 + s) % (2**61 - 1)

    with torch.no_grad():
        for _ in range(args.warmup if args.warmup is not None else 2):
            generate_round()
        sync()
        state["checksum"] = 0  # the checksum covers the timed rounds only
        t0 = time.perf_counter()
        for _ in range(args.steps):
            generate_round()
        sync()
        sec = time.perf_counter() - t0
    tok_s = args.steps * batch * new_tokens / sec
    return sec, "%d" % state["checksum"], " tok_per_s=%.0f" % tok_s


# --------------------------------------------------------------------------- torch_train.py


class _Tee(io.TextIOBase):
    """Writes through to the real stdout and keeps a copy."""

    def __init__(self, real):
        self.real = real
        self.kept = io.StringIO()

    def write(self, s):
        self.kept.write(s)
        return self.real.write(s)

    def flush(self):
        self.real.flush()


def find_train_script(explicit):
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    for c in (os.path.join(root, "shared", "bench", "torch_train.py"),
              os.path.join(root, "..", "shared", "bench", "torch_train.py"),
              os.path.join("shared", "bench", "torch_train.py")):
        if os.path.isfile(c):
            return c
    sys.exit("torch_workloads: shared/bench/torch_train.py not found (in the repository, "
             "beside it, or the current directory); give --train-script PATH")


def run_train(args, dev, sync):
    script = find_train_script(args.train_script)
    # torch_train.py reads ITERS (timed iterations) when it starts; it warms up 8 steps,
    # times ITERS, synchronizes and prints "RESULT MODE it/s=X loss=L peak_alloc_MiB=A".
    os.environ["ITERS"] = str(args.steps)
    tee = _Tee(sys.stdout)
    argv = sys.argv
    sys.argv = [script]
    try:
        with contextlib.redirect_stdout(tee):
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = argv
    sync()
    m = re.search(r"^RESULT .*it/s=([0-9.]+) loss=([-0-9.naif]+)", tee.kept.getvalue(), re.M)
    if not m:
        sys.exit("torch_workloads: no RESULT line from %s" % script)
    it_s = float(m.group(1))
    return args.steps / it_s if it_s > 0 else float("inf"), m.group(2), ""


# --------------------------------------------------------------------------- allocations


def run_alloc(args, dev, sync):
    sizes = [16 * t * 512 for t in (64, 96, 128, 192, 256, 80, 160, 224)]
    sizes += [1000, 4096, 512 * 2048, 16 * 256 * 2048]  # floats: 4 KB to 32 MiB

    def step(i):
        live = []
        for n in sizes:
            t = torch.empty(n, device=dev)
            t.fill_(float(i % 7))
            live.append(t)
        return live[0][0] + live[-1][0]

    sec, last = run_steps(step, args, sync, 200)
    return sec, "%.1f" % last.item(), ""


# --------------------------------------------------------------------------- main

DEFAULT_STEPS = {"resnet": 600, "gpt2": 15, "train": 400, "alloc": 20000}
RUNNERS = {"resnet": run_resnet, "gpt2": run_gpt2, "train": run_train, "alloc": run_alloc}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workload", choices=sorted(RUNNERS))
    ap.add_argument("--steps", type=int, default=None,
                    help="timed steps (default: resnet 600, gpt2 15 rounds, train 400, "
                    "alloc 20000)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="warm-up steps (default: resnet 8, gpt2 2, alloc 200; train: its own 8)")
    ap.add_argument("--sample-ms", type=float, default=5.0,
                    help="NVML sampling interval in ms; 0 turns sampling off")
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu for a smoke test")
    ap.add_argument("--train-script", default=None, help="path of torch_train.py")
    ap.add_argument("--spin-cycles", type=int, default=0,
                    help="gpt2: a kernel spinning this many GPU cycles after each token")
    args = ap.parse_args()
    if args.steps is None:
        args.steps = DEFAULT_STEPS[args.workload]
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    if args.spin_cycles < 0 or (args.spin_cycles and not args.device.startswith("cuda")):
        ap.error("--spin-cycles must be at least 0, and needs --device cuda")

    torch.manual_seed(0)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        sys.exit("torch_workloads: CUDA is not available")
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sampler = None
    base = None
    if cuda:
        torch.zeros(1, device=dev)  # the context
        sync()
        sampler = NvmlSampler(dev.index or 0, args.sample_ms)
        base = sampler.now()
        sampler.start()

    sec, result, extra = RUNNERS[args.workload](args, dev, sync)

    peak = sampler.stop() if sampler else None
    # With PYTORCH_NO_CUDA_MEMORY_CACHING PyTorch's statistics stay 0 (see the opening
    # comment): a run that allocated on the GPU and counted nothing had its cache off.
    cache_on = cuda and torch.cuda.max_memory_allocated(dev) > 0
    if cache_on:
        alloc = "%.0f" % (torch.cuda.max_memory_allocated(dev) / MiB)
        reserved = "%.0f" % (torch.cuda.max_memory_reserved(dev) / MiB)
    else:
        alloc = reserved = "-"
    print("WORKLOAD name=%s steps=%d sec=%.2f it_per_s=%.3f max_allocated_MiB=%s "
          "max_reserved_MiB=%s %s=%s driver_peak_used_MiB=%s driver_base_used_MiB=%s "
          "torch_cache=%s%s" % (
              args.workload, args.steps, sec, args.steps / sec, alloc, reserved,
              "checksum" if args.workload == "gpt2" else "loss", result,
              "%.0f" % (peak / MiB) if peak is not None else "-",
              "%.0f" % (base / MiB) if base is not None else "-",
              "on" if cache_on else ("off" if cuda else "-"), extra), flush=True)


if __name__ == "__main__":
    main()
