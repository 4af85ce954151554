/* pf_pool.c: bodies for pf_pool.h. */
#include "pf_pool.h"

#include <stdlib.h>
#include <string.h>

/* The header sits in the first cache line; data starts on the next one. */
#define HEADER_BYTES PF_CACHELINE
_Static_assert(sizeof(pf_block) <= HEADER_BYTES && HEADER_BYTES % PF_CACHELINE == 0,
               "a block's header fits the cache line before its data");
/* The largest class: 2^e < PF_POOL_MAX_BYTES <= 2^(e+1) with e = bits - 2, sub 4. */
_Static_assert((sizeof(size_t) * 8 - 2 - 6) * 4 + 4 < PF_POOL_NCLASSES, "a class for every size");
/* The largest class capacity, 2^(bits-1), plus the header fits a size_t. */
_Static_assert(PF_POOL_MAX_BYTES + 1 <= SIZE_MAX - HEADER_BYTES, "header + capacity cannot overflow");

/* Process-wide leak counters; relaxed: only read when the threads are quiet. */
static atomic_uint_fast64_t live_pools, live_blocks;

void pf_pool_live(uint64_t *pools, uint64_t *blocks) {
    *pools = atomic_load_explicit(&live_pools, memory_order_relaxed);
    *blocks = atomic_load_explicit(&live_blocks, memory_order_relaxed);
}

/* Size classes: class 0 is 64 bytes; above that each power-of-two range
 * (2^e, 2^(e+1)] is cut into 4 equal steps. PF_POOL_NCLASSES (capacity 0)
 * for a size above PF_POOL_MAX_BYTES, whose class capacity would overflow. */
static unsigned size_class(size_t n, size_t *capacity) {
    if (n > PF_POOL_MAX_BYTES) {
        *capacity = 0;
        return PF_POOL_NCLASSES;
    }
    if (n <= PF_CACHELINE) {
        *capacity = PF_CACHELINE;
        return 0;
    }
    unsigned e = 63u - (unsigned)__builtin_clzll((unsigned long long)(n - 1)); /* 2^e < n <= 2^(e+1) */
    size_t base = (size_t)1 << e, step = base / 4;
    size_t sub = (n - base + step - 1) / step; /* 1..4 */
    *capacity = base + sub * step;
    unsigned cls = (e - 6) * 4 + (unsigned)sub;
    PF_ASSERT(cls < PF_POOL_NCLASSES && *capacity >= n);
    return cls;
}

size_t pf_pool_class_capacity(size_t nbytes) {
    size_t cap;
    size_class(nbytes, &cap);
    return cap;
}

pf_pool *pf_pool_new(size_t keep_bytes) {
    pf_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    if (pf_sync_init(&p->sync) != PF_OK) {
        free(p);
        return NULL;
    }
    p->keep_bytes = keep_bytes;
    atomic_init(&p->refs, 1);
    atomic_fetch_add_explicit(&live_pools, 1, memory_order_relaxed);
    p->epoch = pf_fork_epoch();
    return p;
}

static void block_free(pf_block *b) {
    atomic_fetch_sub_explicit(&live_blocks, 1, memory_order_relaxed);
    free(b);
}

static void pool_unref(pf_pool *p) {
    /* acq_rel: every put's writes happen before the last one frees the pool. */
    size_t refs = atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel);
    PF_ASSERT(refs > 0);
    if (refs == 1) {
        pf_sync_fini(&p->sync);
        free(p);
        atomic_fetch_sub_explicit(&live_pools, 1, memory_order_relaxed);
    }
}

void pf_pool_set_keep(pf_pool *p, size_t keep_bytes) {
    pf_sync_lock(&p->sync);
    p->keep_bytes = keep_bytes;
    pf_sync_unlock(&p->sync);
}

pf_block *pf_pool_get(pf_pool *p, size_t nbytes) {
    size_t cap;
    unsigned cls = size_class(nbytes, &cap);
    if (cls >= PF_POOL_NCLASSES) return NULL;
    pf_sync_lock(&p->sync);
    if (p->closed) {
        pf_sync_unlock(&p->sync);
        return NULL;
    }
    /* Last in, first out: the block released most recently (typically the
     * batch the consumer just dropped) is the likeliest to be in cache. */
    pf_block *b = p->free[cls];
    if (b) {
        PF_ASSERT(b->pool == p && b->size_class == cls && p->free_bytes >= b->capacity);
        p->free[cls] = b->next;
        p->free_bytes -= b->capacity;
        p->stats.blocks_reused++;
        p->stats.blocks_out++;
    }
    pf_sync_unlock(&p->sync);
    if (!b) {
        /* Allocate outside the lock: a large malloc may fault in pages. */
        void *mem = NULL;
        if (posix_memalign(&mem, PF_CACHELINE, HEADER_BYTES + cap) != 0) return NULL;
        atomic_fetch_add_explicit(&live_blocks, 1, memory_order_relaxed);
        b = mem;
        b->pool = p;
        b->capacity = cap;
        b->size_class = cls;
        b->data = (char *)mem + HEADER_BYTES;
        pf_sync_lock(&p->sync);
        p->stats.blocks_allocated++;
        p->stats.blocks_out++;
        pf_sync_unlock(&p->sync);
    }
    b->next = NULL;
    atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
    return b;
}

void pf_pool_put(pf_block *b) {
    pf_pool *p = b->pool;
    if (p->epoch != pf_fork_epoch()) {
        /* Forked child: the parent's threads may have held the lock at fork.
         * Free the memory and never touch the pool again. */
        block_free(b);
        return;
    }
    int keep;
    pf_sync_lock(&p->sync);
    PF_ASSERT(p->stats.blocks_out > 0 && b->size_class < PF_POOL_NCLASSES); /* no double put */
    p->stats.blocks_out--;
    keep = !p->closed && p->free_bytes + b->capacity <= p->keep_bytes;
    if (keep) {
        b->next = p->free[b->size_class];
        p->free[b->size_class] = b;
        p->free_bytes += b->capacity;
    } else {
        p->stats.blocks_freed++;
    }
    pf_sync_unlock(&p->sync);
    if (!keep) block_free(b);
    pool_unref(p);
}

void pf_pool_close(pf_pool *p) {
    pf_block *lists[PF_POOL_NCLASSES];
    pf_sync_lock(&p->sync);
    PF_ASSERT(!p->closed); /* call once */
    p->closed = 1;
    memcpy(lists, p->free, sizeof lists);
    memset(p->free, 0, sizeof p->free);
    p->free_bytes = 0;
    pf_sync_unlock(&p->sync);
    uint64_t freed = 0;
    for (unsigned i = 0; i < PF_POOL_NCLASSES; i++) {
        while (lists[i]) {
            pf_block *b = lists[i];
            lists[i] = b->next;
            block_free(b);
            freed++;
        }
    }
    pf_sync_lock(&p->sync);
    p->stats.blocks_freed += freed;
    pf_sync_unlock(&p->sync);
    pool_unref(p);
}

pf_pool_stats pf_pool_get_stats(pf_pool *p) {
    pf_pool_stats s;
    pf_sync_lock(&p->sync);
    s = p->stats;
    s.free_bytes = p->free_bytes;
    pf_sync_unlock(&p->sync);
    return s;
}
