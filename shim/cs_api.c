/* The public API of cacheshim.h. */
#include <string.h>

#include "cs_debug.h"
#include "cs_host.h"
#include "cs_shim.h"
#include "cs_streams.h"

CS_EXPORT int cacheshim_get_stats(int device, cacheshim_stats *out, size_t size)
{
    cs_shim *s = cs_shim_get();
    cacheshim_stats st;
    if (!out || !s->cache || !cs_cache_stats(s->cache, device, &st))
        return -1;
    if (device < 0)
        st.work_calls = cs_streams_work_calls();
    /* A caller built against an older, shorter struct gets the fields it knows. */
    memcpy(out, &st, size < sizeof st ? size : sizeof st);
    return 0;
}

CS_EXPORT int cacheshim_get_host_stats(cacheshim_stats *out, size_t size)
{
    cs_shim *s = cs_shim_get();
    cacheshim_stats st;
    if (!out || s->disabled || !cs_host_cache() || !cs_cache_stats(cs_host_cache(), 0, &st))
        return -1;
    memcpy(out, &st, size < sizeof st ? size : sizeof st);
    return 0;
}

CS_EXPORT uint64_t cacheshim_trim(void)
{
    cs_shim *s = cs_shim_get();
    uint64_t released = s->cache ? cs_cache_trim(s->cache) : 0;
    if (!s->disabled && cs_host_cache())
        released += cs_cache_trim(cs_host_cache());
    return released;
}

CS_EXPORT int cacheshim_debug_check(void)
{
    cs_shim *s = cs_shim_get();
    if (!s->cache || !(cs_debug_modes() & CS_DEBUG_UAF))
        return -1;
    return cs_quarantine_check(false);
}
