/* A map from uint64 keys (trace pointers, simulated addresses) to a slot of the replay, shared
 * by the simulated device and the replay loop (replay_sim.c) and the expandable segments model
 * (replay_expandable.c). Open addressing, linear probing, backward-shift deletion: traces
 * reuse pointers all the time, and tombstones would pile up. */
#include "replay.h"

#include <stdlib.h>

static size_t hash(uint64_t k, size_t cap)
{
    return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

bool replay_map_init(replay_map *m, size_t cap)
{
    m->s = calloc(cap, sizeof *m->s);
    m->cap = cap;
    m->count = 0;
    return m->s != NULL;
}

void replay_map_free(replay_map *m)
{
    free(m->s);
    m->s = NULL;
}

replay_slot *replay_map_find(replay_map *m, uint64_t key)
{
    for (size_t i = hash(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->s[i].key == key)
            return &m->s[i];
        if (!m->s[i].key)
            return NULL;
    }
}

bool replay_map_put(replay_map *m, replay_slot v)
{
    if ((m->count + 1) * 2 > m->cap) {
        replay_map old = *m;
        if (!replay_map_init(m, old.cap * 2))
            return *m = old, false;
        for (size_t i = 0; i < old.cap; i++)
            if (old.s[i].key)
                replay_map_put(m, old.s[i]);
        free(old.s);
    }
    size_t i = hash(v.key, m->cap);
    while (m->s[i].key && m->s[i].key != v.key)
        i = (i + 1) & (m->cap - 1);
    if (!m->s[i].key)
        m->count++;
    m->s[i] = v;
    return true;
}

bool replay_map_take(replay_map *m, uint64_t key, replay_slot *out)
{
    replay_slot *p = replay_map_find(m, key);
    if (!p)
        return false;
    *out = *p;
    size_t hole = (size_t)(p - m->s);
    for (size_t i = (hole + 1) & (m->cap - 1); m->s[i].key; i = (i + 1) & (m->cap - 1)) {
        size_t home = hash(m->s[i].key, m->cap);
        /* Move i into the hole unless its home lies cyclically in (hole, i]. */
        bool stays = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
        if (!stays) {
            m->s[hole] = m->s[i];
            hole = i;
        }
    }
    m->s[hole].key = 0;
    m->count--;
    return true;
}
