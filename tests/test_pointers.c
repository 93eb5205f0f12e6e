/* Integration tests of what the pooled backend changes, run with each backend: pointer
 * queries, IPC handles, peer access, memory moving between blocks while the GPU lags, memory
 * near the device's size, and the cap and trim over pooled memory. This program runs under
 * LD_PRELOAD=libcacheshim.so against the fake driver; argv[1] picks the group, and meson runs
 * each group as configured (pooled) and with CACHESHIM_BACKEND=classic.
 *
 * A block must answer every pointer query as if the driver had allocated it with cuMemAlloc
 * (DESIGN.md, "Invariants"): its range is its base and the size the program asked for, its
 * buffer id is new at each hand-out, and a freed block, or a byte past what was asked for, is
 * memory the driver does not know. Other memory passes through: the fake's own answers
 * (through fake_real_symbol, past the shim) are what the shim's must equal there. */
#include <cuda.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "shim_util.h"

#define GiB (1024 * MiB)
#define GRANULE (2 * MiB) /* the fake's default granularity */

typedef CUresult (*range2_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*range1_fn)(unsigned int *, unsigned int *, unsigned int);
typedef CUresult (*attr_fn)(void *, CUpointer_attribute, CUdeviceptr);
typedef CUresult (*attrs_fn)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);
typedef CUresult (*ipc_fn)(CUipcMemHandle *, CUdeviceptr);
typedef CUresult (*peer_fn)(CUcontext, unsigned int);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t,
                            CUdriverProcAddressQueryResult *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

/* The 32-bit original, which cuda.h renames to cuMemGetAddressRange_v2: bound by its own
 * exported name, as a program built against CUDA 3.0 is. */
CUresult range_v1_export(unsigned int *pbase, unsigned int *psize, unsigned int dptr)
    __asm__("cuMemGetAddressRange");

/* The pointer entry points as a program finds them one way. */
typedef struct {
    const char *how;
    range2_fn range2;
    range1_fn range1;
    attr_fn attr;
    attrs_fn attrs;
    ipc_fn ipc;
    peer_fn peer;
} api;

enum { EXPORT, DLSYM, PROCADDR, PATHS };
static api paths[PATHS];
static api real; /* the fake's own functions, past the shim */
static CUcontext primary;
static void *libcuda;

/* CACHESHIM_REUSE: ordered (the default) or completed. */
static bool reuse_ordered(void)
{
    const char *m = getenv("CACHESHIM_REUSE");
    return !m || strcmp(m, "completed") != 0;
}

