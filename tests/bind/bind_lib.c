/* A library that the preload cannot reach when loaded with RTLD_DEEPBIND or dlmopen
 * (bind_prog.c loads it). It makes its own context and allocates through the driver in one
 * of two ways, as real libraries do:
 *   direct     cuMemAlloc/cuMemFree, bound to libcuda by the dynamic linker (-lcuda)
 *   procaddr   as static cudart: dlopen("libcuda.so.1"), dlsym of cuGetProcAddress_v2, then
 *              the entry points through it */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t,
                           CUdriverProcAddressQueryResult *);

/* The functions the library will call, or 0 when they cannot be found. direct: none, the
 * library calls cuMemAlloc and cuMemFree by name. It never takes their addresses: ld then
 * calls them through a GOT entry filled at load time, a binding ld.so does not report to
 * audit modules (docs/usage.md). */
static int find(int procaddr, alloc_fn *a, free_fn *f)
{
    if (!procaddr) {
        *a = NULL;
        *f = NULL;
        return 1;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *sym = h ? dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (!sym)
        return 0;
    gpa_fn gpa;
    memcpy(&gpa, &sym, sizeof gpa);
    void *pa = NULL, *pf = NULL;
    CUdriverProcAddressQueryResult qa, qf;
    if (gpa("cuMemAlloc", &pa, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &qa) != CUDA_SUCCESS ||
        gpa("cuMemFree", &pf, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &qf) != CUDA_SUCCESS || !pa ||
        !pf)
        return 0;
    memcpy(a, &pa, sizeof *a);
    memcpy(f, &pf, sizeof *f);
    return 1;
}

/* pairs allocations of 1 MiB, each freed at once. Returns 0, or the line that failed. */
EXPORT int bind_lib_run(int pairs, int procaddr)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return __LINE__;
    alloc_fn a;
    free_fn f;
    if (!find(procaddr, &a, &f))
        return __LINE__;
    for (int i = 0; i < pairs; i++) {
        CUdeviceptr p = 0;
        /* direct: calls through the PLT, as code calling the driver compiles to */
        if ((procaddr ? a(&p, 1 << 20) : cuMemAlloc(&p, 1 << 20)) != CUDA_SUCCESS || p == 0)
            return __LINE__;
        if ((procaddr ? f(p) : cuMemFree(p)) != CUDA_SUCCESS)
            return __LINE__;
    }
    return 0;
}

/* What the library calls for an allocation through cuGetProcAddress (for the check that
 * nothing is wrapped twice); NULL for direct. */
EXPORT void *bind_lib_alloc_fn(int procaddr)
{
    alloc_fn a;
    free_fn f;
    void *p = NULL;
    if (find(procaddr, &a, &f))
        memcpy(&p, &a, sizeof p);
    return p;
}
