# shared/bench/torch_train.py's training loop (the same model, sizes and steps) under a
# benchmark build of the tracer (meson -Dtrace_bench=true), which SIGUSR2 turns off and on:
# ROUNDS rounds, each a block of 8 steps (one of each sequence length) traced and one
# untraced, in a random order, the GPU idle at each block's start and end. Prints each
# block's it/s, then the medians and the median of the rounds' overheads: the untraced and
# traced blocks of a round ran within a second of each other in one process, so the spread
# of single runs on a busy host (+-20 % from one process to the next) largely cancels.
#   LD_AUDIT=BUILD/audit/libcacheaudit.so CACHESHIM_TRACE_FILTER=all ... python3 this
import os, random, signal, statistics, time, torch

torch.manual_seed(0)
dev = "cuda"
d, layers, heads = int(os.environ.get("D", 512)), int(os.environ.get("L", 6)), 8
model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True), layers).to(dev)
head = torch.nn.Linear(d, 1000).to(dev)
opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-4)
lens = [64, 96, 128, 192, 256, 80, 160, 224]
rounds = int(os.environ.get("ROUNDS", 40))


def step(i):
    T = lens[i % len(lens)]
    x = torch.randn(16, T, d, device=dev)
    y = torch.randint(0, 1000, (16, T), device=dev)
    out = head(model(x))
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, 1000), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


traced = True  # the tracer records from the start


def set_traced(on):
    global traced
    if on != traced:
        os.kill(os.getpid(), signal.SIGUSR2)
        traced = on


def block():
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(8):
        step(i)
    torch.cuda.synchronize()
    return 8 / (time.perf_counter() - t0)


for i in range(16):
    step(i)
res = {True: [], False: []}
rnd = random.Random(1)
for r in range(rounds):
    order = [True, False]
    rnd.shuffle(order)
    for on in order:
        set_traced(on)
        res[on].append(block())
set_traced(True)
for on in (False, True):
    print(f"BLOCKS traced={int(on)} it_s={' '.join(f'{x:.2f}' for x in res[on])}")
over = statistics.median(100 * (u - t) / u for u, t in zip(res[False], res[True]))
print(f"TOGGLE untraced_it_s={statistics.median(res[False]):.2f} "
      f"traced_it_s={statistics.median(res[True]):.2f} paired_overhead={over:.1f}% "
      f"rounds={rounds}", flush=True)
