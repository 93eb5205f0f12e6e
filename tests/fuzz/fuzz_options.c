/* libFuzzer harness: the option parser (shim/cs_options.c). The input is split at '\n' into
 * one value per variable of the table, in table order (a value starting with byte 1 stands
 * for unset); each is read by cs_options_load as the environment, parsed alone by cs_option_parse
 * (as the launcher does), and as a size; the result is printed. */
#include <stdlib.h>
#include <string.h>

#include "cs_options.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

#define MAX_VARS 64
static char *g_value[MAX_VARS];
static const cs_option_desc *g_table;
static size_t g_n;

static const char *fuzz_getenv(const char *name)
{
    for (size_t i = 0; i < g_n; i++)
        if (!strcmp(g_table[i].name, name))
            return g_value[i];
    return NULL;
}

static void drop(const char *line, void *arg)
{
    (void)arg;
    if (strlen(line) > 4096) /* every message is one short line */
        abort();
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    g_table = cs_option_table(&g_n);
    char *copy = malloc(size + 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    copy[size] = '\0';
    char *p = copy;
    for (size_t i = 0; i < g_n && i < MAX_VARS; i++) {
        char *nl = p ? strchr(p, '\n') : NULL;
        if (nl)
            *nl = '\0';
        /* A value starting with '\x01' stands for "unset". */
        g_value[i] = p && p[0] != '\x01' ? p : NULL;
        p = nl ? nl + 1 : NULL;
    }
    cs_options o;
    cs_options_load(&o, fuzz_getenv, drop, NULL);
    cs_options_print(&o, drop, NULL);
    for (size_t i = 0; i < g_n; i++) {
        if (!g_value[i])
            continue;
        cs_options one;
        cs_options_load(&one, NULL, NULL, NULL);
        cs_option_parse(&one, g_table[i].name, g_value[i]);
        cs_size_spec spec;
        if (cs_parse_size(g_value[i], true, &spec) == 0) {
            char buf[64];
            cs_size_format(&spec, buf, sizeof buf);
            cs_size_resolve(&spec, (uint64_t)80 << 30);
        }
        char shown[CS_VALUE_SHOWN_LEN];
        cs_value_show(g_value[i], shown, sizeof shown);
    }
    free(copy);
    return 0;
}
