"""CUDA tensors shared between processes with torch.multiprocessing (CUDA IPC), both ways.

    python3 torch_ipc.py [ROUNDS]

A child started with the "spawn" method gets tensors of shifting sizes (700 B to 64 MiB)
through a queue, checks each holds the pattern of its round, adds 1 in place and answers; the
parent then checks it sees the child's write. Meanwhile the parent keeps allocating on
another stream, so a cache moves memory under the tensors' neighbours. Run it natively, under
the shim (where PyTorch's segments, or with PYTORCH_NO_CUDA_MEMORY_CACHING=1 its tensors
themselves, are the shim's blocks), and with CACHESHIM_BACKEND=classic.

Prints "TORCH_IPC ok rounds=N tensors=T" (exit 0) or "TORCH_IPC FAIL ..." (exit 1).
"""
import sys

import torch
import torch.multiprocessing as mp


def pattern(seed, n, device):
    return ((torch.arange(n, device=device, dtype=torch.int64) * 131 + seed) % 251).to(torch.uint8)


def child(q_in, q_out):
    torch.cuda.set_device(0)
    while True:
        item = q_in.get()
        if item is None:
            return
        t, seed = item
        ok = bool(torch.equal(t, pattern(seed, t.numel(), t.device)))
        t.add_(1)
        torch.cuda.synchronize()
        q_out.put(ok)
        del t, item


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q_in, q_out))
    p.start()
    side = torch.cuda.Stream()
    sizes = [700, 100 << 10, (3 << 20) + 5, (64 << 20) + 1]
    bad, n = [], 0
    churn = []
    for r in range(rounds):
        with torch.cuda.stream(side):
            churn = [torch.empty((k + r % 3 + 1) << 20, dtype=torch.uint8, device="cuda").fill_(7)
                     for k in range(4)]
        for i, size in enumerate(sizes):
            size += (r % 3) * 4096 * (i + 1)
            seed = 1000 * r + i
            t = pattern(seed, size, "cuda")
            torch.cuda.synchronize()
            q_in.put((t, seed))
            ok = q_out.get(timeout=120)
            back = torch.equal(t, pattern(seed, size, "cuda") + 1)
            if not ok or not back:
                bad.append((r, size, ok, back))
            n += 1
            del t
        del churn
    q_in.put(None)
    p.join(timeout=120)
    if bad or p.exitcode != 0:
        print(f"TORCH_IPC FAIL rounds={rounds} tensors={n} bad={bad} child_exit={p.exitcode}")
        sys.exit(1)
    print(f"TORCH_IPC ok rounds={rounds} tensors={n}")


if __name__ == "__main__":
    main()
