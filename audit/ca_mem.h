/* Device bytes per library over time, for the Perfetto counter track: which calls allocate
 * and free, and how many bytes each pointer holds. */
#ifndef CA_MEM_H
#define CA_MEM_H

#include <stdint.h>

#include "ca_rec.h"

/* on: keep the accounting (Perfetto format); off: ca_mem_account always says -1. */
void ca_mem_init(int on);
/* After a successful allocation or free: the library's device bytes now; else -1. */
int64_t ca_mem_account(const ca_rec *r);
/* The child of fork starts with nothing allocated. */
void ca_mem_after_fork(void);

#endif
