/* pf_ring.h: the index half of the single-producer/single-consumer ring.
 *
 * The ring only hands out slot numbers; the Cython side stores the batches.
 * Threads: exactly one producer calls reserve/publish, one consumer at a time
 * calls acquire/release (the Cython side serialises consumers with the GIL),
 * and any thread may call close. The try_* calls never block; the wait_* calls
 * block for at most timeout_ns, so callers can poll for signals in slices.
 */
#ifndef PF_RING_H
#define PF_RING_H

#include <stdatomic.h>
#include <stdint.h>

#include "pf_sync.h"

enum { PF_PRODUCER = 0, PF_CONSUMER = 1 };

/* Default cap on the spin of a wait before it sleeps: a few fills or drains
 * of a ring of tiny batches, short against any real batch. */
#define PF_RING_SPIN_NS (200 * 1000)

typedef struct pf_ring {
    /* Producer-owned line: head is the count of published slots. */
    PF_ALIGNED _Atomic uint64_t head;
    uint64_t tail_cache; /* producer's last view of tail: saves a shared-line read */
    /* Consumer-owned line: tail is the count of released slots. */
    PF_ALIGNED _Atomic uint64_t tail;
    uint64_t head_cache; /* consumer's last view of head */
    /* Shared, mostly read. */
    PF_ALIGNED uint64_t capacity;
    uint64_t max_bytes;       /* 0: no cap on bytes buffered */
    uint64_t *slot_bytes;     /* bytes of each published slot, for the byte cap */
    _Atomic uint64_t bytes;   /* bytes in published, unreleased slots */
    _Atomic int closed;
    _Atomic int sleepers;     /* threads asleep in a wait_*: wakers lock only if > 0 */
    _Atomic int parked[2];    /* [PF_PRODUCER], [PF_CONSUMER]: that side is inside a wait_* */
    int64_t spin_ns;          /* most a wait_* spins before it sleeps (0: never, e.g. one CPU) */
    int64_t spin_budget[2];   /* per side, adaptive: grows when spins succeed, halves when not */
    pf_sync sync;
} pf_ring;

// spin_ns < 0 picks the default (PF_RING_SPIN_NS, 0 on one CPU).
// Returns 0, PF_EINVAL (capacity 0) or PF_ENOMEM/PF_ESYS. r must be
// PF_CACHELINE-aligned: embed it only where the allocator guarantees that.
int pf_ring_init(pf_ring *r, uint64_t capacity, uint64_t max_bytes, int64_t spin_ns);
void pf_ring_fini(pf_ring *r);
// The same on the heap, aligned (Python objects are only 16-byte aligned).
// Returns the ring, or NULL with *rc set.
pf_ring *pf_ring_new(uint64_t capacity, uint64_t max_bytes, int64_t spin_ns, int *rc);
// pf_ring_fini, then frees it.
void pf_ring_delete(pf_ring *r);

// Producer. Returns 0 and the slot to fill when a slot is free and nbytes fit
// under max_bytes (or the ring is empty); PF_ETIMEDOUT (try: -1 means "not now")
// or PF_ECLOSED otherwise.
int pf_ring_try_reserve(pf_ring *r, uint64_t nbytes, uint64_t *slot);
// Blocks until try_reserve would succeed, the ring closes, or timeout_ns passes.
int pf_ring_wait_reserve(pf_ring *r, uint64_t nbytes, int64_t timeout_ns);
// Makes the reserved slot visible to the consumer.
void pf_ring_publish(pf_ring *r, uint64_t nbytes);

// Consumer. Returns 0 and the oldest published slot, PF_ETIMEDOUT when empty,
// PF_ECLOSED when closed.
int pf_ring_try_acquire(pf_ring *r, uint64_t *slot);
// Blocks until try_acquire would succeed, the ring closes, or timeout_ns passes.
int pf_ring_wait_acquire(pf_ring *r, int64_t timeout_ns);
// Gives the acquired slot back to the producer.
void pf_ring_release(pf_ring *r);

// Slots published and not yet released (any thread; a snapshot).
uint64_t pf_ring_fill(pf_ring *r);
// Wakes every waiter; all later calls return PF_ECLOSED. Idempotent.
void pf_ring_close(pf_ring *r);

#endif
