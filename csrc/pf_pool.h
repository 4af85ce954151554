/* pf_pool.h: a pool of 64-byte-aligned blocks that batches are copied into.
 *
 * A block goes back to the pool only when pf_pool_put is called for it, which
 * the Cython side does when the last array exported from it is collected; a
 * block a user still holds is never handed out again. Blocks are binned by
 * size class (4 classes per power of two, at most 25% slack), so a steady
 * stream of equal batches reuses the same blocks and allocates nothing.
 * Threads: every call from any thread; one mutex guards the free lists and
 * counters (the loader threads of a Loader get blocks at the same time).
 * The pool frees itself when it is closed and every block has come back.
 */
#ifndef PF_POOL_H
#define PF_POOL_H

#include "pf_sync.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Size classes for every request up to PF_POOL_MAX_BYTES (the last class's
 * capacity must still fit a size_t); pf_pool_get refuses larger ones. */
#define PF_POOL_MAX_BYTES (SIZE_MAX / 2)
#define PF_POOL_NCLASSES 256

typedef struct pf_block {
    struct pf_block *next; /* free-list link, only while in the pool */
    struct pf_pool *pool;
    size_t capacity;       /* usable bytes at data */
    unsigned size_class;
    void *data;            /* PF_CACHELINE-aligned */
} pf_block;

typedef struct pf_pool_stats {
    uint64_t blocks_allocated; /* fresh allocations */
    uint64_t blocks_reused;    /* gets served from the free lists */
    uint64_t blocks_freed;     /* blocks given back to the system */
    uint64_t blocks_out;       /* handed out and not yet put back */
    uint64_t free_bytes;       /* capacity sitting in the free lists */
} pf_pool_stats;

typedef struct pf_pool {
    pf_sync sync;
    pf_block *free[PF_POOL_NCLASSES];
    size_t free_bytes;
    size_t keep_bytes; /* free lists are trimmed to this; a hoard the user drops is not kept */
    _Atomic size_t refs; /* 1 for the owner until close, plus 1 per block out */
    int closed;
    unsigned epoch;      /* pf_fork_epoch() at creation */
    pf_pool_stats stats;
} pf_pool;

// Returns a new pool, or NULL when out of memory.
pf_pool *pf_pool_new(size_t keep_bytes);
// Raises or lowers the free-list cap (any thread).
void pf_pool_set_keep(pf_pool *p, size_t keep_bytes);
// Returns a block with capacity >= nbytes, or NULL when out of memory, closed,
// or nbytes > PF_POOL_MAX_BYTES.
pf_block *pf_pool_get(pf_pool *p, size_t nbytes);
// Gives a block back; frees it instead if the pool is closed or full, or if
// called in a forked child (the parent's lock may be held there).
void pf_pool_put(pf_block *b);
// Frees the free lists, makes later puts free their block, and drops the
// owner's reference. Call once.
void pf_pool_close(pf_pool *p);
// A consistent snapshot of the counters.
pf_pool_stats pf_pool_get_stats(pf_pool *p);
// Process-wide: pools not yet freed, blocks not yet freed (leak checks in tests).
void pf_pool_live(uint64_t *pools, uint64_t *blocks);
// The capacity pf_pool_get(nbytes) hands out, 0 when nbytes > PF_POOL_MAX_BYTES
// (exposed for tests).
size_t pf_pool_class_capacity(size_t nbytes);

#endif
