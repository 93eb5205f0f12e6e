/* A stand-in for a shared libcudart.so.13, for the tracer's runtime test: the seven memory
 * entry points, on the fake driver (bound directly, so the tracer sees cudart's own driver
 * calls come from cudart). cudaError_t is an int here; 0 is cudaSuccess, 2
 * cudaErrorMemoryAllocation. */
#include <cuda.h>
#include <stdlib.h>

#define API __attribute__((visibility("default")))

static int err(CUresult r) { return r == CUDA_SUCCESS ? 0 : r == CUDA_ERROR_OUT_OF_MEMORY ? 2 : 1; }

/* Static helpers: the entry points must not call each other through the PLT, as the real
 * cudart does not (the tracer would see a second cudaMalloc inside cudaMallocAsync). */
static int malloc_device(void **p, size_t n)
{
    CUdeviceptr d = 0;
    CUresult r = cuMemAlloc_v2(&d, n);
    *p = (void *)(uintptr_t)d;
    return err(r);
}

static int free_device(void *p) { return err(cuMemFree_v2((CUdeviceptr)(uintptr_t)p)); }

API int cudaMalloc(void **p, size_t n) { return malloc_device(p, n); }
API int cudaFree(void *p) { return free_device(p); }
API int cudaMallocAsync(void **p, size_t n, void *stream) { (void)stream; return malloc_device(p, n); }
API int cudaFreeAsync(void *p, void *stream) { (void)stream; return free_device(p); }

API int cudaMallocHost(void **p, size_t n)
{
    *p = malloc(n);
    return *p ? 0 : 2;
}

API int cudaFreeHost(void *p)
{
    free(p);
    return 0;
}

API int cudaMemGetInfo(size_t *f, size_t *t) { return err(cuMemGetInfo_v2(f, t)); }
