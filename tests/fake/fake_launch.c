/* Fake CUDA driver: kernel launches, host functions and graph launches, each one unit of work
 * on its stream (see fake_stream.c for the order and fake_timeline.c for completion), or,
 * into a capturing stream, a graph node that does nothing.
 *
 * There is one kernel, fake_touch_kernel()'s: it touches the n bytes at p, where p is
 * *(CUdeviceptr *)kernelParams[0] and n is *(size_t *)kernelParams[1]. The bytes must lie
 * inside one live allocation or one VMM reservation (n = 0: it touches nothing and p is not
 * looked at); bytes the launching context's device may not touch are an access fault
 * (fake_access.c). Any other CUfunction is an invalid handle. A graph launch accepts any
 * non-NULL CUgraphExec and touches nothing: the fake keeps no graphs. */
#include "fake_internal.h"

/* The touch kernel's handle is this object's address: never a real function. */
static char g_touch_kernel;

FAKE_API CUfunction fake_touch_kernel(void) { return (CUfunction)(void *)&g_touch_kernel; }

/* Launch dimensions as the real driver checks them: none 0, at most 1024 threads a block. */
static CUresult check_dims(const unsigned grid[3], const unsigned block[3])
{
    for (int i = 0; i < 3; i++)
        if (grid[i] == 0 || block[i] == 0)
            return CUDA_ERROR_INVALID_VALUE;
    if ((uint64_t)block[0] * block[1] * block[2] > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* The bytes the kernel f touches with these parameters. */
static CUresult kernel_range(CUfunction f, void **params, struct fake_range *r)
{
    if (f != fake_touch_kernel())
        return CUDA_ERROR_INVALID_HANDLE;
    if (!params || !params[0] || !params[1])
        return CUDA_ERROR_INVALID_VALUE;
    r->p = *(const CUdeviceptr *)params[0];
    r->n = *(const size_t *)params[1];
    r->write = true;
    return CUDA_SUCCESS;
}

/* Submit one unit on stream h unless it is captured; it touches r (NULL: nothing), which a
 * context of h may have to reach. */
static CUresult submit_on(enum fake_entry_id id, CUstream h, bool ptsz,
                          const struct fake_range *r, CUhostFn fn, void *data)
{
    fake_stream *s;
    bool captured = false;
    struct fake_touches t = {0};
    CUresult rc = fake_resolve_stream(h, ptsz, false, &s);
    if (rc == CUDA_SUCCESS && r && r->n)
        rc = fake_access_kernel(&t, r->p, r->n, s->ctx);
    if (rc == CUDA_SUCCESS)
        rc = fake_async_admit(s, &captured);
    if (rc == CUDA_SUCCESS && !captured)
        rc = fake_submit(s, fake_entry_name(id), &t, fn, data);
    if (rc == CUDA_SUCCESS && !captured)
        fake_access_faulted(fake_entry_name(id), s, &t);
    fake_touches_free(&t);
    return rc;
}

/* `extra` (the packed-buffer way to pass parameters) is not supported: the touch kernel
 * reads kernelParams. */
static CUresult launch(enum fake_entry_id id, CUfunction f, const unsigned grid[3],
                       const unsigned block[3], CUstream h, bool ptsz, void **params)
{
    struct fake_range r = {0, 0, false};
    CUresult rc = check_dims(grid, block);
    if (rc == CUDA_SUCCESS)
        rc = kernel_range(f, params, &r);
    if (rc == CUDA_SUCCESS)
        rc = submit_on(id, h, ptsz, &r, NULL, NULL);
    return rc;
}

FAKE_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                 unsigned int gridDimZ, unsigned int blockDimX,
                                 unsigned int blockDimY, unsigned int blockDimZ,
                                 unsigned int sharedMemBytes, CUstream hStream,
                                 void **kernelParams, void **extra)
{
    ENTER(cuLaunchKernel);
    (void)sharedMemBytes;
    (void)extra;
    const unsigned grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned block[3] = {blockDimX, blockDimY, blockDimZ};
    LOCKED(launch(ID_cuLaunchKernel, f, grid, block, hStream, false, kernelParams));
}

FAKE_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                      unsigned int gridDimZ, unsigned int blockDimX,
                                      unsigned int blockDimY, unsigned int blockDimZ,
                                      unsigned int sharedMemBytes, CUstream hStream,
                                      void **kernelParams, void **extra)
{
    ENTER(cuLaunchKernel_ptsz);
    (void)sharedMemBytes;
    (void)extra;
    const unsigned grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned block[3] = {blockDimX, blockDimY, blockDimZ};
    LOCKED(launch(ID_cuLaunchKernel_ptsz, f, grid, block, hStream, true, kernelParams));
}

/* The launch attributes (clusters, priorities, ...) change nothing here. */
static CUresult launch_ex(enum fake_entry_id id, const CUlaunchConfig *config, CUfunction f,
                          bool ptsz, void **params)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    const unsigned grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
    const unsigned block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
    return launch(id, f, grid, block, config->hStream, ptsz, params);
}

FAKE_API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                   void **kernelParams, void **extra)
{
    ENTER(cuLaunchKernelEx);
    (void)extra;
    LOCKED(launch_ex(ID_cuLaunchKernelEx, config, f, false, kernelParams));
}

FAKE_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                        void **kernelParams, void **extra)
{
    ENTER(cuLaunchKernelEx_ptsz);
    (void)extra;
    LOCKED(launch_ex(ID_cuLaunchKernelEx_ptsz, config, f, true, kernelParams));
}

/* fn(userData) runs once its unit has completed, before the driver or control call that
 * completed it returns, outside the driver lock (from inside a host function: right after
 * that one). Host functions run one at a time, in the order their units completed. Never
 * for a launch into a capturing stream. */
static CUresult host_func(enum fake_entry_id id, CUstream h, CUhostFn fn, void *data, bool ptsz)
{
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    return submit_on(id, h, ptsz, NULL, fn, data);
}

FAKE_API CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    ENTER(cuLaunchHostFunc);
    LOCKED(host_func(ID_cuLaunchHostFunc, hStream, fn, userData, false));
}

FAKE_API CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData)
{
    ENTER(cuLaunchHostFunc_ptsz);
    LOCKED(host_func(ID_cuLaunchHostFunc_ptsz, hStream, fn, userData, true));
}

static CUresult graph_launch(enum fake_entry_id id, CUgraphExec g, CUstream h, bool ptsz)
{
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    return submit_on(id, h, ptsz, NULL, NULL, NULL);
}

FAKE_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    ENTER(cuGraphLaunch);
    LOCKED(graph_launch(ID_cuGraphLaunch, hGraphExec, hStream, false));
}

FAKE_API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    ENTER(cuGraphLaunch_ptsz);
    LOCKED(graph_launch(ID_cuGraphLaunch_ptsz, hGraphExec, hStream, true));
}
