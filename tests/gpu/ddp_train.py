"""ddp_train: data-parallel training on every GPU of the host (issue 15), for torchrun:

    torchrun --nproc_per_node=2 tests/gpu/ddp_train.py

A small MLP (4 layers of 4096), DistributedDataParallel over NCCL, sequence of batch sizes
changing every step (as real loaders' last batches and variable inputs do), 60 timed steps
after 10 of warm-up. Each rank prints one line:
    DDP rank=R it_per_s=X loss=L max_allocated_MiB=A max_reserved_MiB=R
(the loss is all-reduced: the same on every rank, and the same under any allocator;
max_reserved is PyTorch's own, 0 with its cache off).
"""
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
torch.manual_seed(0)
layers = [m for _ in range(4) for m in (torch.nn.Linear(4096, 4096), torch.nn.GELU())][:-1]
model = torch.nn.Sequential(*layers).cuda()
model = DDP(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
gen = torch.Generator(device="cuda").manual_seed(1 + rank)
sizes = [256, 384, 512, 320]
steps, warm = 60, 10
for i in range(steps + warm):
    if i == warm:
        torch.cuda.synchronize()
        t0 = time.time()
    b = sizes[i % len(sizes)]
    x = torch.randn(b, 4096, device="cuda", generator=gen)
    loss = (model(x) - x).pow(2).mean()  # learn the identity: a loss that moves
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
dt = time.time() - t0
l = loss.detach().clone()
dist.all_reduce(l)
print(f"DDP rank={rank} it_per_s={steps / dt:.2f} loss={l.item() / dist.get_world_size():.9e} "
      f"max_allocated_MiB={torch.cuda.max_memory_allocated() / 2**20:.0f} "
      f"max_reserved_MiB={torch.cuda.max_memory_reserved() / 2**20:.0f}", flush=True)
dist.destroy_process_group()
