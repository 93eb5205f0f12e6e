/* libFuzzer harness: the reader of what a killed traced program left, TRACE.pending
 * (audit/ca_recover.c over ca_ring.c's ca_ring_read and ca_format.c), as `cacheshim finish`,
 * report and replay run it. The input is the pending file: its header page (the first
 * bytes, the rest of the page zero) and its ring; this build makes the ring small
 * (CA_RING_SIZE=4096, so its sizes are 4096, 512 and 64 bytes). The trace beside it holds
 * a few lines of text. Files in a directory of its own, made once. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ca_recover.h"
#include "ca_ring.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static void put_file(const char *path, const void *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || (n && write(fd, p, n) != (ssize_t)n))
        abort();
    close(fd);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    static char dir[] = "/tmp/fuzz-pending-XXXXXX", trace[64], pending[80];
    static unsigned char file[CA_RING_HEAD_SIZE + CA_RING_SIZE];
    if (!trace[0]) {
        if (!mkdtemp(dir))
            abort();
        snprintf(trace, sizeof trace, "%s/t", dir);
        snprintf(pending, sizeof pending, "%s" CA_RING_SUFFIX, trace);
    }
    size_t head = size < sizeof(ca_ring_head) ? size : sizeof(ca_ring_head);
    size_t ring = size - head < CA_RING_SIZE ? size - head : CA_RING_SIZE;
    memset(file, 0, sizeof file);
    memcpy(file, data, head);
    memcpy(file + CA_RING_HEAD_SIZE, data + head, ring);
    static const char text[] = "{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n";
    put_file(trace, text, sizeof text - 1);
    put_file(pending, file, sizeof file);
    char msg[9000];
    ca_recover(trace, msg, sizeof msg);
    unlink(pending);
    return 0;
}