static void *gpa(const char *name, int version)
{
    gpa2_fn g = (gpa2_fn)dlsym(libcuda, "cuGetProcAddress_v2");
    void *self = NULL, *p = NULL;
    CUdriverProcAddressQueryResult st;
    assert_non_null(g);
    /* As cudart does: the pointer for "cuGetProcAddress" itself, then that. */
    assert_int_equal(g("cuGetProcAddress", &self, 13000, 0, &st), CUDA_SUCCESS);
    assert_int_equal(((gpa2_fn)self)(name, &p, version, 0, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SUCCESS);
    return p;
}

static int setup(void **state)
{
    (void)state;
    primary = shim_test_primary();
    libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    assert_non_null(libcuda);
    paths[EXPORT] = (api){"export", cuMemGetAddressRange_v2, range_v1_export, cuPointerGetAttribute,
                          cuPointerGetAttributes, cuIpcGetMemHandle, cuCtxEnablePeerAccess};
    paths[DLSYM] = (api){"dlsym",
                         (range2_fn)dlsym(libcuda, "cuMemGetAddressRange_v2"),
                         (range1_fn)dlsym(libcuda, "cuMemGetAddressRange"),
                         (attr_fn)dlsym(libcuda, "cuPointerGetAttribute"),
                         (attrs_fn)dlsym(libcuda, "cuPointerGetAttributes"),
                         (ipc_fn)dlsym(libcuda, "cuIpcGetMemHandle"),
                         (peer_fn)dlsym(libcuda, "cuCtxEnablePeerAccess")};
    paths[PROCADDR] = (api){"cuGetProcAddress",
                            (range2_fn)gpa("cuMemGetAddressRange", 13000),
                            (range1_fn)gpa("cuMemGetAddressRange", 3000),
                            (attr_fn)gpa("cuPointerGetAttribute", 13000),
                            (attrs_fn)gpa("cuPointerGetAttributes", 13000),
                            (ipc_fn)gpa("cuIpcGetMemHandle", 13000),
                            (peer_fn)gpa("cuCtxEnablePeerAccess", 13000)};
    real = (api){"driver",
                 (range2_fn)fake_real_symbol("cuMemGetAddressRange_v2"),
                 (range1_fn)fake_real_symbol("cuMemGetAddressRange"),
                 (attr_fn)fake_real_symbol("cuPointerGetAttribute"),
                 (attrs_fn)fake_real_symbol("cuPointerGetAttributes"),
                 (ipc_fn)fake_real_symbol("cuIpcGetMemHandle"),
                 (peer_fn)fake_real_symbol("cuCtxEnablePeerAccess")};
    return 0;
}

/* Every test leaves an idle GPU and no injected failure, race or fault behind. */
static int check_clean(void **state)
{
    (void)state;
    fake_retire_all();
    fake_set_work_ticks(0);
    fake_set_ignore_stream_waits(0);
    long races = fake_races(), unmap_faults = fake_unmap_faults();
    fake_reset_counters();
    assert_int_equal(races, 0);
    assert_int_equal(unmap_faults, 0);
    return 0;
}

/* ================================================================ pointer queries */

/* Every attribute the fake answers (P2P_TOKENS and SYNC_MEMOPS are not modelled). */
static const CUpointer_attribute all_attrs[] = {
    CU_POINTER_ATTRIBUTE_CONTEXT,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
    CU_POINTER_ATTRIBUTE_HOST_POINTER,
    CU_POINTER_ATTRIBUTE_BUFFER_ID,
    CU_POINTER_ATTRIBUTE_IS_MANAGED,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    CU_POINTER_ATTRIBUTE_MAPPED,
    CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
    CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
    CU_POINTER_ATTRIBUTE_ACCESS_FLAGS,
    CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
    CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
    CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
    CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID,
    CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE,
};
#define NATTRS (sizeof all_attrs / sizeof all_attrs[0])

/* The bytes each attribute's value has (cuda.h's types; fake_ptr.c writes them so). */
static size_t attr_size(CUpointer_attribute a)
{
    switch (a) {
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: return 4;
    default: return 8;
    }
}

#define SENTINEL 0xababababababababull

/* One attribute through cuPointerGetAttribute into a sentinel-filled word. */
static CUresult one(const api *a, CUpointer_attribute attr, CUdeviceptr p, uint64_t *v)
{
    *v = SENTINEL;
    return a->attr(v, attr, p);
}

/* The value written for attr, read at its own size. */
static uint64_t value(CUpointer_attribute attr, uint64_t v)
{
    return attr_size(attr) == 4 ? (uint32_t)v : v;
}

/* cuPointerGetAttributes of every attribute agrees with cuPointerGetAttribute of each: the
 * same value where that succeeds, zero where it fails (the driver's defaults). */
static void attrs_agree(const api *a, CUdeviceptr p)
{
    uint64_t many[NATTRS];
    void *data[NATTRS];
    CUpointer_attribute attrs[NATTRS];
    for (size_t i = 0; i < NATTRS; i++) {
        many[i] = SENTINEL;
        data[i] = &many[i];
        attrs[i] = all_attrs[i];
    }
    assert_int_equal(a->attrs(NATTRS, attrs, data, p), CUDA_SUCCESS);
    for (size_t i = 0; i < NATTRS; i++) {
        uint64_t single;
        CUresult r = one(a, all_attrs[i], p, &single);
        if (r == CUDA_SUCCESS) {
            if (many[i] != single)
                fail_msg("%s: attribute %d at %#llx: %#llx from cuPointerGetAttributes, %#llx "
                         "from cuPointerGetAttribute", a->how, (int)all_attrs[i],
                         (unsigned long long)p, (unsigned long long)many[i],
                         (unsigned long long)single);
        } else {
            assert_int_equal(r, CUDA_ERROR_INVALID_VALUE);
            assert_int_equal(value(all_attrs[i], many[i]), 0);
        }
    }
}

/* What a pointer in a block the program holds must answer: the block's base and requested
 * size, its buffer id (returned), and for the rest what cuMemAlloc memory answers. */
static uint64_t check_in_block(const api *a, CUdeviceptr p, CUdeviceptr base, size_t size,
                               CUcontext ctx, int device)
{
    CUdeviceptr b = 0;
    size_t n = 0;
    assert_int_equal(a->range2(&b, &n, p), CUDA_SUCCESS);
    assert_int_equal(b, base);
    assert_int_equal(n, size);
    assert_int_equal(a->range2(NULL, &n, p), CUDA_SUCCESS);  /* either may be NULL */
    assert_int_equal(a->range2(&b, NULL, p), CUDA_SUCCESS);
    uint64_t v, id;
    static const struct {
        CUpointer_attribute attr;
        int what; /* 0: a value; 1: the base; 2: the size; 3: the pointer; 4: the context */
        uint64_t value;
    } want[] = {
        {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, 1, 0},
        {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, 1, 0},
        {CU_POINTER_ATTRIBUTE_RANGE_SIZE, 2, 0},
        {CU_POINTER_ATTRIBUTE_MAPPING_SIZE, 2, 0},
        {CU_POINTER_ATTRIBUTE_DEVICE_POINTER, 3, 0},
        {CU_POINTER_ATTRIBUTE_CONTEXT, 4, 0},
        {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 0, CU_MEMORYTYPE_DEVICE},
        {CU_POINTER_ATTRIBUTE_IS_MANAGED, 0, 0},
        {CU_POINTER_ATTRIBUTE_MAPPED, 0, 1},
        {CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, 0, CU_MEM_HANDLE_TYPE_NONE},
        {CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, 0, CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE},
        {CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, 0, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        assert_int_equal(one(a, want[i].attr, p, &v), CUDA_SUCCESS);
        uint64_t w = want[i].what == 1   ? base
                     : want[i].what == 2 ? size
                     : want[i].what == 3 ? p
                     : want[i].what == 4 ? (uint64_t)(uintptr_t)ctx
                                         : want[i].value;
        if (value(want[i].attr, v) != w)
            fail_msg("%s: attribute %d at %#llx is %#llx, expected %#llx", a->how,
                     (int)want[i].attr, (unsigned long long)p, (unsigned long long)v,
                     (unsigned long long)w);
    }
    assert_int_equal(one(a, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p, &v), CUDA_SUCCESS);
    assert_int_equal((int)(uint32_t)v, device);
    /* Export: a classic block is a cuMemAlloc allocation; a pooled one is exported by the
     * shim as a block (test_ipc), never as the chunks under it. */
    assert_int_equal(one(a, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p, &v), CUDA_SUCCESS);
    assert_int_equal((uint32_t)v, 1);
    assert_int_equal(one(a, CU_POINTER_ATTRIBUTE_HOST_POINTER, p, &v), CUDA_ERROR_INVALID_VALUE);
    /* The buffer id: the shim's own (high bit), the same for both names of it. */
    assert_int_equal(one(a, CU_POINTER_ATTRIBUTE_BUFFER_ID, p, &id), CUDA_SUCCESS);
    assert_true(id >> 63);
    assert_int_equal(one(a, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, p, &v), CUDA_SUCCESS);
    assert_int_equal(v, id);
    attrs_agree(a, p);
    return id;
}

/* What memory the driver does not know answers: a freed block, or past what was asked for. */
#define check_unknown(a, p) check_unknown_at(a, p, __LINE__)
static void check_unknown_at(const api *a, CUdeviceptr p, int line)
{
    CUdeviceptr b = 1;
    size_t n = 1;
    CUresult r = a->range2(&b, &n, p);
    if (r != CUDA_ERROR_NOT_FOUND)
        fail_msg("line %d, %s: cuMemGetAddressRange at %#llx: %d (base %#llx, size %zu), "
                 "expected CUDA_ERROR_NOT_FOUND", line, a->how, (unsigned long long)p, (int)r,
                 (unsigned long long)b, n);
    for (size_t i = 0; i < NATTRS; i++) {
        uint64_t v;
        CUresult ra = one(a, all_attrs[i], p, &v);
        if (ra != CUDA_ERROR_INVALID_VALUE)
            fail_msg("line %d, %s: attribute %d at %#llx: %d, expected CUDA_ERROR_INVALID_VALUE",
                     line, a->how, (int)all_attrs[i], (unsigned long long)p, (int)ra);
    }
    attrs_agree(a, p);  /* all zero */
    CUipcMemHandle h;
    assert_int_equal(a->ipc(&h, p), CUDA_ERROR_INVALID_VALUE);
}

/* Memory the shim did not hand out: every answer is the driver's own. */
static void check_passes_through(const api *a, CUdeviceptr p)
{
    CUdeviceptr b1 = 0, b2 = 0;
    size_t n1 = 0, n2 = 0;
    assert_int_equal(a->range2(&b1, &n1, p), real.range2(&b2, &n2, p));
    assert_int_equal(b1, b2);
    assert_int_equal(n1, n2);
    for (size_t i = 0; i < NATTRS; i++) {
        uint64_t v1, v2;
        assert_int_equal(one(a, all_attrs[i], p, &v1), one(&real, all_attrs[i], p, &v2));
        assert_int_equal(v1, v2);
    }
    attrs_agree(a, p);
    CUipcMemHandle h1, h2;
    memset(&h1, 0, sizeof h1);
    memset(&h2, 0, sizeof h2);
    assert_int_equal(a->ipc(&h1, p), real.ipc(&h2, p));
    assert_memory_equal(&h1, &h2, sizeof h1);
}

/* Every path hands out the shim's wrapper, the same one, never the driver's own. */
static void test_every_path_gets_the_wrappers(void **state)
{
    (void)state;
    for (int i = 0; i < PATHS; i++) {
        const api *a = &paths[i];
        assert_ptr_equal(a->range2, paths[EXPORT].range2);
        assert_ptr_equal(a->range1, paths[EXPORT].range1);
        assert_ptr_equal(a->attr, paths[EXPORT].attr);
        assert_ptr_equal(a->attrs, paths[EXPORT].attrs);
        assert_ptr_equal(a->ipc, paths[EXPORT].ipc);
        assert_ptr_equal(a->peer, paths[EXPORT].peer);
        assert_ptr_not_equal(a->range2, real.range2);
        assert_ptr_not_equal(a->range1, real.range1);
        assert_ptr_not_equal((void *)a->range1, (void *)a->range2);
        assert_ptr_not_equal(a->attr, real.attr);
        assert_ptr_not_equal(a->attrs, real.attrs);
        assert_ptr_not_equal(a->ipc, real.ipc);
        assert_ptr_not_equal(a->peer, real.peer);
    }
}

/* A large block (whole granules) and a small one (pooled: a slab's slot): base, interior, last
 * byte asked for, one past it; then freed, and given back to the driver. Through each path. */
static void test_block_queries(void **state)
{
    (void)state;
    static const size_t sizes[] = {3 * MiB + 5, 1000000, 5000};
    for (int k = 0; k < PATHS; k++) {
        const api *a = &paths[k];
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            size_t n = sizes[s];
            CUdeviceptr p = must_alloc(n);
            uint64_t id = check_in_block(a, p, p, n, primary, 0);
            assert_int_equal(check_in_block(a, p + n / 2, p, n, primary, 0), id);
            assert_int_equal(check_in_block(a, p + n - 1, p, n, primary, 0), id);
            check_unknown(a, p + n);  /* still inside the block's memory, not asked for */
            /* The memory is what the pointers say: written and read back at both ends. */
            assert_int_equal(cuMemsetD8(p, 0x11, n), CUDA_SUCCESS);
            unsigned char last = 0;
            assert_int_equal(cuMemcpyDtoH(&last, p + n - 1, 1), CUDA_SUCCESS);
            assert_int_equal(last, 0x11);
            must_free(p);
            check_unknown(a, p);           /* cached, not the program's */
            check_unknown(a, p + n / 2);
            fake_retire_all();
            shim_trim();
            check_unknown(a, p);           /* given back to the driver */
            check_unknown(a, p + n / 2);
        }
    }
}

/* Two small blocks side by side (pooled: slots 0 and 1 of a new slab): each answers for
 * itself, the bytes between them (past the first's request) for neither; a freed slot next
 * to a live one, cached or given back, is not the program's; nor is memory of the slab that
 * no block holds. */
static void test_slab_neighbours(void **state)
{
    (void)state;
    const size_t n = 3333, slot = 3584; /* a size class no other test uses */
    for (int k = 0; k < PATHS; k++) {
        const api *a = &paths[k];
        CUdeviceptr x = must_alloc(n), y = must_alloc(n);
        if (shim_pooled())
            assert_int_equal(y, x + slot);  /* a new slab: the lowest slots first */
        uint64_t idx = check_in_block(a, x, x, n, primary, 0);
        uint64_t idy = check_in_block(a, y, y, n, primary, 0);
        assert_int_not_equal(idx, idy);
        check_in_block(a, x + n - 1, x, n, primary, 0);
        check_unknown(a, x + n);
        if (shim_pooled()) {
            check_unknown(a, x + slot - 1);  /* the slot's tail */
            assert_int_equal(check_in_block(a, x + slot, y, n, primary, 0), idy);
            /* Past the slab's last slot (18 slots of 3584 bytes in a 64 KiB page), and past
             * the slab (its granule's other pages): mapped memory no block holds. */
            check_unknown(a, x + 18 * slot);
            check_unknown(a, x + 64 * 1024 + 100);
        }
        must_free(x);
        check_unknown(a, x);
        check_in_block(a, y, y, n, primary, 0);
        fake_retire_all();
        shim_trim();  /* x's slot goes back to its slab, which y keeps */
        check_unknown(a, x);
        check_unknown(a, x + 100);
        check_in_block(a, y + 100, y, n, primary, 0);
        must_free(y);
        fake_retire_all();
        shim_trim();
    }
}

/* The buffer id is new at every hand-out, also of the same block at the same address. */
static void test_buffer_id_new_at_every_hand_out(void **state)
{
    (void)state;
    static const size_t sizes[] = {6 * MiB, 7777};
    for (size_t s = 0; s < 2; s++) {
        uint64_t ids[4];
        CUdeviceptr first = 0;
        for (int i = 0; i < 4; i++) {
            CUdeviceptr p = must_alloc(sizes[s]);
            if (i == 0)
                first = p;
            assert_int_equal(p, first);  /* the same block, a hit */
            const api *a = &paths[i % PATHS];
            ids[i] = check_in_block(a, p + 1, p, sizes[s], primary, 0);
            for (int j = 0; j < i; j++)
                assert_int_not_equal(ids[i], ids[j]);
            must_free(p);
            uint64_t v;
            assert_int_equal(one(a, CU_POINTER_ATTRIBUTE_BUFFER_ID, p, &v),
                             CUDA_ERROR_INVALID_VALUE);
        }
    }
}

/* The program's own cuMemAlloc memory, past the shim: the driver's answers, its buffer id, a
 * handle for it; in a pooled process and a classic one alike. */
static void test_foreign_memory_passes_through(void **state)
{
    (void)state;
    alloc_fn real_alloc = (alloc_fn)fake_real_symbol("cuMemAlloc_v2");
    free_fn real_free = (free_fn)fake_real_symbol("cuMemFree_v2");
    CUdeviceptr f;
    assert_int_equal(real_alloc(&f, 5 * MiB + 3), CUDA_SUCCESS);
    CUdeviceptr live = must_alloc(5 * MiB + 3); /* a block of the same size beside it */
    for (int k = 0; k < PATHS; k++) {
        const api *a = &paths[k];
        for (size_t off = 0; off < 5 * MiB + 3; off += MiB + 1)
            check_passes_through(a, f + off);
        check_passes_through(a, f + 5 * MiB + 3);
        uint64_t v;
        assert_int_equal(one(a, CU_POINTER_ATTRIBUTE_BUFFER_ID, f, &v), CUDA_SUCCESS);
        assert_false(v >> 63);  /* the driver's own id */
        CUdeviceptr b;
        size_t n;
        assert_int_equal(a->range2(&b, &n, f + 7), CUDA_SUCCESS);
        assert_int_equal(b, f);
        assert_int_equal(n, 5 * MiB + 3);
        CUipcMemHandle h;
        assert_int_equal(a->ipc(&h, f), CUDA_SUCCESS);
        /* And memory that is nobody's: a host address. */
        static const char host = 0;
        check_passes_through(a, (CUdeviceptr)(uintptr_t)&host);
    }
    assert_int_equal(real_free(f), CUDA_SUCCESS);
    must_free(live);
}

/* The 32-bit cuMemGetAddressRange: the shim's blocks lie above 4 GiB (so does all memory the
 * fake gives without a hint), where it answers as the driver does for their truncated
 * addresses; memory below 4 GiB that is not the shim's gets the driver's answer. */
static void test_address_range_v1(void **state)
{
    (void)state;
    CUdeviceptr p = must_alloc(3 * MiB);
    assert_true(p > UINT32_MAX);
    for (int k = 0; k < PATHS; k++) {
        unsigned int b1 = 7, n1 = 7, b2 = 7, n2 = 7;
        assert_int_equal(paths[k].range1(&b1, &n1, (unsigned int)p),
                         real.range1(&b2, &n2, (unsigned int)p));
        assert_int_equal(b1, b2);
        assert_int_equal(n1, n2);
    }
    must_free(p);
    /* Memory of the program's own, mapped at a low address. */
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long) =
        fake_real_symbol("cuMemAddressReserve");
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long) = fake_real_symbol("cuMemCreate");
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                    unsigned long long) = fake_real_symbol("cuMemMap");
    CUresult (*unmap)(CUdeviceptr, size_t) = fake_real_symbol("cuMemUnmap");
    CUresult (*release)(CUmemGenericAllocationHandle) = fake_real_symbol("cuMemRelease");
    CUresult (*addr_free)(CUdeviceptr, size_t) = fake_real_symbol("cuMemAddressFree");
    CUdeviceptr low = 0;
    assert_int_equal(reserve(&low, 4 * MiB, 0, 0x40000000, 0), CUDA_SUCCESS);
    if (low + 4 * MiB > UINT32_MAX) {
        assert_int_equal(addr_free(low, 4 * MiB), CUDA_SUCCESS);
        skip();  /* the address space there was taken */
    }
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemGenericAllocationHandle h;
    assert_int_equal(create(&h, 2 * MiB, &prop, 0), CUDA_SUCCESS);
    assert_int_equal(map(low + 2 * MiB, 2 * MiB, 0, h, 0), CUDA_SUCCESS);
    for (int k = 0; k < PATHS; k++) {
        unsigned int b = 0, n = 0;
        assert_int_equal(paths[k].range1(&b, &n, (unsigned int)(low + 2 * MiB + 100)),
                         CUDA_SUCCESS);
        assert_int_equal(b, low + 2 * MiB);
        assert_int_equal(n, 2 * MiB);
        assert_int_equal(paths[k].range1(&b, &n, (unsigned int)(low + 100)), CUDA_ERROR_NOT_FOUND);
    }
    assert_int_equal(unmap(low + 2 * MiB, 2 * MiB), CUDA_SUCCESS);
    assert_int_equal(release(h), CUDA_SUCCESS);
    assert_int_equal(addr_free(low, 4 * MiB), CUDA_SUCCESS);
}

