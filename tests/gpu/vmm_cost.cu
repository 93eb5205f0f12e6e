// vmm_cost: what the driver's virtual memory management calls cost on this GPU, next to
// cuMemAlloc/cuMemFree of the same sizes. The numbers the pooled backend is designed with
// (DESIGN.md, "Pooling physical memory"), measured again on the machine at hand.
//
//     vmm_cost [--reps N] [--warmup W] [--handle-type fd|none]
//
// (defaults: 50 repetitions after 3 warm-ups; chunks exportable as POSIX file descriptors, as
// the shim creates them for IPC of pooled blocks; none: not exportable, to compare.)
//
// Driver API only, linked with -lcuda; run it without the shim (it measures the driver).
// Every figure is the median of N timed calls (steady_clock around the one call, in µs).
//
// 1. One chunk of S MiB, S = 2, 20, 64, 256, 1024, through its whole life, each call timed
//    on its own: cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess, then (untimed)
//    cuMemsetD8 over the range and cuCtxSynchronize, so the mapping has been used, then
//    cuMemUnmap, cuMemAddressFree, cuMemRelease.
// 2. For comparison cuMemAlloc and cuMemFree of S MiB, with the same untimed memset between.
// 3. A block of N MiB (N = 2, 20, 64, 256) mapped into a virtual range reserved once:
//    - "2MiB_chunks": out of N/2 chunks of 2 MiB created beforehand: N/2 cuMemMap calls and
//      one cuMemSetAccess over the whole range (op map_block_2MiB_chunks; its parts are
//      map_block_2MiB_chunks_maps and _access), and after the untimed memset N/2
//      cuMemUnmap calls, one per chunk (unmap_block_2MiB_chunks);
//    - "one_handle": out of one chunk of N MiB created beforehand: one cuMemMap and one
//      cuMemSetAccess (map_block_one_handle, with _maps and _access), one cuMemUnmap
//      (unmap_block_one_handle).
//    The chunk size is 2 MiB when that is a multiple of the allocation granularity (it is on an
//    H100), else the granularity; the line "vmm_cost: chunk_bytes=..." says which.
//
// Output: the granularities, then one table (rows: operations, columns: sizes, median µs),
// then one machine-readable line per operation and size:
//
//     VMM op=OP size_MiB=S median_us=M min_us=A max_us=B reps=N
//
// and "PASS vmm_cost reps=N" at the end. A failing driver call prints "FAIL vmm_cost: ..." and
// exits 1; a device without virtual memory management exits 77 (skip).
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static const char *ename(CUresult r)
{
    const char *s = nullptr;
    if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s)
        return "(unknown)";
    return s;
}

