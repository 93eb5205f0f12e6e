// ptr_query: every question a program can ask about a pointer must be answered for a block
// as if the driver had allocated it (DESIGN.md, "Pointers stay honest"), whatever backs the
// block: a cuMemAlloc of its own (classic), or physical chunks mapped into a range (pooled).
//
//     ptr_query [--require-shim] [--verbose]
//
// The expectations are what the raw driver answers for its own cuMemAlloc memory, so the
// program passes without the shim too; that run is the reference.
//
// Blocks are allocated both with cudaMalloc (static cudart: reaches the driver through
// cuGetProcAddress) and with cuMemAlloc (direct binding, -lcuda). For each block (base P,
// requested size S), on P, on P + S/2 and on P + S - 1:
//   - cuMemGetAddressRange (v2) succeeds with (P, S);
//   - cuPointerGetAttribute: RANGE_START_ADDR = P, RANGE_SIZE = S, MEMORY_TYPE = DEVICE,
//     DEVICE_ORDINAL = 0, BUFFER_ID the same as at P, IS_LEGACY_CUDA_IPC_CAPABLE the same as
//     at P;
//   - cuPointerGetAttributes of those six agrees with the single queries;
// and once per block:
//   - P + S (one past the end): cuMemGetAddressRange fails (the raw driver: not found) or
//     answers with another allocation's base, never with P;
//   - IS_LEGACY_CUDA_IPC_CAPABLE is 1 exactly when cuIpcGetMemHandle(P) succeeds;
//   - cuMemsetD8 over the block, first and last byte read back.
// Live blocks have distinct BUFFER_IDs. When a block is freed: cuMemGetAddressRange on its
// old base fails with CUDA_ERROR_NOT_FOUND or CUDA_ERROR_INVALID_VALUE. When the same size
// is then allocated again with the same call (a cache hit under the shim) and comes back at
// the same address, its BUFFER_ID differs from the freed block's (the driver never reuses an
// ID), and the new block passes all the checks above.
//
// Phases: (1) 512 B, 100 KiB, 3 MiB, 64 MiB + 1, with each call (8 blocks live); every block
// freed and allocated again in turn; (2) all freed, then 1000 B, 300 KiB, 5 MiB + 7, 24 MiB
// with each call, so a pooled cache has to move memory between sizes; (3) 64 blocks of 4 KiB
// and 64 of 700 B live at once (small blocks packed side by side).
//
// Output: "PTRQ FAIL phase block: check: details" for each failed check, INFO lines with the
// raw answers at the first pointer of each block with --verbose, then "PTRQ ok checks=N" (exit
// 0) or "PTRQ failed=M checks=N" (exit 1). With --require-shim it fails without the shim.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "shim_probe.h"

static int g_checks, g_failed, g_verbose;
static const char *g_phase = "";

static const char *ename(CUresult r)
{
    const char *s = nullptr;
    if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s)
        return "(unknown)";
    return s;
}

