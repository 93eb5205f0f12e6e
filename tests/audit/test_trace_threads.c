/* The per-thread buffers under contention, in one process (so ThreadSanitizer sees the
 * tracer's own code): THREADS threads record CALLS calls each, several buffers' worth, while
 * the main thread flushes everyone's buffers in a loop, as exit() or fork() from another
 * thread would. Every call must be written exactly once. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ca_internal.h"
#include "cs_options.h"

#define THREADS 8
#define CALLS 3000

static int done;

static void *worker(void *arg)
{
    (void)arg;
    for (int i = 0; i < CALLS; i++) {
        ca_rec *r = ca_begin(CA_FN_cuMemAlloc_v2, CA_LIB_DRIVER, NULL);
        if (!r)
            abort();
        r->arg[0] = 0x1000;
        r->arg[1] = (uint64_t)i;
        ca_started(r);
        ca_stopped(r);
        ca_set_out(r, 0, 0x7000 + (uint64_t)i);
        ca_end(r, 0);
    }
    __atomic_fetch_add(&done, 1, __ATOMIC_RELEASE);
    return NULL;
}

int main(void)
{
    FILE *f = tmpfile();
    if (!f)
        return 1;
    ca_trace_init_fd(dup(fileno(f)), CS_TRACE_JSONL, "memory");
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, NULL);
    while (__atomic_load_n(&done, __ATOMIC_ACQUIRE) < THREADS)
        ca_flush_all(0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    ca_flush_all(1);
    rewind(f);
    char line[CA_REC_TEXT_MAX + 2];
    long lines = 0;
    long sum = 0;
    while (fgets(line, sizeof line, f)) {
        lines++;
        const char *b = strstr(line, "\"bytesize\":");
        if (b)
            sum += atol(b + 11);
    }
    long want_sum = (long)THREADS * CALLS * (CALLS - 1) / 2;
    printf("%ld lines (expected %d), size sum %ld (expected %ld)\n", lines, THREADS * CALLS, sum,
           want_sum);
    return lines == THREADS * CALLS && sum == want_sum ? 0 : 1;
}