#define CK(call)                                                                              \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                             \
            printf("FAIL vmm_cost: %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, ename(r_)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static double now_us()
{
    using namespace std::chrono;
    return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

// Times one call expression, in µs; a failure ends the program like CK.
#define TIMED(dst, call)                                                                      \
    do {                                                                                      \
        double t0_ = now_us();                                                                \
        CK(call);                                                                             \
        (dst) = now_us() - t0_;                                                               \
    } while (0)

struct Series {
    std::string op;
    size_t mib;
    double median, min, max;
    size_t reps;
};

static std::vector<Series> g_results;
static std::vector<std::string> g_ops;  // the operations, in the order first seen
static std::vector<size_t> g_sizes;     // the sizes, in the order first seen

static void add(const std::string &op, size_t mib, std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    g_results.push_back({op, mib, med, v.front(), v.back(), n});
    if (std::find(g_ops.begin(), g_ops.end(), op) == g_ops.end())
        g_ops.push_back(op);
    if (std::find(g_sizes.begin(), g_sizes.end(), mib) == g_sizes.end())
        g_sizes.push_back(mib);
}

static CUdevice g_dev;
static CUmemAllocationProp g_prop;
static CUmemAccessDesc g_access;

// Writes the whole range once and waits, so every mapping measured has really been used.
static void touch(CUdeviceptr p, size_t bytes, int rep)
{
    CK(cuMemsetD8(p, (unsigned char)(rep & 0xff), bytes));
    CK(cuCtxSynchronize());
}

// 1. One chunk of `mib` MiB through its whole life, every call timed.
static void chunk_life(size_t mib, int warmup, int reps)
{
    const size_t bytes = mib << 20;
    const char *names[] = {"cuMemCreate",    "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess",
                           "cuMemUnmap",     "cuMemAddressFree",    "cuMemRelease"};
    std::vector<double> t[7];
    for (int rep = -warmup; rep < reps; rep++) {
        double d[7];
        CUmemGenericAllocationHandle h;
        CUdeviceptr va = 0;
        TIMED(d[0], cuMemCreate(&h, bytes, &g_prop, 0));
        TIMED(d[1], cuMemAddressReserve(&va, bytes, 0, 0, 0));
        TIMED(d[2], cuMemMap(va, bytes, 0, h, 0));
        TIMED(d[3], cuMemSetAccess(va, bytes, &g_access, 1));
        touch(va, bytes, rep);
        TIMED(d[4], cuMemUnmap(va, bytes));
        TIMED(d[5], cuMemAddressFree(va, bytes));
        TIMED(d[6], cuMemRelease(h));
        if (rep >= 0)
            for (int i = 0; i < 7; i++)
                t[i].push_back(d[i]);
    }
    for (int i = 0; i < 7; i++)
        add(names[i], mib, t[i]);
}

// 2. cuMemAlloc / cuMemFree of the same size.
static void classic(size_t mib, int warmup, int reps)
{
    const size_t bytes = mib << 20;
    std::vector<double> ta, tf;
    for (int rep = -warmup; rep < reps; rep++) {
        CUdeviceptr p = 0;
        double a, f;
        TIMED(a, cuMemAlloc(&p, bytes));
        touch(p, bytes, rep);
        TIMED(f, cuMemFree(p));
        if (rep >= 0) {
            ta.push_back(a);
            tf.push_back(f);
        }
    }
    add("cuMemAlloc", mib, ta);
    add("cuMemFree", mib, tf);
}

// 3. A block of `mib` MiB mapped from `n` handles of `chunk` bytes each, created beforehand,
// into one range reserved beforehand. `tag` names the variant in the op names.
static void map_block(size_t mib, size_t chunk, const char *tag, int warmup, int reps)
{
    const size_t bytes = mib << 20;
    const size_t n = (bytes + chunk - 1) / chunk;
    const size_t span = n * chunk;  // == bytes when chunk divides it
    std::vector<CUmemGenericAllocationHandle> h(n);
    for (size_t i = 0; i < n; i++)
        CK(cuMemCreate(&h[i], chunk, &g_prop, 0));
    CUdeviceptr va = 0;
    CK(cuMemAddressReserve(&va, span, 0, 0, 0));

    std::vector<double> tmaps, tacc, tboth, tunmap;
    for (int rep = -warmup; rep < reps; rep++) {
        double t0 = now_us();
        for (size_t i = 0; i < n; i++)
            CK(cuMemMap(va + i * chunk, chunk, 0, h[i], 0));
        double t1 = now_us();
        CK(cuMemSetAccess(va, span, &g_access, 1));
        double t2 = now_us();
        touch(va, span, rep);
        double t3 = now_us();
        for (size_t i = 0; i < n; i++)
            CK(cuMemUnmap(va + i * chunk, chunk));
        double t4 = now_us();
        if (rep >= 0) {
            tmaps.push_back(t1 - t0);
            tacc.push_back(t2 - t1);
            tboth.push_back(t2 - t0);
            tunmap.push_back(t4 - t3);
        }
    }
    std::string m = std::string("map_block_") + tag;
    add(m, mib, tboth);
    add(m + "_maps", mib, tmaps);
    add(m + "_access", mib, tacc);
    add(std::string("unmap_block_") + tag, mib, tunmap);

    CK(cuMemAddressFree(va, span));
    for (size_t i = 0; i < n; i++)
        CK(cuMemRelease(h[i]));
}

static void print_results(int reps)
{
    printf("\nmedian µs per call (%d repetitions each; map/unmap_block rows: the whole block)\n",
           reps);
    printf("%-32s", "op \\ size");
    for (size_t s : g_sizes) {
        char h[32];
        snprintf(h, sizeof h, "%zu MiB", s);
        printf(" %10s", h);
    }
    printf("\n");
    for (const std::string &op : g_ops) {
        printf("%-32s", op.c_str());
        for (size_t s : g_sizes) {
            const Series *found = nullptr;
            for (const Series &r : g_results)
                if (r.op == op && r.mib == s)
                    found = &r;
            if (found)
                printf(" %10.1f", found->median);
            else
                printf(" %10s", "-");
        }
        printf("\n");
    }
    printf("\n");
    for (const Series &r : g_results)
        printf("VMM op=%s size_MiB=%zu median_us=%.2f min_us=%.2f max_us=%.2f reps=%zu\n",
               r.op.c_str(), r.mib, r.median, r.min, r.max, r.reps);
}

int main(int argc, char **argv)
{
    int reps = 50, warmup = 3;
    bool exportable = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--handle-type") && i + 1 < argc && !strcmp(argv[i + 1], "none"))
            exportable = false, i++;
        else if (!strcmp(argv[i], "--handle-type") && i + 1 < argc && !strcmp(argv[i + 1], "fd"))
            exportable = true, i++;
        else {
            fprintf(stderr, "usage: vmm_cost [--reps N] [--warmup W] [--handle-type fd|none]\n");
            return 2;
        }
    }
    if (reps < 1 || warmup < 0) {
        fprintf(stderr, "vmm_cost: --reps must be >= 1 and --warmup >= 0\n");
        return 2;
    }

    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&g_dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, g_dev));
    CK(cuCtxSetCurrent(ctx));

    int vmm = 0;
    CK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, g_dev));
    if (!vmm) {
        printf("SKIP vmm_cost: the device does not support virtual memory management\n");
        return 77;
    }
    char name[256] = "";
    CK(cuDeviceGetName(name, sizeof name, g_dev));
    int drv = 0;
    CK(cuDriverGetVersion(&drv));

    memset(&g_prop, 0, sizeof g_prop);
    g_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    g_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    g_prop.location.id = (int)g_dev;
    g_prop.requestedHandleTypes = exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                             : CU_MEM_HANDLE_TYPE_NONE;
    printf("vmm_cost: handle_type=%s\n", exportable ? "fd" : "none");
    memset(&g_access, 0, sizeof g_access);
    g_access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    g_access.location.id = (int)g_dev;
    g_access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

    size_t gmin = 0, grec = 0;
    CK(cuMemGetAllocationGranularity(&gmin, &g_prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CK(cuMemGetAllocationGranularity(&grec, &g_prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    const size_t two_mib = (size_t)2 << 20;
    const size_t chunk = two_mib % gmin == 0 ? two_mib : gmin;
    printf("vmm_cost: device 0 %s, driver %d, granularity minimum=%zu recommended=%zu, "
           "chunk_bytes=%zu, reps=%d warmup=%d\n",
           name, drv, gmin, grec, chunk, reps, warmup);
    fflush(stdout);

    // Sizes must be multiples of the granularity; the listed ones are on every current GPU
    // (2 MiB), and a size that is not is left out with a note.
    const size_t sizes[] = {2, 20, 64, 256, 1024};
    for (size_t s : sizes) {
        if ((s << 20) % gmin) {
            printf("vmm_cost: %zu MiB is not a multiple of the granularity, left out\n", s);
            continue;
        }
        chunk_life(s, warmup, reps);
        classic(s, warmup, reps);
        fflush(stdout);
    }
    const size_t block_sizes[] = {2, 20, 64, 256};
    for (size_t s : block_sizes) {
        if ((s << 20) % gmin)
            continue;
        map_block(s, chunk, "2MiB_chunks", warmup, reps);
        map_block(s, s << 20, "one_handle", warmup, reps);
    }

    print_results(reps);
    printf("PASS vmm_cost reps=%d\n", reps);
    CK(cuDevicePrimaryCtxRelease(g_dev));
    return 0;
}