/* ================================================================ IPC */

/* The fake's handle (fake_ptr.c): who made it, and which allocation. */
struct wire {
    char magic[8];
    uint32_t pid;
    int32_t device;
    uint64_t buffer_id, base, size;
};

/* Runs fn with stderr going to a file; returns what it wrote. */
static char *capture_stderr(void (*fn)(void *), void *arg)
{
    char path[] = "/tmp/cacheshim-stderr-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    off_t len = lseek(fd, 0, SEEK_END);
    char *out = calloc(1, (size_t)len + 1);
    assert_non_null(out);
    assert_int_equal(pread(fd, out, (size_t)len, 0), len);
    close(fd);
    return out;
}

static CUdeviceptr ipc_block[3];
static CUresult ipc_results[PATHS][3];
static CUipcMemHandle ipc_handles[PATHS];

static void ask_handles(void *arg)
{
    (void)arg;
    for (int k = 0; k < PATHS; k++) {
        memset(&ipc_handles[k], 0, sizeof ipc_handles[k]);
        ipc_results[k][0] = paths[k].ipc(&ipc_handles[k], ipc_block[0]);
        CUipcMemHandle h;
        ipc_results[k][1] = paths[k].ipc(&h, ipc_block[1]);  /* a small block */
        ipc_results[k][2] = paths[k].ipc(&h, ipc_block[0] + 4096);  /* interior */
    }
}