// A setup call that must succeed for anything after it to mean something.
#define MUST(call)                                                                            \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                             \
            printf("PTRQ FAIL %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, ename(r_));      \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

struct Block {
    CUdeviceptr p;
    size_t size;
    bool drv;                 // cuMemAlloc (true) or cudaMalloc (false)
    unsigned long long id;    // BUFFER_ID at the base
    int ipc;                  // IS_LEGACY_CUDA_IPC_CAPABLE at the base
    char label[64];
};

// One check; only failures are printed.
static void check(bool ok, const Block &b, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void check(bool ok, const Block &b, const char *what, const char *fmt, ...)
{
    g_checks++;
    if (ok)
        return;
    g_failed++;
    printf("PTRQ FAIL %s %s: %s: ", g_phase, b.label, what);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

static Block alloc_block(size_t size, bool drv)
{
    Block b;
    memset(&b, 0, sizeof b);
    b.size = size;
    b.drv = drv;
    if (drv) {
        MUST(cuMemAlloc(&b.p, size));
    } else {
        void *v = nullptr;
        cudaError_t e = cudaMalloc(&v, size);
        if (e != cudaSuccess) {
            printf("PTRQ FAIL cudaMalloc(%zu) -> %s\n", size, cudaGetErrorName(e));
            exit(1);
        }
        b.p = (CUdeviceptr)(uintptr_t)v;
    }
    snprintf(b.label, sizeof b.label, "%s(%zu)@0x%llx", drv ? "cuMemAlloc" : "cudaMalloc", size,
             (unsigned long long)b.p);
    return b;
}

static void free_raw(const Block &b)
{
    if (b.drv) {
        MUST(cuMemFree(b.p));
    } else {
        cudaError_t e = cudaFree((void *)(uintptr_t)b.p);
        if (e != cudaSuccess) {
            printf("PTRQ FAIL cudaFree(0x%llx) -> %s\n", (unsigned long long)b.p,
                   cudaGetErrorName(e));
            exit(1);
        }
    }
}

// The six attributes, asked one by one and all at once.
struct Attrs {
    CUdeviceptr start;
    size_t size;
    unsigned int mtype;
    int ordinal;
    unsigned long long id;
    int ipc;
};

static const CUpointer_attribute kAttrs[6] = {
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE,      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    CU_POINTER_ATTRIBUTE_BUFFER_ID,        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
};
static const char *const kAttrNames[6] = {"RANGE_START_ADDR", "RANGE_SIZE", "MEMORY_TYPE",
                                          "DEVICE_ORDINAL", "BUFFER_ID",
                                          "IS_LEGACY_CUDA_IPC_CAPABLE"};

static void *attr_slot(Attrs &a, int i)
{
    switch (i) {
    case 0: return &a.start;
    case 1: return &a.size;
    case 2: return &a.mtype;
    case 3: return &a.ordinal;
    case 4: return &a.id;
    default: return &a.ipc;
    }
}

static unsigned long long attr_value(const Attrs &a, int i)
{
    switch (i) {
    case 0: return a.start;
    case 1: return a.size;
    case 2: return a.mtype;
    case 3: return (unsigned long long)(long long)a.ordinal;
    case 4: return a.id;
    default: return (unsigned long long)a.ipc;
    }
}

// Every check at one pointer q of block b. `at` names the pointer ("base", "middle", "last").
static void check_pointer(Block &b, CUdeviceptr q, const char *at)
{
    char what[96];

    CUdeviceptr rb = 0;
    size_t rs = 0;
    CUresult r = cuMemGetAddressRange(&rb, &rs, q);
    snprintf(what, sizeof what, "cuMemGetAddressRange at %s", at);
    check(r == CUDA_SUCCESS && rb == b.p && rs == b.size, b, what,
          "%s base=0x%llx size=%zu, expected base=0x%llx size=%zu", ename(r),
          (unsigned long long)rb, rs, (unsigned long long)b.p, b.size);

    // One by one. Integers are zeroed first: a driver that writes fewer bytes (a bool) still
    // reads right.
    Attrs one;
    memset(&one, 0, sizeof one);
    CUresult rone[6];
    for (int i = 0; i < 6; i++) {
        rone[i] = cuPointerGetAttribute(attr_slot(one, i), kAttrs[i], q);
        snprintf(what, sizeof what, "cuPointerGetAttribute(%s) at %s", kAttrNames[i], at);
        check(rone[i] == CUDA_SUCCESS, b, what, "%s", ename(rone[i]));
    }
    if (g_verbose && !strcmp(at, "base"))
        printf("INFO ptr_query %s %s: range=%s base=0x%llx size=%zu start=0x%llx range_size=%zu "
               "type=%u ordinal=%d buffer_id=%llu ipc_capable=%d\n",
               g_phase, b.label, ename(r), (unsigned long long)rb, rs,
               (unsigned long long)one.start, one.size, one.mtype, one.ordinal, one.id, one.ipc);
    snprintf(what, sizeof what, "RANGE_START_ADDR at %s", at);
    check(one.start == b.p, b, what, "0x%llx, expected 0x%llx", (unsigned long long)one.start,
          (unsigned long long)b.p);
    snprintf(what, sizeof what, "RANGE_SIZE at %s", at);
    check(one.size == b.size, b, what, "%zu, expected %zu", one.size, b.size);
    snprintf(what, sizeof what, "MEMORY_TYPE at %s", at);
    check(one.mtype == CU_MEMORYTYPE_DEVICE, b, what, "%u, expected %u (DEVICE)", one.mtype,
          (unsigned)CU_MEMORYTYPE_DEVICE);
    snprintf(what, sizeof what, "DEVICE_ORDINAL at %s", at);
    check(one.ordinal == 0, b, what, "%d, expected 0", one.ordinal);
    if (!strcmp(at, "base")) {
        b.id = one.id;
        b.ipc = one.ipc;
    } else {
        snprintf(what, sizeof what, "BUFFER_ID at %s", at);
        check(one.id == b.id, b, what, "%llu, at the base %llu", one.id, b.id);
        snprintf(what, sizeof what, "IS_LEGACY_CUDA_IPC_CAPABLE at %s", at);
        check(one.ipc == b.ipc, b, what, "%d, at the base %d", one.ipc, b.ipc);
    }

    // All at once: the same answers.
    Attrs all;
    memset(&all, 0, sizeof all);
    void *data[6];
    for (int i = 0; i < 6; i++)
        data[i] = attr_slot(all, i);
    CUpointer_attribute attrs[6];
    memcpy(attrs, kAttrs, sizeof attrs);
    r = cuPointerGetAttributes(6, attrs, data, q);
    snprintf(what, sizeof what, "cuPointerGetAttributes at %s", at);
    check(r == CUDA_SUCCESS, b, what, "%s", ename(r));
    for (int i = 0; i < 6; i++) {
        if (rone[i] != CUDA_SUCCESS)
            continue;
        snprintf(what, sizeof what, "cuPointerGetAttributes(%s) at %s", kAttrNames[i], at);
        check(attr_value(all, i) == attr_value(one, i), b, what,
              "0x%llx, cuPointerGetAttribute said 0x%llx", attr_value(all, i),
              attr_value(one, i));
    }
}

static void check_block(Block &b)
{
    check_pointer(b, b.p, "base");
    if (b.size / 2 > 0)
        check_pointer(b, b.p + b.size / 2, "middle");
    if (b.size > 1)
        check_pointer(b, b.p + b.size - 1, "last");

    // One past the end: not ours. The raw driver says not found, or names the allocation
    // that happens to start there; it never claims P's block.
    CUdeviceptr rb = 0;
    size_t rs = 0;
    CUresult r = cuMemGetAddressRange(&rb, &rs, b.p + b.size);
    check(r != CUDA_SUCCESS || rb != b.p, b, "cuMemGetAddressRange one past the end",
          "%s base=0x%llx size=%zu: claims the block", ename(r), (unsigned long long)rb, rs);
    if (g_verbose)
        printf("INFO ptr_query %s %s: one past the end -> %s base=0x%llx size=%zu\n", g_phase,
               b.label, ename(r), (unsigned long long)rb, rs);

    // Legacy IPC: capable exactly when a handle can be had.
    CUipcMemHandle h;
    r = cuIpcGetMemHandle(&h, b.p);
    check((b.ipc != 0) == (r == CUDA_SUCCESS), b, "IS_LEGACY_CUDA_IPC_CAPABLE vs cuIpcGetMemHandle",
          "capable=%d but cuIpcGetMemHandle -> %s", b.ipc, ename(r));

    // Usable: every byte written, the first and the last read back.
    unsigned char tag = (unsigned char)(0x5A ^ (b.size & 0xff)), first = 0, last = 0;
    MUST(cuMemsetD8(b.p, tag, b.size));
    MUST(cuMemcpyDtoH(&first, b.p, 1));
    MUST(cuMemcpyDtoH(&last, b.p + b.size - 1, 1));
    check(first == tag && last == tag, b, "memset and read back", "first=0x%02x last=0x%02x, "
          "expected 0x%02x", first, last, tag);
}

// Distinct BUFFER_IDs across live blocks.
static void check_distinct(const std::vector<Block> &v)
{
    for (size_t i = 0; i < v.size(); i++)
        for (size_t j = i + 1; j < v.size(); j++)
            check(v[i].id != v[j].id, v[i], "BUFFER_ID distinct between live blocks",
                  "%llu, the same as %s", v[i].id, v[j].label);
}

// Free b, then its old base must be unknown.
static void free_and_check(const Block &b)
{
    free_raw(b);
    CUdeviceptr rb = 0;
    size_t rs = 0;
    CUresult r = cuMemGetAddressRange(&rb, &rs, b.p);
    check(r == CUDA_ERROR_NOT_FOUND || r == CUDA_ERROR_INVALID_VALUE, b,
          "cuMemGetAddressRange after free", "%s base=0x%llx size=%zu", ename(r),
          (unsigned long long)rb, rs);
}

// Free b and allocate its size again with the same call; when the address comes back, the
// BUFFER_ID must be new. Returns the new block, checked.
static int g_same_address, g_reallocs;
static Block realloc_block(const Block &b)
{
    free_and_check(b);
    Block nb = alloc_block(b.size, b.drv);
    g_reallocs++;
    check_block(nb);
    if (nb.p == b.p) {
        g_same_address++;
        check(nb.id != b.id, nb, "BUFFER_ID new after free and reallocation at the same address",
              "%llu, the freed block's was %llu", nb.id, b.id);
    }
    return nb;
}

static void run_sizes(const char *phase, const size_t *sizes, int n, std::vector<Block> &live)
{
    g_phase = phase;
    for (int i = 0; i < n; i++)
        for (int drv = 0; drv < 2; drv++) {
            live.push_back(alloc_block(sizes[i], drv != 0));
            check_block(live.back());
        }
    check_distinct(live);
}

int main(int argc, char **argv)
{
    int require_shim = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--require-shim"))
            require_shim = 1;
        else if (!strcmp(argv[i], "--verbose"))
            g_verbose = 1;
        else {
            fprintf(stderr, "usage: ptr_query [--require-shim] [--verbose]\n");
            return 2;
        }
    }
    // cudart makes the primary context current on this thread; the driver calls use it.
    if (cudaFree(0) != cudaSuccess) {
        printf("PTRQ FAIL cudaFree(0): no CUDA device\n");
        return 1;
    }

    std::vector<Block> live;

    // (1) the sizes of the issue, then each block freed and allocated again in turn.
    static const size_t sizes1[] = {512, 100 << 10, 3 << 20, (64 << 20) + 1};
    run_sizes("phase1", sizes1, 4, live);
    g_phase = "phase1-realloc";
    for (Block &b : live)
        b = realloc_block(b);
    check_distinct(live);

    // (2) everything freed, other sizes.
    g_phase = "phase1-free";
    for (const Block &b : live)
        free_and_check(b);
    live.clear();
    static const size_t sizes2[] = {1000, 300 << 10, (5 << 20) + 7, 24 << 20};
    run_sizes("phase2", sizes2, 4, live);
    g_phase = "phase2-free";
    for (const Block &b : live)
        free_and_check(b);
    live.clear();

    // (3) many small blocks live at once, side by side in a pooled cache.
    g_phase = "phase3";
    for (int i = 0; i < 128; i++) {
        live.push_back(alloc_block(i < 64 ? 4096 : 700, (i & 1) != 0));
        check_block(live.back());
    }
    check_distinct(live);
    g_phase = "phase3-free";
    for (const Block &b : live)
        free_and_check(b);
    live.clear();

    printf("INFO ptr_query: reallocations=%d came_back_at_the_same_address=%d\n", g_reallocs,
           g_same_address);
    if (shim_require("ptr_query", require_shim))
        g_failed++;
    if (g_failed) {
        printf("PTRQ failed=%d checks=%d\n", g_failed, g_checks);
        return 1;
    }
    printf("PTRQ ok checks=%d\n", g_checks);
    return 0;
}
