#!/usr/bin/env python3
"""cupy_async_cap: CuPy's stream-ordered pool (cupy.cuda.MemoryAsyncPool, cudaMallocAsync)
stopped at CACHESHIM_CAP.

    CACHESHIM_CAP=2G LD_PRELOAD=libcacheshim.so python3 cupy_async_cap.py CAP_BYTES

Allocates 64 MiB arrays until CuPy raises OutOfMemoryError; passes when that happens with at
most CAP_BYTES allocated (and more than half of it), and the same number fits again after
everything was freed. Prints "PASS cupy_async_cap ..." or "FAIL cupy_async_cap ..." (exit
1); "SKIP cupy_async_cap: ..." with exit 77 when CuPy cannot be imported.
"""
import sys

try:
    import cupy as cp
except Exception as exc:  # noqa: BLE001 - any import failure means: not testable here
    print(f"SKIP cupy_async_cap: cupy not importable: {exc}")
    sys.exit(77)

MiB = 1 << 20


def fill():
    held = []
    try:
        while len(held) < 100000:
            held.append(cp.empty(64 * MiB, dtype=cp.uint8))
    except cp.cuda.memory.OutOfMemoryError:
        return held, True
    return held, False


def main():
    cap = int(sys.argv[1])
    cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)
    held, refused = fill()
    n = len(held)
    cp.cuda.Stream.null.synchronize()
    ok = refused and n * 64 * MiB <= cap and n * 64 * MiB * 2 > cap
    print(f"{'PASS' if ok else 'FAIL'} cupy_async_cap: stopped after {n} arrays of 64 MiB "
          f"({n * 64} MiB, cap {cap // MiB} MiB), OutOfMemoryError {refused}")
    del held
    cp.cuda.Stream.null.synchronize()
    again, _ = fill()
    same = len(again) == n
    print(f"{'PASS' if same else 'FAIL'} cupy_async_cap: after freeing all, {len(again)} fit "
          f"again ({n} before)")
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