/* The shim's handle of a pooled block (shim/cs_ipc.c): who exports it, and which block. */
struct shim_wire {
    char magic[8];
    uint32_t pid;
    int32_t device;
    uint64_t token, base, serial, size;
};

/* Pooled: the shim's handle of the block, the same through every path, nothing said; a small
 * block too; an interior pointer refused, as the driver does. Classic: the driver's handle of
 * the block's allocation. */
static void test_ipc(void **state)
{
    (void)state;
    ipc_block[0] = must_alloc(3 * MiB + 5);
    ipc_block[1] = must_alloc(4000);
    char *err = capture_stderr(ask_handles, NULL);
    for (int k = 0; k < PATHS; k++) {
        assert_int_equal(ipc_results[k][0], CUDA_SUCCESS);
        assert_int_equal(ipc_results[k][1], CUDA_SUCCESS);
        assert_int_equal(ipc_results[k][2], CUDA_ERROR_INVALID_VALUE); /* the driver's answer */
        assert_memory_equal(&ipc_handles[k], &ipc_handles[0], sizeof ipc_handles[k]);
        if (shim_pooled()) {
            struct shim_wire w;
            memcpy(&w, ipc_handles[k].reserved, sizeof w);
            assert_memory_equal(w.magic, "csIPCv02", 8);
            assert_int_equal(w.pid, (uint32_t)getpid());
            assert_int_equal(w.device, 0);
            assert_int_equal(w.base, ipc_block[0]);
            assert_int_equal(w.size, 3 * MiB + 5);  /* what the program asked for */
        } else {
            struct wire w;
            memcpy(&w, ipc_handles[k].reserved, sizeof w);
            assert_memory_equal(w.magic, "fakecuIP", 8);
            assert_int_equal(w.pid, (uint32_t)getpid());
            assert_int_equal(w.device, 0);
            assert_int_equal(w.base, ipc_block[0]);
            assert_int_equal(w.size, 4 * MiB);  /* the allocation: the block's two granules */
        }
    }
    assert_string_equal(err, "");
    free(err);
    /* A freed block: no handle, and nothing said. */
    must_free(ipc_block[0]);
    err = capture_stderr(ask_handles, NULL);
    for (int k = 0; k < PATHS; k++)
        assert_int_equal(ipc_results[k][0], CUDA_ERROR_INVALID_VALUE);
    assert_string_equal(err, "");
    free(err);
    must_free(ipc_block[1]);
}

/* ---------------------------------------------------------------- another process opens */

#define FILL 0x5a    /* what the exporter writes */
#define REPLY 0xc3   /* what the importer writes back */

static const char *g_prog;

/* A child process, this program again (mode "ipc-child", under the shim as this one is),
 * opens `h` and does what `what` says (ipc_child below). Returns its exit status; its stderr
 * goes to ours. hold: between its open and its close, the child waits for us: `between` runs
 * then. */
