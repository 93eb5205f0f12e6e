/* Between test_work_wrappers.c and the generated cs_work_wrappers_test.c (from
 * scripts/gen-work-wrappers): the generated part calls every wrapper, the hand-written part
 * stands in for the shim (cs_work_begin, cs_work_end) and checks what happened. */
#ifndef WORK_WRAPPERS_TEST_H
#define WORK_WRAPPERS_TEST_H

#include <cuda.h>
#include <stddef.h>

/* The wrapper under test: its index, exported name, address by that name and stub real
 * function (put into cs_work_real[index]). */
void wt_entry(int index, const char *name, void *by_name, void *stub);
/* Argument k: fill it with its own byte pattern, or take the value it was given. */
void wt_fill(int k, void *p, size_t n);
void wt_remember(int k, const void *p, size_t n);
/* A recognisable pattern for a value the test sets itself (a stream inside a structure). */
void wt_pattern(void *p, size_t n, int seed);
/* In the stub: argument k as the real function got it. */
void wt_arg(int k, const void *p, size_t n);
/* In the stub: the real function ran; returns the result it must return. */
CUresult wt_real_called(void);
/* One call: the streams cs_work_begin must get, in order, with per_thread; pass 0..3 (bit 0:
 * through cs_work_table, bit 1: the real function fails), or -1: no real function at all. */
void wt_start(const CUstream *streams, int n, int per_thread, int pass);
/* The wrapper returned `r`: check the call. */
void wt_finish(CUresult r);

/* Generated: calls every wrapper; the names that must be among them. */
void wt_call_all(void);
extern const char *const wt_must_have[];

#endif
