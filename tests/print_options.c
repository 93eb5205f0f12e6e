/* Prints the options table, one variable a line: NAME, TYPE, DEFAULT and HELP separated by
 * tabs. tests/check_variables_doc.py compares this with the table in docs/variables.md. */
#include <stdio.h>

#include "cs_options.h"

int main(void)
{
    size_t n = 0;
    const cs_option_desc *t = cs_option_table(&n);
    for (size_t i = 0; i < n; i++)
        printf("%s\t%s\t%s\t%s\n", t[i].name, t[i].type, t[i].fallback, t[i].help);
    return ferror(stdout) ? 1 : 0;
}