static int run_child(const CUipcMemHandle *h, size_t size, const char *what,
                     void (*between)(void))
{
    char hex[2 * sizeof h->reserved + 1], sz[32];
    for (size_t i = 0; i < sizeof h->reserved; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)h->reserved[i]);
    snprintf(sz, sizeof sz, "%zu", size);
    int to_child[2], from_child[2];
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(from_child[1], 3);
        dup2(to_child[0], 4);
        setenv("IPC_HANDLE", hex, 1);
        setenv("IPC_SIZE", sz, 1);
        setenv("IPC_WHAT", what, 1);
        execl("/proc/self/exe", g_prog, "ipc-child", (char *)NULL);
        _exit(127);
    }
    close(from_child[1]);
    close(to_child[0]);
    if (between) {
        char c = 0;
        assert_int_equal(read(from_child[0], &c, 1), 1);
        assert_int_equal(c, 'o');
        between();
        assert_int_equal(write(to_child[1], "g", 1), 1);
    }
    close(from_child[0]);
    close(to_child[1]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void fill_bytes(CUdeviceptr p, size_t n, unsigned char v)
{
    assert_int_equal(cuMemsetD8(p, v, n), CUDA_SUCCESS);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
}

static bool all_bytes(CUdeviceptr p, size_t n, unsigned char v)
{
    unsigned char *b = malloc(n);
    assert_non_null(b);
    assert_int_equal(cuMemcpyDtoH(b, p, n), CUDA_SUCCESS);
    size_t i = 0;
    while (i < n && b[i] == v)
        i++;
    if (i < n)
        fprintf(stderr, "byte %zu of %zu at %#llx is %#x, not %#x\n", i, n,
                (unsigned long long)p, b[i], v);
    free(b);
    return i == n;
}

static CUipcMemHandle handle_of(CUdeviceptr p)
{
    CUipcMemHandle h;
    assert_int_equal(cuIpcGetMemHandle(&h, p), CUDA_SUCCESS);
    return h;
}

/* Pooled: a large block (two granules, the last one part free) and a small one (a slab's slot)
 * opened by another process, which sees what we wrote and writes back what we then see; a
 * handle cannot be opened where it was made; a failure on either side is the call's error,
 * with nothing left mapped or held in the importer. Classic: the driver's handle, and the
 * driver's answer (the fake cannot open one elsewhere). */
static void test_ipc_open_elsewhere(void **state)
{
    (void)state;
    const size_t sizes[] = {3 * MiB + 5, 4000};
    for (size_t i = 0; i < 2; i++) {
        CUdeviceptr p = must_alloc(sizes[i]);
        fill_bytes(p, sizes[i], FILL);
        CUipcMemHandle h = handle_of(p);
        if (!shim_pooled()) {
            assert_int_equal(run_child(&h, sizes[i], "expect:801", NULL), 0);
            must_free(p);
            continue;
        }
        assert_int_equal(run_child(&h, sizes[i], "read", NULL), 0);
        assert_true(all_bytes(p, sizes[i], REPLY));
        /* Twice: each open maps the memory anew. */
        fill_bytes(p, sizes[i], FILL);
        assert_true(all_bytes(p, sizes[i], FILL));
                assert_int_equal(run_child(&h, sizes[i], "read", NULL), 0);
        assert_true(all_bytes(p, sizes[i], REPLY));
        /* Not in the process that made it, as the driver answers. */
        CUdeviceptr q = 0;
        assert_int_equal(cuIpcOpenMemHandle(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                         CUDA_ERROR_INVALID_CONTEXT);
        assert_int_equal(cuIpcOpenMemHandle(&q, h, 2), CUDA_ERROR_INVALID_VALUE);
        fill_bytes(p, sizes[i], FILL);
        assert_int_equal(run_child(&h, sizes[i], "close-fails", NULL), 0);
        /* Each driver call of the importer failing in turn. */
        /* No room for the block's descriptors (the large block has two chunks). */
        if (i == 0)
            assert_int_equal(run_child(&h, sizes[i], "nofile", NULL), 0);
        const char *fail[] = {"fail:cuMemImportFromShareableHandle", "fail:cuMemAddressReserve",
                              "fail:cuMemMap", "fail:cuMemSetAccess"};
        for (size_t k = 0; k < 4; k++)
            assert_int_equal(run_child(&h, sizes[i], fail[k], NULL), 0);
        /* The exporter's export failing: the importer gets its error. */
        fake_fail_nth("cuMemExportToShareableHandle", 1, CUDA_ERROR_OUT_OF_MEMORY);
        assert_int_equal(run_child(&h, sizes[i], "expect:2", NULL), 0);
        fill_bytes(p, sizes[i], FILL);
        assert_int_equal(run_child(&h, sizes[i], "read", NULL), 0);
        assert_true(all_bytes(p, sizes[i], REPLY));
        must_free(p);
    }
}

/* A handle of a block the program freed opens as a stale handle: CUDA_ERROR_INVALID_VALUE,
 * also once a new block took the same address. The exporter's process gone: the same, with a
 * line naming why. */
static void test_ipc_stale_handles(void **state)
{
    (void)state;
    CUdeviceptr p = must_alloc(5 * MiB);
    CUipcMemHandle h = handle_of(p);
    must_free(p);
    assert_int_equal(run_child(&h, 5 * MiB, "expect:1", NULL), 0);
    CUdeviceptr again = must_alloc(5 * MiB);
    assert_int_equal(again, p);  /* the same memory, handed out anew */
    assert_int_equal(run_child(&h, 5 * MiB, "expect:1", NULL), 0);
    CUipcMemHandle h2 = handle_of(again);
    assert_memory_not_equal(&h, &h2, sizeof h);
    fill_bytes(again, 5 * MiB, FILL);
    assert_int_equal(run_child(&h2, 5 * MiB, "read", NULL), 0);
    must_free(again);
    /* A process that is gone: a pid no process has now (a child that exited). */
    pid_t gone = fork();
    if (gone == 0)
        _exit(0);
    assert_int_equal(waitpid(gone, NULL, 0), gone);
    struct shim_wire w;
    memcpy(&w, h2.reserved, sizeof w);
    w.pid = (uint32_t)gone;
    memcpy(h2.reserved, &w, sizeof w);
    assert_int_equal(run_child(&h2, 5 * MiB, "expect:1", NULL), 0);
}

static CUdeviceptr g_held;
static long g_handles_after;

/* While the child has the block open: free it and give idle memory back to the driver. */
static void free_and_give_back(void)
{
    must_free(g_held);
    shim_trim();
    g_handles_after = fake_vmm_allocations();
}

/* Memory another process opened stays that memory until it closes it, even once the exporter
 * freed the block and gave the pool's chunks back to the driver. */
static void test_ipc_importer_keeps_the_memory(void **state)
{
    (void)state;
    g_held = must_alloc(6 * MiB);
    fill_bytes(g_held, 6 * MiB, FILL);
    CUipcMemHandle h = handle_of(g_held);
    long before = fake_vmm_allocations();
    assert_int_equal(run_child(&h, 6 * MiB, "hold", free_and_give_back), 0);
    assert_true(g_handles_after < before);  /* the chunks went back while the child held them */
}

static CUresult g_refused_rc;

static void ask_refused(void *arg)
{
    CUipcMemHandle h;
    g_refused_rc = cuIpcGetMemHandle(&h, *(CUdeviceptr *)arg);
}

/* A driver that will not make chunks exportable (some containers): memory is still made, without
 * the handle type; such a block is not IPC capable and its export fails, with one line naming
 * the setting that avoids it. Last in the group: the context keeps the refusal. */
static void test_ipc_chunks_not_exportable(void **state)
{
    (void)state;
    uint32_t capable = 2;
    fake_fail_nth("cuMemCreate", 1, CUDA_ERROR_NOT_SUPPORTED);
    long creates = fake_calls("cuMemCreate");
    CUdeviceptr p = must_alloc(200 * MiB);  /* a size no free memory holds: new chunks */
    assert_true(fake_calls("cuMemCreate") >= creates + 2);  /* refused, then made without */
    assert_int_equal(cuPointerGetAttribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                           p),
                     CUDA_SUCCESS);
    assert_int_equal(capable, 0);
    char *err = capture_stderr(ask_refused, &p);
    assert_int_equal(g_refused_rc, CUDA_ERROR_NOT_SUPPORTED);
    assert_string_equal(err, "cacheshim: cuIpcGetMemHandle on a pooled block fails (CUresult "
                             "801: the driver would not make its memory exportable): run "
                             "programs that export memory with CACHESHIM_BACKEND=classic\n");
    free(err);
    err = capture_stderr(ask_refused, &p);
    assert_int_equal(g_refused_rc, CUDA_ERROR_NOT_SUPPORTED);
    assert_string_equal(err, "");  /* said once */
    free(err);
    fill_bytes(p, 200 * MiB, FILL);
    assert_true(all_bytes(p, 200 * MiB, FILL));
    must_free(p);
}

/* The child: IPC_WHAT is read (open, see FILL, write REPLY, close), hold (open, see FILL,
 * tell the parent on fd 3, wait for it on fd 4, still see FILL, close), close-fails (the
 * close's wait fails), expect:N (the open fails with CUresult N), nofile (room for one
 * descriptor of the block's two: CUDA_ERROR_OPERATING_SYSTEM) or fail:ENTRY (the importer's
 * call ENTRY fails with out of memory: so does the open). Nothing is left behind by a failed
 * open. Exit 0 when all went as said. */
static int ipc_child(void)
{
    const char *hex = getenv("IPC_HANDLE"), *what = getenv("IPC_WHAT");
    size_t size = (size_t)strtoull(getenv("IPC_SIZE"), NULL, 10);
    CUipcMemHandle h;
    for (size_t i = 0; i < sizeof h.reserved; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        h.reserved[i] = (char)v;
    }
    if (cuInit(0) != CUDA_SUCCESS)
        return 10;
    shim_test_primary();
    CUdeviceptr p = 0;
    if (!strncmp(what, "expect:", 7)) {
        CUresult r = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (r != (CUresult)atoi(what + 7)) {
            fprintf(stderr, "ipc child: open gave %d, expected %s\n", (int)r, what + 7);
            return 11;
        }
        return 0;
    }
    if (!strcmp(what, "nofile")) {
        /* Room for two more descriptors: the socket and one chunk of the two sent. */
        struct rlimit r;
        rlim_t limit = 0;
        for (int free_slots = 0; free_slots < 2; limit++)
            free_slots += fcntl((int)limit, F_GETFD) == -1;
        if (getrlimit(RLIMIT_NOFILE, &r) != 0)
            return 21;
        r.rlim_cur = limit;
        if (setrlimit(RLIMIT_NOFILE, &r) != 0)
            return 21;
        CUresult rc = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (rc != CUDA_ERROR_OPERATING_SYSTEM || fake_vmm_allocations() ||
            fake_vmm_reservations()) {
            fprintf(stderr, "ipc child: nofile: open gave %d\n", (int)rc);
            return 22;
        }
        return 0;
    }
    if (!strncmp(what, "fail:", 5)) {
        fake_fail_nth(what + 5, 1, CUDA_ERROR_OUT_OF_MEMORY);
        CUresult r = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (r != CUDA_ERROR_OUT_OF_MEMORY || fake_vmm_allocations() || fake_vmm_reservations()) {
            fprintf(stderr, "ipc child: %s: open gave %d, %ld handles and %ld ranges left\n",
                    what, (int)r, fake_vmm_allocations(), fake_vmm_reservations());
            return 12;
        }
        return 0;
    }
    CUresult r = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "ipc child: open gave %d\n", (int)r);
        return 13;
    }
    /* The range is the block's, at the offset the block has in its chunk; pointer queries
     * answer for the block; it cannot be exported again. */
    if (!all_bytes(p, size, FILL))
        return 14;
    CUdeviceptr base = 0;
    size_t n = 0;
    uint32_t capable = 2;
    CUipcMemHandle again;
    if (cuMemGetAddressRange(&base, &n, p + size - 1) != CUDA_SUCCESS || base != p ||
        n != size || cuMemGetAddressRange(&base, &n, p + size) != CUDA_ERROR_NOT_FOUND ||
        cuPointerGetAttribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) !=
            CUDA_SUCCESS ||
        capable != 0 || cuIpcGetMemHandle(&again, p) != CUDA_ERROR_INVALID_VALUE) {
        fprintf(stderr, "ipc child: queries: base %#llx size %zu capable %u\n",
                (unsigned long long)base, n, capable);
        return 19;
    }
    /* One block, one buffer id (and memory block id), wherever in it the pointer is, through
     * both entry points: the large block lies in two chunks, each the driver's own mapping. */
    const CUpointer_attribute ids[] = {CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                       CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID};
    for (size_t k = 0; k < 2; k++) {
        unsigned long long first = 0, last = 1, last2 = 2;
        CUpointer_attribute a = ids[k];
        void *data = &last2;
        if (cuPointerGetAttribute(&first, a, p) != CUDA_SUCCESS ||
            cuPointerGetAttribute(&last, a, p + size - 1) != CUDA_SUCCESS ||
            cuPointerGetAttributes(1, &a, &data, p + size - 1) != CUDA_SUCCESS ||
            first != last || first != last2) {
            fprintf(stderr, "ipc child: attribute %d: %#llx at the start, %#llx and %#llx at "
                            "the end\n",
                    (int)a, first, last, last2);
            return 23;
        }
    }
    if (!strcmp(what, "close-fails")) {
        /* The wait before the unmap fails, with no context current: the call says so, the
         * memory goes all the same, and the context it entered is left again. */
        CUcontext cur = (CUcontext)1;
        fake_fail_nth("cuCtxSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED);
        if (cuCtxSetCurrent(NULL) != CUDA_SUCCESS ||
            cuIpcCloseMemHandle(p) != CUDA_ERROR_LAUNCH_FAILED ||
            cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != NULL || fake_vmm_allocations() ||
            fake_vmm_reservations()) {
            fprintf(stderr, "ipc child: close-fails: current %p\n", (void *)cur);
            return 20;
        }
        return 0;
    }
    if (!strcmp(what, "hold")) {
        char c;
        if (write(3, "o", 1) != 1 || read(4, &c, 1) != 1)
            return 15;
        if (!all_bytes(p, size, FILL))
            return 16;
    } else {
        fill_bytes(p, size, REPLY);
    }
    if (cuIpcCloseMemHandle(p) != CUDA_SUCCESS)
        return 17;
    /* Closed: nothing of it is left, and it cannot be closed again. */
    if (fake_vmm_allocations() || fake_vmm_reservations() ||
        cuIpcCloseMemHandle(p) != CUDA_ERROR_INVALID_VALUE)
        return 18;
    return 0;
}

