/* The descriptors of cudart's memory entry points and of the shim's scope functions (the
 * generated ones are in ca_desc_gen.c),
 * and lookups by index and by name. The runtime types are spelled as their ABI
 * (cudaError_t is an int-sized enum, cudaStream_t a pointer). */
#include "ca_desc.h"

#include <stdlib.h>
#include <string.h>

#define PTR(n) {n, CA_K_PTR, sizeof(void *), 0, 0, 0, 0}
#define OUTPTR(n) {n, CA_K_PTR, sizeof(void *), 0, 1, CA_K_PTR, sizeof(void *)} /* void ** */
#define SIZE(n) {n, CA_K_INT, sizeof(size_t), 0, 0, 0, 0}
#define OUTSIZE(n) {n, CA_K_PTR, sizeof(void *), 0, 0, CA_K_INT, sizeof(size_t)} /* size_t * */

static const ca_param p_malloc[] = {OUTPTR("devPtr"), SIZE("size")};
static const ca_param p_free[] = {PTR("devPtr")};
static const ca_param p_malloc_async[] = {OUTPTR("devPtr"), SIZE("size"), PTR("hStream")};
static const ca_param p_free_async[] = {PTR("devPtr"), PTR("hStream")};
static const ca_param p_malloc_host[] = {OUTPTR("ptr"), SIZE("size")};
static const ca_param p_free_host[] = {PTR("ptr")};
static const ca_param p_mem_get_info[] = {OUTSIZE("free"), OUTSIZE("total")};
static const ca_param p_scope_begin[] = {{"name", CA_K_STR, sizeof(void *), 0, 0, 0, 0},
                                         {"flags", CA_K_INT, sizeof(unsigned), 0, 0, 0, 0}};
static const ca_param p_scope_end[] = {PTR("out"), SIZE("size")};

static const ca_fn_desc rt_desc[CA_FN_COUNT - CA_RT_FIRST] = {
    [CA_RT_cudaMalloc - CA_RT_FIRST] = {"cudaMalloc", 2, p_malloc},
    [CA_RT_cudaFree - CA_RT_FIRST] = {"cudaFree", 1, p_free},
    [CA_RT_cudaMallocAsync - CA_RT_FIRST] = {"cudaMallocAsync", 3, p_malloc_async},
    [CA_RT_cudaMallocAsync_ptsz - CA_RT_FIRST] = {"cudaMallocAsync_ptsz", 3, p_malloc_async},
    [CA_RT_cudaFreeAsync - CA_RT_FIRST] = {"cudaFreeAsync", 2, p_free_async},
    [CA_RT_cudaFreeAsync_ptsz - CA_RT_FIRST] = {"cudaFreeAsync_ptsz", 2, p_free_async},
    [CA_RT_cudaMallocHost - CA_RT_FIRST] = {"cudaMallocHost", 2, p_malloc_host},
    [CA_RT_cudaFreeHost - CA_RT_FIRST] = {"cudaFreeHost", 1, p_free_host},
    [CA_RT_cudaMemGetInfo - CA_RT_FIRST] = {"cudaMemGetInfo", 2, p_mem_get_info},
    [CA_SCOPE_begin - CA_RT_FIRST] = {"cacheshim_scope_begin", 2, p_scope_begin},
    [CA_SCOPE_end - CA_RT_FIRST] = {"cacheshim_scope_end", 2, p_scope_end},
};

const ca_fn_desc *ca_desc(unsigned fn)
{
    return fn < CA_GEN_COUNT ? &ca_gen_desc[fn] : &rt_desc[fn - CA_RT_FIRST];
}

static int cmp_name(const void *key, const void *elem)
{
    return strcmp(key, ((const ca_fn_desc *)elem)->name);
}

int ca_lookup_gen(const char *name)
{
    const ca_fn_desc *d =
        bsearch(name, ca_gen_desc, CA_GEN_COUNT, sizeof ca_gen_desc[0], cmp_name);
    return d ? (int)(d - ca_gen_desc) : -1;
}

static int lookup_hand(const char *name, int first, int end)
{
    for (int fn = first; fn < end; fn++)
        if (strcmp(name, rt_desc[fn - CA_RT_FIRST].name) == 0)
            return fn;
    return -1;
}

int ca_lookup_runtime(const char *name) { return lookup_hand(name, CA_RT_FIRST, CA_SCOPE_FIRST); }

int ca_lookup_scope(const char *name) { return lookup_hand(name, CA_SCOPE_FIRST, CA_FN_COUNT); }
