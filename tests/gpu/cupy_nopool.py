#!/usr/bin/env python3
"""cupy_nopool: CuPy with its memory pools off, so every array is a cudaMalloc/cudaFree.

    python3 cupy_nopool.py [ITERATIONS] [--require-shim]      (default 60)

Random float32 matrices of 256-2048 per side: matmul, reductions, FFT; a few elements of each
result are checked against NumPy on the host. Checks that the pool really is off (the default
pool's used bytes stay 0). Prints iterations/s and "PASS cupy_nopool ..." or "FAIL cupy_nopool
..." (exit 1); "SKIP cupy_nopool: ..." with exit 77 when CuPy cannot be imported.
"""
import ctypes
import sys
import time

try:
    import numpy as np
    import cupy as cp
except Exception as exc:  # noqa: BLE001 - any import failure means: not testable here
    print(f"SKIP cupy_nopool: numpy/cupy not importable: {exc}")
    sys.exit(77)


def shim_loaded():
    try:
        return bool(ctypes.CDLL(None).cacheshim_get_stats)
    except AttributeError:
        return False


def main():
    iters, require_shim = 60, False
    for a in sys.argv[1:]:
        if a == "--require-shim":
            require_shim = True
        else:
            iters = int(a)

    cp.cuda.set_allocator(None)
    cp.cuda.set_pinned_memory_allocator(None)
    rng = np.random.default_rng(1234)
    sides = [256, 512, 768, 1024, 1536, 2048]
    failures = []

    def close(got, want, what, rtol=2e-3):
        got, want = complex(got), complex(want)
        tol = rtol * max(1.0, abs(want))
        if abs(got - want) > tol:
            failures.append(f"{what}: got {got} want {want}")

    def step(i, check):
        n = sides[i % len(sides)]
        m = sides[(i * 5 + 1) % len(sides)]
        a = cp.random.random((n, m), dtype=cp.float32) - 0.5
        b = cp.random.random((m, n), dtype=cp.float32) - 0.5
        c = a @ b
        col_sums = c.sum(axis=0)
        total = float(c.sum())
        mx = float(cp.abs(c).max())
        f = cp.fft.fft(a[0].astype(cp.complex64))
        f2 = cp.fft.rfft2(a)
        if not check:
            cp.cuda.Device().synchronize()
            return
        ah, bh = cp.asnumpy(a), cp.asnumpy(b)
        for _ in range(3):
            r, k = int(rng.integers(n)), int(rng.integers(n))
            close(c[r, k].get(), np.dot(ah[r, :].astype(np.float64), bh[:, k]), f"matmul[{r},{k}] n={n} m={m}")
        ch = ah.astype(np.float64) @ bh.astype(np.float64)
        close(total, ch.sum(), "sum", rtol=1e-2)
        close(mx, np.abs(ch).max(), "abs max")
        k = int(rng.integers(n))
        close(col_sums[k].get(), ch[:, k].sum(), f"column sum {k}", rtol=1e-2)
        fh = np.fft.fft(ah[0].astype(np.complex128))
        for j in (0, 1, m // 3):
            close(f[j].get(), fh[j], f"fft[{j}]", rtol=1e-3 * m)
        f2h = np.fft.rfft2(ah.astype(np.float64))
        close(f2[1, 1].get(), f2h[1, 1], "rfft2[1,1]", rtol=1e-3 * m)

    for i in range(4):
        step(i, check=True)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for i in range(iters):
        step(i, check=(i % 10 == 0))
    cp.cuda.Device().synchronize()
    dt = time.perf_counter() - t0

    pool_used = cp.get_default_memory_pool().used_bytes() + cp.get_default_memory_pool().total_bytes()
    if pool_used:
        failures.append(f"the default memory pool holds {pool_used} bytes: it is not off")
    loaded = shim_loaded()
    print(f"cupy_nopool: cupy {cp.__version__}, shim {'loaded' if loaded else 'not loaded'}, "
          f"{iters} iterations in {dt:.2f} s, {iters / dt:.2f} it/s")
    if require_shim and not loaded:
        failures.append("--require-shim given but cacheshim_get_stats is not found")
    if failures:
        for f in failures[:20]:
            print(f"FAIL cupy_nopool: {f}")
        print(f"FAIL cupy_nopool failures={len(failures)}")
        return 1
    print(f"PASS cupy_nopool it/s={iters / dt:.2f} iterations={iters}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