/* ================================================================ peers */

static CUcontext context_of(int ordinal)
{
    CUdevice dev;
    CUcontext ctx;
    assert_int_equal(cuDeviceGet(&dev, ordinal), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    return ctx;
}

/* A kernel in context `in` touching [p, p + n): how many access faults it made. */
static long touch_from(CUcontext in, CUdeviceptr p, size_t n)
{
    CUcontext was;
    assert_int_equal(cuCtxGetCurrent(&was), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(in), CUDA_SUCCESS);
    long before = fake_access_faults();
    launch(NULL, p, n);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    long made = fake_access_faults() - before;
    assert_int_equal(cuCtxSetCurrent(was), CUDA_SUCCESS);
    return made;
}

/* Device 1's kernels reach device 0's blocks only once device 1's context enabled peer access
 * to device 0's: the blocks mapped before, and those mapped after (large and slab slots, on
 * new memory and on memory moved from idle blocks). Pooled memory, like all virtual memory,
 * needs it for copies too (the driver refuses them before); classic memory does not. */
static void test_peer_access(void **state)
{
    (void)state;
    CUcontext c0 = primary, c1 = context_of(1);
    assert_int_equal(cuCtxSetCurrent(c0), CUDA_SUCCESS);
    CUdeviceptr big = must_alloc(3 * MiB), small = must_alloc(5000);
    CUdeviceptr idle = must_alloc(10 * MiB);
    must_free(idle);
    assert_int_equal(cuCtxSetCurrent(c1), CUDA_SUCCESS);
    CUdeviceptr y = must_alloc(3 * MiB);
    CUresult copy = cuMemcpyDtoD(y, big, 3 * MiB);
    assert_int_equal(copy, shim_pooled() ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(c0), CUDA_SUCCESS);

    /* Without peer access, every touch faults. */
    assert_true(touch_from(c1, big, 3 * MiB) > 0);
    assert_true(touch_from(c1, small, 5000) > 0);
    /* Device 0 itself reaches them, and device 1's own block. */
    assert_int_equal(touch_from(c0, big, 3 * MiB), 0);
    assert_int_equal(touch_from(c1, y, 3 * MiB), 0);

    fake_reset_counters();
    assert_int_equal(cuCtxSetCurrent(c1), CUDA_SUCCESS);
    assert_int_equal(paths[DLSYM].peer(c0, 0), CUDA_SUCCESS);
    /* Classic: peer access alone makes the memory reachable; pooled: every mapping is
     * granted device 1 too, a run of mapped spans at a time (here two: big and the idle
     * block end to end in the arena's lower half, small's range at its top). */
    if (shim_pooled())
        assert_int_equal(fake_calls("cuMemSetAccess"), 2);
    else
        assert_int_equal(fake_calls("cuMemSetAccess"), 0);
    assert_int_equal(paths[EXPORT].peer(c0, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    assert_int_equal(cuMemcpyDtoD(y, big, 3 * MiB), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(c0), CUDA_SUCCESS);
    assert_int_equal(touch_from(c1, big, 3 * MiB), 0);
    assert_int_equal(touch_from(c1, small, 5000), 0);

    /* Blocks mapped after the enable: slab slots (eight of five pages each: the granule of
     * `small` holds six, then a new one is mapped), and (pooled) a block carved out of the
     * freed 10 MiB block's memory, whose span joined the free space at its free, and one on
     * new memory, all in the arena reserved before. */
    cacheshim_stats before = shim_stats(0);
    long reservations = fake_vmm_reservations();
    CUdeviceptr slots[8];
    for (int i = 0; i < 8; i++)
        slots[i] = must_alloc(300000);
    CUdeviceptr later = must_alloc(7 * MiB), moved = must_alloc(9 * MiB);
    if (shim_pooled()) {
        assert_int_equal(fake_vmm_reservations(), reservations);
        assert_true(later >= idle && later + 7 * MiB <= idle + 10 * MiB);
        assert_true(shim_stats(0).driver_allocs > before.driver_allocs);
    }
    for (int i = 0; i < 8; i++)
        assert_int_equal(touch_from(c1, slots[i], 300000), 0);
    assert_int_equal(touch_from(c1, later, 7 * MiB), 0);
    assert_int_equal(touch_from(c1, moved, 9 * MiB), 0);
    /* Device 0 still reaches all of it. */
    assert_int_equal(touch_from(c0, moved, 9 * MiB), 0);
    assert_int_equal(fake_access_faults(), 0);
    must_free(big);
    must_free(small);
    must_free(later);
    for (int i = 0; i < 8; i++)
        must_free(slots[i]);
    must_free(moved);
    assert_int_equal(cuCtxSetCurrent(c1), CUDA_SUCCESS);
    must_free(y);
    assert_int_equal(cuCtxSetCurrent(c0), CUDA_SUCCESS);
}

/* Peer access enabled to a context before it allocated anything: its first blocks are
 * reachable too. */
static void test_peer_access_before_any_block(void **state)
{
    (void)state;
    CUdevice d0;
    CUcontext fresh, c1 = context_of(1);
    assert_int_equal(cuDeviceGet(&d0, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxCreate(&fresh, NULL, 0, d0), CUDA_SUCCESS);  /* current now */
    assert_int_equal(cuCtxSetCurrent(c1), CUDA_SUCCESS);
    assert_int_equal(paths[PROCADDR].peer(fresh, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(fresh), CUDA_SUCCESS);
    CUdeviceptr p = must_alloc(5 * MiB), q = must_alloc(1000);
    assert_int_equal(touch_from(c1, p, 5 * MiB), 0);
    assert_int_equal(touch_from(c1, q, 1000), 0);
    must_free(p);
    must_free(q);
    assert_int_equal(cuCtxDestroy(fresh), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
}

/* Granting a peer the pooled memory fails: the peer access the driver enabled stands, the
 * program is told in one line which setting avoids it, and the grant is tried again when the
 * program enables peer access anew (after disabling it). Classic needs no grant. */
static CUcontext grant_owner;
static CUresult grant_result;

static void enable_grant(void *arg)
{
    (void)arg;
    grant_result = paths[EXPORT].peer(grant_owner, 0);
}

static void test_peer_grant_failure(void **state)
{
    (void)state;
    CUdevice d0;
    CUcontext c1 = context_of(1);
    assert_int_equal(cuDeviceGet(&d0, 0), CUDA_SUCCESS);
    assert_int_equal(cuCtxCreate(&grant_owner, NULL, 0, d0), CUDA_SUCCESS);  /* current now */
    CUdeviceptr p = must_alloc(3 * MiB);
    assert_int_equal(cuCtxSetCurrent(c1), CUDA_SUCCESS);
    fake_fail_nth("cuMemSetAccess", 1, CUDA_ERROR_OUT_OF_MEMORY);
    char *err = capture_stderr(enable_grant, NULL);
    fake_fail_nth("cuMemSetAccess", 0, CUDA_SUCCESS);
    assert_int_equal(grant_result, CUDA_SUCCESS);
    if (shim_pooled()) {
        assert_non_null(strstr(err, "cacheshim: peer access: granting device 1 the pooled memory "
                                    "failed (CUresult 2); CACHESHIM_BACKEND=classic avoids it"));
        assert_true(touch_from(c1, p, 3 * MiB) > 0);
    } else {
        assert_string_equal(err, "");
        assert_int_equal(touch_from(c1, p, 3 * MiB), 0);
    }
    free(err);
    assert_int_equal(cuCtxDisablePeerAccess(grant_owner), CUDA_SUCCESS);
    assert_int_equal(paths[EXPORT].peer(grant_owner, 0), CUDA_SUCCESS);
    assert_int_equal(touch_from(c1, p, 3 * MiB), 0);
    assert_int_equal(cuCtxSetCurrent(grant_owner), CUDA_SUCCESS);
    must_free(p);
    assert_int_equal(cuCtxDestroy(grant_owner), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
}

/* ================================================================ moves */

/* The hard case for moving memory: many iterations with no host sync, several streams, the
 * GPU far behind, and a new size at nearly every iteration, so that idle blocks' memory moves
 * to new ones. Each block is written on its stream (a memset of all of it with its own byte,
 * then a tag of its own at its start, middle and end), used by a kernel there, and read back
 * there in four places just before its free, a few iterations later. After the loop: every
 * read-back holds its block's tag or byte, nothing was unmapped under pending work, and no
 * work raced. */
#define MOVE_ITERS 400
#define MOVE_LIVE 5
#define MOVE_STREAMS 4
#define SAMPLE 256
#define SPOTS 4 /* start, middle, end: tagged; a quarter in: the memset's byte */

typedef struct {
    CUstream s[MOVE_STREAMS];
    uint32_t tags[MOVE_ITERS][SAMPLE / 4];
    uint32_t samples[MOVE_ITERS][SPOTS][SAMPLE / 4];
    unsigned seed;
    int iters;
    int max_pending; /* the most units pending on its streams after an iteration */
} move_loop;

static size_t move_size(move_loop *m, int i)
{
    /* A third of the blocks of one size, which ordered reuse hands out again at once (the
     * streams made to wait for its last work); a third of whole granules of 1 to 5 (less a
     * little); a third small. */
    unsigned r = (unsigned)rand_r(&m->seed);
    if (i % 3 == 0)
        return 2 * GRANULE;
    if (i % 3 == 2)
        return 4096 + r % (GRANULE / 2 - 4096);
    return (1 + r % 5) * GRANULE - (r % 3) * 4096;
}

/* Iteration i's tag (unique) and memset byte (differs from its neighbours'). */
static uint32_t tag(int i)
{
    return 0x9e3779b9u * (uint32_t)(i + 1);
}

static uint8_t fill(int i)
{
    return (uint8_t)(0x5b + 37 * i);
}

/* The spots of a block of n bytes (4-byte aligned; the quarter one clear of the others). */
static void spots(size_t n, size_t at[SPOTS])
{
    at[0] = 0;
    at[1] = n / 2 / 4 * 4;
    at[2] = n - SAMPLE;
    at[3] = n / 4 / 4 * 4 + SAMPLE;
}

typedef struct {
    CUdeviceptr p;
    size_t n;
    int i;
} live_block;

/* Read back, on the block's own stream, then free without waiting. */
static void read_and_free(move_loop *m, const live_block *b)
{
    CUstream s = m->s[b->i % MOVE_STREAMS];
    size_t at[SPOTS];
    spots(b->n, at);
    for (int k = 0; k < SPOTS; k++)
        assert_int_equal(cuMemcpyDtoHAsync(m->samples[b->i][k], b->p + at[k], SAMPLE, s),
                         CUDA_SUCCESS);
    must_free(b->p);
}

static void run_move_loop(move_loop *m)
{
    live_block live[MOVE_LIVE];
    memset(live, 0, sizeof live);
    for (int i = 0; i < m->iters; i++) {
        int slot = i % MOVE_LIVE;
        if (live[slot].p)
            read_and_free(m, &live[slot]);
        size_t n = move_size(m, i), at[SPOTS];
        CUstream s = m->s[i % MOVE_STREAMS];
        CUdeviceptr p = must_alloc(n);
        for (int w = 0; w < SAMPLE / 4; w++)
            m->tags[i][w] = tag(i);
        spots(n, at);
        assert_int_equal(cuMemsetD8Async(p, fill(i), n, s), CUDA_SUCCESS);
        for (int k = 0; k < 3; k++)
            assert_int_equal(cuMemcpyHtoDAsync(p + at[k], m->tags[i], SAMPLE, s), CUDA_SUCCESS);
        launch(s, p, n);
        live[slot] = (live_block){p, n, i};
        int pending = 0;
        for (int k = 0; k < MOVE_STREAMS; k++)
            pending += fake_stream_pending(m->s[k]);
        if (pending > m->max_pending)
            m->max_pending = pending;
    }
    for (int slot = 0; slot < MOVE_LIVE; slot++)
        if (live[slot].p)
            read_and_free(m, &live[slot]);
}

static void check_samples(const move_loop *m)
{
    for (int i = 0; i < m->iters; i++)
        for (int k = 0; k < SPOTS; k++)
            for (int w = 0; w < SAMPLE / 4; w++) {
                uint32_t want = k < 3 ? tag(i) : 0x01010101u * fill(i);
                if (m->samples[i][k][w] != want)
                    fail_msg("iteration %d, spot %d, word %d: %#x, expected %#x", i, k, w,
                             m->samples[i][k][w], want);
            }
}

static move_loop *move_loop_new(unsigned seed)
{
    move_loop *m = calloc(1, sizeof *m);
    assert_non_null(m);
    for (int i = 0; i < MOVE_STREAMS; i++)
        assert_int_equal(cuStreamCreate(&m->s[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    m->seed = seed;
    m->iters = MOVE_ITERS;
    return m;
}

static void move_loop_free(move_loop *m)
{
    for (int i = 0; i < MOVE_STREAMS; i++)
        assert_int_equal(cuStreamDestroy(m->s[i]), CUDA_SUCCESS);
    free(m);
}

static void test_moves_while_the_gpu_lags(void **state)
{
    (void)state;
    move_loop *m = move_loop_new(7);
    cacheshim_stats before = shim_stats(-1);  /* the whole process: device 0 may have no heap yet */
    fake_reset_counters();
    fake_set_work_ticks(15);
    run_move_loop(m);
    long unmap_faults = fake_unmap_faults(), races = fake_races();
    cacheshim_stats after = shim_stats(-1);
    fake_set_work_ticks(0);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    check_samples(m);
    assert_int_equal(unmap_faults, 0);
    assert_int_equal(races, 0);
    assert_true(after.hits + after.misses - before.hits - before.misses == MOVE_ITERS);
    /* The case is what it claims: the GPU far behind, blocks handed out again before their
     * work was done (the streams made to wait for it), and, pooled, memory of idle blocks
     * moved to new blocks while other work was pending: ordered, carved out of memory the GPU
     * still works on (no unmap needed: about 300 moves, 250 ordered hits, no unmap); else
     * unmapped and mapped anew once its work is done (about 90 unmaps). */
    assert_true(m->max_pending >= 20);
    if (reuse_ordered())
        assert_true(after.ordered_hits - before.ordered_hits >= 50);
    else
        assert_int_equal(after.ordered_hits - before.ordered_hits, 0);
    if (shim_pooled()) {
        assert_true(after.moves - before.moves >= 50);
        assert_true(reuse_ordered() || fake_calls("cuMemUnmap") >= 50);
    } else {
        assert_int_equal(after.moves - before.moves, 0);
        assert_int_equal(fake_calls("cuMemUnmap"), 0);
    }
    move_loop_free(m);
}

/* The control: with the fake's stream waits turned into no-ops, the same loop races (blocks
 * reused before the GPU is done with them are ordered by waits only), so the check above can
 * fail. Ordered reuse only (the default): completed reuse waits for nothing. */
static void test_moves_control_without_waits(void **state)
{
    (void)state;
    if (!reuse_ordered())
        skip();
    move_loop *m = move_loop_new(7);
    fake_reset_counters();
    fake_set_work_ticks(15);
    fake_set_ignore_stream_waits(1);
    run_move_loop(m);
    long races = fake_races();
    fake_set_ignore_stream_waits(0);
    fake_set_work_ticks(0);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    fake_reset_counters();  /* the races were the point */
    assert_true(races > 0);
    move_loop_free(m);
}

/* Four threads, each with its own streams, all moving memory between their blocks at once. */
static void *move_thread(void *arg)
{
    assert_int_equal(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    run_move_loop(arg);
    return NULL;
}

static void test_moves_from_threads(void **state)
{
    (void)state;
    enum { THREADS = 4 };
    move_loop *m[THREADS];
    pthread_t t[THREADS];
    shim_trim();  /* from an empty cache, as the single thread's loop */
    cacheshim_stats before = shim_stats(-1);
    fake_reset_counters();
    fake_set_work_ticks(15);
    for (int i = 0; i < THREADS; i++) {
        m[i] = move_loop_new(100 + (unsigned)i);
        m[i]->iters = MOVE_ITERS / 2;
        assert_int_equal(pthread_create(&t[i], NULL, move_thread, m[i]), 0);
    }
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    long unmap_faults = fake_unmap_faults(), races = fake_races();
    cacheshim_stats after = shim_stats(-1);
    fake_set_work_ticks(0);
    assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
    for (int i = 0; i < THREADS; i++) {
        check_samples(m[i]);
        move_loop_free(m[i]);
    }
    assert_int_equal(unmap_faults, 0);
    assert_int_equal(races, 0);
    if (shim_pooled())
        assert_true(after.moves - before.moves >= 50);
}

/* ================================================================ near the limit */

/* The device (16 GiB) half full, then all freed: what cuMemGetInfo says is free can be had,
 * less 512 MiB; then 7/8 of the device. The cache's idle memory never stands in the way. */
static void near_limit(const size_t *sizes, int n)
{
    size_t f, t;
    assert_int_equal(cuMemGetInfo(&f, &t), CUDA_SUCCESS);
    assert_int_equal(t, 16 * GiB);
    CUdeviceptr p[64];
    for (int i = 0; i < n; i++)
        p[i] = must_alloc(sizes[i]);
    assert_int_equal(cuMemGetInfo(&f, &t), CUDA_SUCCESS);
    assert_int_equal(f, 8 * GiB);
    for (int i = 0; i < n; i++)
        must_free(p[i]);
    assert_int_equal(cuMemGetInfo(&f, &t), CUDA_SUCCESS);
    assert_int_equal(f, 16 * GiB);  /* idle memory is the program's to have */
    CUdeviceptr big = must_alloc(f - 512 * MiB);
    assert_true(fake_device_used(0) <= 16 * GiB);
    /* Usable at both ends. */
    assert_int_equal(cuMemsetD8(big, 1, 4096), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD8(big + f - 512 * MiB - 4096, 2, 4096), CUDA_SUCCESS);
    must_free(big);
    CUdeviceptr most = must_alloc(16 * GiB / 8 * 7);
    assert_int_equal(cuMemsetD8(most + 16 * GiB / 8 * 7 - 1, 3, 1), CUDA_SUCCESS);
    must_free(most);
    fake_retire_all();
    shim_trim();
    assert_int_equal(fake_device_used(0), 0);
}

static void test_near_limit_one_block(void **state)
{
    (void)state;
    const size_t half[] = {8 * GiB};
    near_limit(half, 1);
}

static void test_near_limit_many_blocks(void **state)
{
    (void)state;
    size_t sizes[64];
    for (int i = 0; i < 64; i++)
        sizes[i] = 128 * MiB;
    near_limit(sizes, 64);
}

/* ================================================================ cap and trim */

static void check_under_cap(void)
{
    uint64_t used = fake_device_used(0);
    if (used > 64 * MiB)
        fail_msg("the device holds %llu bytes, over CACHESHIM_CAP (64 MiB)",
                 (unsigned long long)used);
    cacheshim_stats s = shim_stats(0);
    assert_true(s.bytes_in_use + s.bytes_cached <= 64 * MiB);
    assert_true(s.peak_reserved <= 64 * MiB);
}

/* CACHESHIM_CAP=64MiB: however sizes shift, with work pending on several streams, the device
 * never holds more (the fake counts what it gave); the trim then gives back exactly what the
 * driver gets, and once every block is freed and trimmed no chunk or reservation is left. */
static void test_cap_bounds_what_the_device_holds(void **state)
{
    (void)state;
    CUstream s[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    unsigned seed = 3;
    CUdeviceptr live[3] = {0};
    fake_set_work_ticks(20);
    for (int i = 0; i < 600; i++) {
        int k = i % 3;
        if (live[k]) {
            must_free(live[k]);
            check_under_cap();
        }
        unsigned r = (unsigned)rand_r(&seed);
        /* At most 3 x 20 MiB in use: the program always fits, its cache often does not. */
        size_t n = i % 4 == 3 ? 1000 + r % 500000 : (1 + r % 19) * MiB + r % 4096;
        live[k] = must_alloc(n);
        launch(s[k], live[k], n);
        check_under_cap();
    }
    fake_set_work_ticks(0);
    cacheshim_stats at_cap = shim_stats(0);
    assert_true(at_cap.peak_reserved >= 56 * MiB);  /* the cap was reached */
    assert_int_equal(at_cap.cap_refusals, 0);       /* and never refused what could fit */
    for (int k = 1; k < 3; k++)
        must_free(live[k]);
    fake_retire_all();
    /* One block still held: the trim gives back everything else, and says how much. */
    uint64_t used = fake_device_used(0);
    uint64_t released = shim_trim();
    assert_int_equal(used - fake_device_used(0), released);
    cacheshim_stats st = shim_stats(0);
    /* Pooled: what stays is the free part of the chunks the block in use is carved from
     * (a chunk goes back only when every byte of it is free): less than one granule here. */
    if (shim_pooled())
        assert_true(st.bytes_cached < 2 * MiB);
    else
        assert_int_equal(st.bytes_cached, 0);
    assert_int_equal(fake_device_used(0), st.bytes_in_use + st.bytes_cached);
    if (shim_pooled()) {
        assert_int_equal(fake_vmm_reservations(), 1);
        assert_int_equal(fake_live_allocations(), 0);
    } else {
        assert_int_equal(fake_live_allocations(), 1);
        assert_int_equal(fake_vmm_allocations(), 0);
    }
    must_free(live[0]);
    fake_retire_all();
    released = shim_trim();
    assert_true(released > 0);
    assert_int_equal(fake_device_used(0), 0);
    assert_int_equal(fake_vmm_allocations(), 0);
    assert_int_equal(fake_vmm_reservations(), shim_pooled() ? 1 : 0);  /* the arena stays */
    assert_int_equal(fake_live_allocations(), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(cuStreamDestroy(s[i]), CUDA_SUCCESS);
}

/* ================================================================ groups */

#define T(fn) cmocka_unit_test_teardown(fn, check_clean)

int main(int argc, char **argv)
{
    const char *group = argc > 1 ? argv[1] : "";
    g_prog = argv[0];
    if (!strcmp(group, "ipc-child"))
        return ipc_child();
    const struct CMUnitTest pointers[] = {
        T(test_every_path_gets_the_wrappers), T(test_block_queries),
        T(test_slab_neighbours),              T(test_buffer_id_new_at_every_hand_out),
        T(test_foreign_memory_passes_through), T(test_address_range_v1),
    };
    /* Classic blocks are the driver's to export: the pooled handle's own tests do not apply. */
    const struct CMUnitTest ipc[] = {T(test_ipc),
                                     T(test_ipc_open_elsewhere),
                                     T(test_ipc_stale_handles),
                                     T(test_ipc_importer_keeps_the_memory),
                                     T(test_ipc_chunks_not_exportable)};
    const struct CMUnitTest ipc_classic[] = {T(test_ipc), T(test_ipc_open_elsewhere)};
    const struct CMUnitTest peers[] = {T(test_peer_access), T(test_peer_access_before_any_block),
                                       T(test_peer_grant_failure)};
    const struct CMUnitTest moves[] = {T(test_moves_while_the_gpu_lags),
                                       T(test_moves_control_without_waits),
                                       T(test_moves_from_threads)};
    const struct CMUnitTest near[] = {T(test_near_limit_one_block), T(test_near_limit_many_blocks)};
    const struct CMUnitTest cap[] = {T(test_cap_bounds_what_the_device_holds)};
#define GROUP(name, tests) \
    if (!strcmp(group, name)) \
        return _cmocka_run_group_tests(name, tests, sizeof tests / sizeof tests[0], setup, NULL);
    GROUP("pointers", pointers)
    if (!strcmp(group, "ipc") && !shim_pooled())
        return _cmocka_run_group_tests("ipc", ipc_classic,
                                       sizeof ipc_classic / sizeof ipc_classic[0], setup, NULL);
    GROUP("ipc", ipc)
    GROUP("peers", peers)
    GROUP("moves", moves)
    GROUP("near-limit", near)
    GROUP("pool-cap", cap)
    fprintf(stderr, "test_pointers: unknown group '%s'\n", group);
    return 2;
}
