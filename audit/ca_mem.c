/* Device bytes per library, for the Perfetto "device bytes" counter. Only allocation and
 * free calls take the lock here, and only when the Perfetto format is chosen; every other
 * call returns at the first test. */
#include "ca_mem.h"

#include <pthread.h>
#include <stdlib.h>

#include "cs_options.h"

enum { ROLE_NONE, ROLE_ALLOC, ROLE_PITCH, ROLE_FREE };

/* ALLOC: *arg0 (out) received arg1 bytes; PITCH: *arg0 got *arg1 (pitch) * arg3 (height);
 * FREE: arg0 is given back. cuMemCreate/cuMemRelease count physical memory by handle. */
static const struct {
    const char *name;
    int role;
} roles[] = {
    {"cuMemAlloc", ROLE_ALLOC}, {"cuMemAlloc_v2", ROLE_ALLOC},
    {"cuMemAllocManaged", ROLE_ALLOC}, {"cuMemAllocAsync", ROLE_ALLOC},
    {"cuMemAllocAsync_ptsz", ROLE_ALLOC}, {"cuMemAllocFromPoolAsync", ROLE_ALLOC},
    {"cuMemAllocFromPoolAsync_ptsz", ROLE_ALLOC}, {"cuMemCreate", ROLE_ALLOC},
    {"cuMemAllocPitch", ROLE_PITCH}, {"cuMemAllocPitch_v2", ROLE_PITCH},
    {"cuMemFree", ROLE_FREE}, {"cuMemFree_v2", ROLE_FREE}, {"cuMemFreeAsync", ROLE_FREE},
    {"cuMemFreeAsync_ptsz", ROLE_FREE}, {"cuMemRelease", ROLE_FREE},
};

static unsigned char role_of[CA_FN_COUNT];

#define NBUCKETS 4096
typedef struct node {
    struct node *next;
    uint64_t ptr;
    uint64_t size;
    int lib;
} node;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static node *buckets[NBUCKETS];
static int64_t total[3];

void ca_mem_init(int on)
{
    if (!on)
        return;
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        int fn = ca_lookup_gen(roles[i].name);
        if (fn >= 0)
            role_of[fn] = (unsigned char)roles[i].role;
    }
    role_of[CA_RT_cudaMalloc] = ROLE_ALLOC;
    role_of[CA_RT_cudaMallocAsync] = ROLE_ALLOC;
    role_of[CA_RT_cudaMallocAsync_ptsz] = ROLE_ALLOC;
    role_of[CA_RT_cudaFree] = ROLE_FREE;
    role_of[CA_RT_cudaFreeAsync] = ROLE_FREE;
    role_of[CA_RT_cudaFreeAsync_ptsz] = ROLE_FREE;
}

static int out_value(const ca_rec *r, int k, uint64_t *v)
{
    for (int i = 0; i < r->nout; i++) {
        if (r->out_idx[i] == k) {
            *v = r->out[i];
            return 1;
        }
    }
    return 0;
}

static unsigned bucket(uint64_t p, int lib) { return (unsigned)(((p >> 9) ^ (uint64_t)lib * 0x9e37u) % NBUCKETS); }

int64_t ca_mem_account(const ca_rec *r)
{
    int role = role_of[r->fn];
    if (role == ROLE_NONE || r->result != 0)
        return -1;
    uint64_t ptr = 0, size = 0, pitch = 0;
    if (role == ROLE_FREE) {
        ptr = r->arg[0];
    } else {
        if (!out_value(r, 0, &ptr))
            return -1;
        if (role == ROLE_PITCH)
            size = out_value(r, 1, &pitch) ? pitch * r->arg[3] : 0;
        else
            size = r->arg[1];
    }
    int lib = r->lib;
    int64_t now;
    pthread_mutex_lock(&lock);
    node **pp = &buckets[bucket(ptr, lib)];
    if (role == ROLE_FREE) {
        while (*pp && ((*pp)->ptr != ptr || (*pp)->lib != lib))
            pp = &(*pp)->next;
        if (*pp) {
            node *n = *pp;
            *pp = n->next;
            total[lib] -= (int64_t)n->size;
            free(n);
        }
    } else {
        node *n = malloc(sizeof *n);
        if (n) {
            n->ptr = ptr;
            n->size = size;
            n->lib = lib;
            n->next = *pp;
            *pp = n;
            total[lib] += (int64_t)size;
        }
    }
    now = total[lib];
    pthread_mutex_unlock(&lock);
    return now;
}

void ca_mem_after_fork(void)
{
    pthread_mutex_init(&lock, NULL);
    for (int i = 0; i < NBUCKETS; i++) {
        while (buckets[i]) {
            node *n = buckets[i];
            buckets[i] = n->next;
            free(n);
        }
    }
    total[0] = total[1] = total[2] = 0;
}
