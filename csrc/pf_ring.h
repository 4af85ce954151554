/* pf_ring.h: the index half of the single-producer/single-consumer ring.
 *
 * The ring only hands out slot numbers; the Cython side stores the batches.
 * Threads: one producer calls reserve/publish, one consumer calls
 * acquire/release, and any thread may call close and fill. "One" means one
 * thread at a time per side, from the start of a reserve (acquire) to the
 * publish (release) that follows it, both made by that thread: the slot is
 * handed out without an atomic read-modify-write, so two acquires in flight
 * would get the same slot. A second reserve (acquire) before the publish
 * (release) returns the same slot (e.g. to wait again with a larger nbytes).
 * A PF_DEBUG build asserts all of this.
 *
 * reserve and acquire wait for at most timeout_ns, so callers can poll for
 * signals in slices; timeout_ns == 0 never blocks (nor spins).
 */
#ifndef PF_RING_H
#define PF_RING_H

#include "pf_sync.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum { PF_PRODUCER = 0, PF_CONSUMER = 1 };

/* Default cap on the spin of a wait before it sleeps: 200 us, a few fills
 * or drains of a ring of tiny batches, short against any real batch. */
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
    _Atomic int sleepers;     /* threads asleep in a wait: wakers lock only if > 0 */
    _Atomic int parked[2];    /* [PF_PRODUCER], [PF_CONSUMER]: that side is inside a wait */
    int64_t spin_ns;          /* most a wait spins before it sleeps (0: never, e.g. one CPU) */
    int64_t spin_budget[2];   /* per side, adaptive: grows when spins succeed, halves when not */
    pf_sync sync;
#if defined(PF_DEBUG) && PF_DEBUG
    /* Debug build: per side, the thread holding a slot (0: none), from a
     * reserve/acquire to its publish/release. Atomic so that a broken "one
     * thread per side" shows up as an assert, not only as a TSan report. */
    _Atomic uintptr_t holder[2];
#endif
} pf_ring;

/* The layout the fast paths rely on: head, tail and the shared fields on
 * three different cache lines, so the indices the two sides poll are never
 * written by the other side. (Both sides do write `bytes` on the shared line,
 * once per publish and release: one contended line, not two.) */
_Static_assert(_Alignof(pf_ring) == PF_CACHELINE, "pf_ring is cache-line aligned");
_Static_assert(offsetof(pf_ring, head) % PF_CACHELINE == 0, "head starts a cache line");
_Static_assert(offsetof(pf_ring, tail) - offsetof(pf_ring, head) >= PF_CACHELINE &&
                   offsetof(pf_ring, tail) % PF_CACHELINE == 0, "tail on its own cache line");
_Static_assert(offsetof(pf_ring, capacity) - offsetof(pf_ring, tail) >= PF_CACHELINE &&
                   offsetof(pf_ring, capacity) % PF_CACHELINE == 0, "shared fields off the index lines");
_Static_assert(offsetof(pf_ring, tail_cache) < offsetof(pf_ring, tail) &&
                   offsetof(pf_ring, head_cache) < offsetof(pf_ring, capacity),
               "each side's cache of the other index sits on its own line");

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

/* Producer. Waits up to timeout_ns for a free slot with room for nbytes
 * under max_bytes (a batch always fits an empty ring). Returns
 *   PF_OK        *slot is the slot to fill, then pf_ring_publish;
 *   PF_EAGAIN    not ready, and timeout_ns == 0;
 *   PF_ETIMEDOUT not ready after timeout_ns;
 *   PF_ECLOSED   closed (before or while waiting);
 *   PF_EINVAL    timeout_ns < 0.
 * *slot is written only on PF_OK. */
int pf_ring_reserve(pf_ring *r, uint64_t nbytes, int64_t timeout_ns, uint64_t *slot);
// Makes the reserved slot visible to the consumer.
void pf_ring_publish(pf_ring *r, uint64_t nbytes);

/* Consumer. Waits up to timeout_ns for the oldest published slot. Returns
 * PF_OK (*slot set; then pf_ring_release), or PF_EAGAIN, PF_ETIMEDOUT,
 * PF_ECLOSED, PF_EINVAL as pf_ring_reserve. Closing wins over published
 * slots: after close, acquire returns PF_ECLOSED even if some are left. */
int pf_ring_acquire(pf_ring *r, int64_t timeout_ns, uint64_t *slot);
// Gives the acquired slot back to the producer; returns the bytes it was published with.
uint64_t pf_ring_release(pf_ring *r);

// Slots published and not yet released (any thread; a snapshot).
uint64_t pf_ring_fill(pf_ring *r);
// Wakes every waiter; all later reserves and acquires return PF_ECLOSED. Idempotent.
void pf_ring_close(pf_ring *r);

#endif
