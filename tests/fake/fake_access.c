/* Fake CUDA driver: who may touch which device bytes. Copies, memsets and kernels name device
 * bytes by address; this file checks that they may touch them and turns them into touches
 * (struct fake_touch): the memory behind the bytes, which the timeline's race check
 * compares. */
#include "fake_internal.h"

#include <stdlib.h>

void fake_touches_free(struct fake_touches *t)
{
    free(t->v);
    *t = (struct fake_touches){0};
}

/* Empty touches are dropped: they touch nothing. */
static CUresult add(struct fake_touches *t, struct fake_touch x)
{
    if (x.n == 0)
        return CUDA_SUCCESS;
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 4;
        struct fake_touch *v = realloc(t->v, (size_t)cap * sizeof *v);
        if (!v)
            return CUDA_ERROR_OUT_OF_MEMORY;
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n++] = x;
    return CUDA_SUCCESS;
}

/* The allocation holding all n bytes at p, or NULL. */
static const fake_alloc *in_alloc(CUdeviceptr p, size_t n)
{
    const fake_alloc *a = fake_mem_find(p);
    return a && n <= a->base + a->size - p ? a : NULL;
}

/* cuMemAlloc memory is named by its address. */
static struct fake_touch plain(CUdeviceptr p, size_t n)
{
    return (struct fake_touch){.va = p, .n = n, .space = 0, .at = p, .mapping = 0};
}

CUresult fake_access_copy(struct fake_touches *t, const struct fake_range *r, int dev)
{
    (void)dev;
    if (!in_alloc(r->p, r->n))
        return CUDA_ERROR_INVALID_VALUE;
    return add(t, plain(r->p, r->n));
}

CUresult fake_access_kernel(struct fake_touches *t, CUdeviceptr p, size_t n, const fake_ctx *ctx)
{
    (void)ctx;
    if (!in_alloc(p, n))
        return CUDA_ERROR_INVALID_VALUE;
    return add(t, plain(p, n));
}
