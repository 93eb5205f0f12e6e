/* One record as text (layer 3, under ca_trace.c; see ca_desc.h). */
#ifndef CA_FORMAT_H
#define CA_FORMAT_H

#include "ca_rec.h"

typedef struct {
    int format;        /* CS_TRACE_TEXT, _JSONL, _PERFETTO */
    int pid;
    uint64_t t_origin; /* ns: times are printed relative to it */
} ca_fmt_ctx;

/* What a thread's records share, kept by the thread: its pid and tid as the format writes
 * them (zero-initialised; made at the first record and again when pid or tid change). */
typedef struct {
    int pid;
    long tid;
    uint8_t len;
    char text[80];
} ca_fmt_ids;

/* One record as text into buf (cap: CA_REC_TEXT_MAX); returns the length, 0 when it cannot
 * be formatted (no memory for the function's plan). Text and JSON Lines end in '\n'; a
 * Chrome-trace event has no separator. */
size_t ca_format_rec(const ca_fmt_ctx *c, const ca_rec *r, long tid, ca_fmt_ids *ids, char *buf,
                     size_t cap);
/* r as the trace file holds it, into buf (cap: CA_REC_TEXT_MAX + 256): the record; in a
 * Chrome trace followed by ",\n" and then, after an allocation or free, its counter event
 * and ",\n". 0 when it cannot be formatted. */
size_t ca_format_entry(const ca_fmt_ctx *c, const ca_rec *r, long tid, ca_fmt_ids *ids, char *buf);
/* A Chrome trace's start: the array form of the Trace Event Format, whose closing "]"
 * Perfetto's reader does without, so that the file of a killed process opens as it is (the
 * object form, {"traceEvents":[...]}, it refuses unclosed). Its end after the text so far,
 * whose last two bytes are last (NULL when there are fewer): "\n]\n" in place of the last
 * event's ",\n" (*back = 2), or "]\n" (*back = 0); with dict, the end of a file of the object
 * form (CA_PERFETTO_HEAD_DICT, what earlier builds wrote), "]}" instead of "]". */
#define CA_PERFETTO_HEAD "[\n"
#define CA_PERFETTO_HEAD_DICT "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"
const char *ca_format_array_end(const char *last, int dict, size_t *back);
/* The note of calls not written (a write error), in format, into buf: JSON Lines:
 * {"cacheshim_lost":N,"error":"..."}; text: "[cacheshim] N calls not written: ..."; Chrome
 * trace: an instant event "cacheshim: calls not written" with args lost and error, and
 * ",\n". N right-aligned in 20 characters (blank when lost is NULL), at *count. 0 when it
 * does not fit. */
size_t ca_format_note(int format, const uint64_t *lost, const char *error, char *buf, size_t cap,
                      size_t *count);
/* Can fn's records be formatted without allocating (its plan made now if need be)? So that
 * a process that dies of a signal can format what is left without calling malloc. */
int ca_format_ready(unsigned fn);
/* Perfetto: the counter event after r. */
size_t ca_format_counter(const ca_fmt_ctx *c, const ca_rec *r, char *buf, size_t cap);
/* Longest text of one record. */
#define CA_REC_TEXT_MAX 8192

#endif
