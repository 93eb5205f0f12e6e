/* Without libFuzzer (gcc builds, meson test): runs the harness once on each file named on
 * the command line, or each file of each directory named: the seed corpus and the inputs
 * that once crashed (tests/fuzz/regressions), so every build checks them again. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    unsigned char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 65536;
            unsigned char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                fclose(f);
                return 1;
            }
            buf = p;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        if (!got)
            break;
        n += got;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = 0, files = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            DIR *d = opendir(argv[i]);
            struct dirent *e;
            while (d && (e = readdir(d))) {
                if (e->d_name[0] == '.')
                    continue;
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
                rc |= run_file(path);
                files++;
            }
            if (d)
                closedir(d);
        } else {
            rc |= run_file(argv[i]);
            files++;
        }
    }
    printf("%d inputs run\n", files);
    return rc || files == 0;
}
