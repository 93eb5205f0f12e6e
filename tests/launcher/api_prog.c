/* Built by check_install.py against the installed cacheshim.h with the flags of the
 * installed cacheshim.pc, and no link flag for cacheshim: it runs with or without the shim. */
#include <stdio.h>

#include <cacheshim.h>

int main(void)
{
    cacheshim_stats st;
    uint64_t released = 0;
    int stats = cacheshim_get_stats_if_loaded(-1, &st);
    int trim = cacheshim_trim_if_loaded(&released);
    printf("version %s\n", CACHESHIM_VERSION);
    printf("loaded %d\n", cacheshim_loaded());
    printf("stats %s\n", stats == 0 ? "ok" : stats == CACHESHIM_NOT_LOADED ? "not loaded" : "none");
    printf("trim %s %llu\n", trim == 0 ? "ok" : "not loaded", (unsigned long long)released);
    return ferror(stdout) ? 1 : 0;
}
