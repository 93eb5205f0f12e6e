/* cacheshim status: the groups of this user (CACHESHIM_GROUP), their members and the bytes
 * each holds on each device, read from the segments without joining or changing them. See
 * docs/cli.md. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cs_group.h"
#include "cs_options.h"
#include "launch.h"

/* One device of a group: its members' rows, gathered before printing. */
typedef struct {
    uint8_t uuid[16];
    uint64_t bytes, cap;
    int members;
} device_sum;

typedef struct {
    device_sum dev[CS_GROUP_DEVICES];
    int ndev;
    cs_group_member_info *members;
    int nmembers, cap_members;
} group_view;

static void uuid_text(const uint8_t u[16], char *buf, size_t len)
{
    snprintf(buf, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
}

static void gather(const cs_group_member_info *m, void *arg)
{
    group_view *v = arg;
    if (v->nmembers == v->cap_members) {
        int cap = v->cap_members ? 2 * v->cap_members : 8;
        cs_group_member_info *a = realloc(v->members, (size_t)cap * sizeof *a);
        if (!a)
            return;
        v->members = a;
        v->cap_members = cap;
    }
    v->members[v->nmembers++] = *m;
    for (int i = 0; i < m->ndevices; i++) {
        int k = 0;
        while (k < v->ndev && memcmp(v->dev[k].uuid, m->dev[i].uuid, 16) != 0)
            k++;
        if (k == v->ndev) {
            if (v->ndev == CS_GROUP_DEVICES)
                continue;
            memset(&v->dev[k], 0, sizeof v->dev[k]);
            memcpy(v->dev[k].uuid, m->dev[i].uuid, 16);
            v->dev[k].cap = m->dev[i].cap;
            v->ndev++;
        }
        v->dev[k].bytes += m->dev[i].bytes;
        v->dev[k].members++;
        if (m->alive && m->dev[i].cap < v->dev[k].cap)
            v->dev[k].cap = m->dev[i].cap;  /* the smallest cap of the living */
    }
}

static void size_text(uint64_t bytes, char *buf, size_t len)
{
    if (bytes == CS_GROUP_UNLIMITED)
        snprintf(buf, len, "none");
    else
        cs_bytes_format(bytes, buf, len);
}

static void print_group(const char *name, const char *path, const group_view *v)
{
    printf("group %s (%s): %d member%s\n", name, path, v->nmembers, v->nmembers == 1 ? "" : "s");
    for (int k = 0; k < v->ndev; k++) {
        char uuid[64], held[32], cap[32];
        uuid_text(v->dev[k].uuid, uuid, sizeof uuid);
        size_text(v->dev[k].bytes, held, sizeof held);
        size_text(v->dev[k].cap, cap, sizeof cap);
        printf("  device %s: %s held, cap %s\n", uuid, held, cap);
        for (int i = 0; i < v->nmembers; i++) {
            const cs_group_member_info *m = &v->members[i];
            for (int d = 0; d < m->ndevices; d++) {
                if (memcmp(m->dev[d].uuid, v->dev[k].uuid, 16) != 0)
                    continue;
                char bytes[32];
                size_text(m->dev[d].bytes, bytes, sizeof bytes);
                printf("    pid %-8d %-16s %s%s\n", m->pid, m->comm, bytes,
                       m->alive ? "" : " (dead: freed at the next allocation that needs it)");
            }
        }
    }
    for (int i = 0; i < v->nmembers; i++)
        if (v->members[i].ndevices == 0)
            printf("  pid %-8d %-16s no device yet%s\n", v->members[i].pid, v->members[i].comm,
                   v->members[i].alive ? "" : " (dead)");
}

/* One group: 0, or 1 after a line saying why its segment was refused. */
static int show(const char *dir, const char *name, unsigned uid)
{
    group_view v;
    memset(&v, 0, sizeof v);
    cs_group_status st;
    if (cs_group_read(dir, name, uid, gather, &v, &st) != CS_GROUP_OK) {
        char why[160];
        cs_group_explain(&st, why, sizeof why);
        printf("group %s (%s): %s\n", name, st.path, why);
        free(v.members);
        return 1;
    }
    print_group(name, st.path, &v);
    free(v.members);
    return 0;
}

static void usage(FILE *f)
{
    fputs("usage: " LAUNCH_NAME " status [--dir DIR] [GROUP...]\n"
          "\n"
          "Lists the groups of this user (CACHESHIM_GROUP), or the ones named: each device's\n"
          "bytes held and cap, and each member's bytes. Members that died are shown until\n"
          "another member needs their room. --dir: where the segments are (default " CS_GROUP_DIR
          ").\n"
          "Exit status: 0; 1 when a segment was refused or a named group does not exist.\n",
          f);
}

int status_main(int argc, char **argv)
{
    const char *dir = CS_GROUP_DIR;
    int first = 1;
    for (; first < argc && argv[first][0] == '-'; first++) {
        if (strcmp(argv[first], "--help") == 0 || strcmp(argv[first], "-h") == 0) {
            usage(stdout);
            return launch_flush_stdout(0);
        }
        if (strcmp(argv[first], "--dir") == 0 && first + 1 < argc) {
            dir = argv[++first];
            continue;
        }
        char shown[CS_VALUE_SHOWN_LEN];
        cs_value_show(argv[first], shown, sizeof shown);
        fprintf(stderr, LAUNCH_NAME " status: unknown option '%s' (try: " LAUNCH_NAME
                        " status --help)\n", shown);
        return LAUNCH_USAGE;
    }
    unsigned uid = (unsigned)getuid();
    int rc = 0;
    if (first < argc) {
        for (int i = first; i < argc; i++)
            rc |= show(dir, argv[i], uid);
        return launch_flush_stdout(rc);
    }
    char prefix[64];
    snprintf(prefix, sizeof prefix, CS_GROUP_PREFIX "%u-", uid);
    struct dirent **list = NULL;
    int n = scandir(dir, &list, NULL, alphasort);
    if (n < 0) {
        fprintf(stderr, LAUNCH_NAME " status: cannot read %s\n", dir);
        return 1;
    }
    int groups = 0;
    for (int i = 0; i < n; i++) {
        const char *name = list[i]->d_name;
        if (strncmp(name, prefix, strlen(prefix)) == 0 && cs_group_name_ok(name + strlen(prefix))) {
            rc |= show(dir, name + strlen(prefix), uid);
            groups++;
        }
        free(list[i]);
    }
    free(list);
    if (!groups)
        printf("no groups of uid %u in %s\n", uid, dir);
    return launch_flush_stdout(rc);
}
