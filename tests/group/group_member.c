/* A member of a group for tests of `cacheshim status` (tests/group/check_status.py):
 * group_member DIR NAME BYTES joins group NAME in DIR, holds BYTES on one device (cap 1 GiB),
 * says "ready" and stays until its standard input closes (or it is killed). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cs_group.h"

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    static const uint8_t uuid[16] = {0x3f, 0x2a, 0x11, 0x00, 0xde, 0xad, 0xbe, 0xef,
                                     0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08};
    cs_group_status st;
    cs_group *g = cs_group_open(argv[1], argv[2], (unsigned)getuid(), &st);
    if (!g) {
        char why[160];
        cs_group_explain(&st, why, sizeof why);
        fprintf(stderr, "group_member: %s: %s\n", st.path, why);
        return 1;
    }
    cs_group_device(g, 0, uuid, 1ull << 30);
    if (!cs_group_charge(g, 0, strtoull(argv[3], NULL, 10), 1ull << 30, NULL))
        return 3;
    printf("ready\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    cs_group_close(g);
    return 0;
}
