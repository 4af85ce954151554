/* pf_ring.c: lock-free fast paths, condvar slow paths for pf_ring.h.
 *
 * Memory order: the producer fills a slot, then store-releases head; the
 * consumer load-acquires head before reading the slot, and store-releases tail
 * after it is done with it, which the producer load-acquires before reuse.
 * Sleeping uses a Dekker pair: a sleeper does sleepers++ (seq_cst) then
 * re-reads the index; a waker stores the index, issues a seq_cst fence, then
 * reads sleepers. One of them must see the other, so no wakeup is lost; the
 * timed waits bound the damage if that reasoning is ever wrong.
 *
 * Before it sleeps, a waiter spins briefly without the GIL until its
 * condition holds *and* the other side is parked in a wait too, i.e. has
 * released the GIL. It then takes a free GIL at once, instead of sleeping on
 * the GIL's condvar and paying an OS wakeup (tens of microseconds on a VM)
 * at every hand-over; with tiny batches those wakeups are the whole cost.
 */
#include "pf_ring.h"

#include <stdlib.h>
#include <unistd.h>

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

int pf_ring_init(pf_ring *r, uint64_t capacity, uint64_t max_bytes, int64_t spin_ns) {
    if (capacity == 0) return PF_EINVAL;
    atomic_init(&r->head, 0);
    atomic_init(&r->tail, 0);
    r->tail_cache = r->head_cache = 0;
    r->capacity = capacity;
    r->max_bytes = max_bytes;
    atomic_init(&r->bytes, 0);
    atomic_init(&r->closed, 0);
    atomic_init(&r->sleepers, 0);
    atomic_init(&r->parked[PF_PRODUCER], 0);
    atomic_init(&r->parked[PF_CONSUMER], 0);
#if defined(PF_DEBUG) && PF_DEBUG
    atomic_init(&r->holder[PF_PRODUCER], 0);
    atomic_init(&r->holder[PF_CONSUMER], 0);
#endif
    /* Spinning only helps when the other side runs on another CPU meanwhile
     * (sysconf's -1, "unknown", counts as one CPU). */
    if (spin_ns < 0) spin_ns = sysconf(_SC_NPROCESSORS_ONLN) > 1 ? PF_RING_SPIN_NS : 0;
    r->spin_ns = spin_ns;
    r->spin_budget[PF_PRODUCER] = r->spin_budget[PF_CONSUMER] = spin_ns / 4;
    r->slot_bytes = calloc(capacity, sizeof *r->slot_bytes);
    if (!r->slot_bytes) return PF_ENOMEM;
    if (pf_sync_init(&r->sync) != PF_OK) {
        free(r->slot_bytes);
        r->slot_bytes = NULL;
        return PF_ESYS;
    }
    return PF_OK;
}

void pf_ring_fini(pf_ring *r) {
    pf_sync_fini(&r->sync);
    free(r->slot_bytes);
    r->slot_bytes = NULL;
}

pf_ring *pf_ring_new(uint64_t capacity, uint64_t max_bytes, int64_t spin_ns, int *rc) {
    void *mem = NULL;
    if (posix_memalign(&mem, PF_CACHELINE, sizeof(pf_ring)) != 0) {
        *rc = PF_ENOMEM;
        return NULL;
    }
    *rc = pf_ring_init(mem, capacity, max_bytes, spin_ns);
    if (*rc != PF_OK) {
        free(mem);
        return NULL;
    }
    return mem;
}

void pf_ring_delete(pf_ring *r) {
    pf_ring_fini(r);
    free(r);
}

static int is_closed(pf_ring *r) {
    return atomic_load_explicit(&r->closed, memory_order_acquire);
}

/* Debug build: checks the "one thread per side" rule. A side's slot is held
 * from a successful reserve/acquire to its publish/release, by one thread;
 * taking it again from that thread returns the same slot and is fine. */
#if defined(PF_DEBUG) && PF_DEBUG
static _Thread_local char thread_tag; /* its address names the calling thread */

static void note_take(pf_ring *r, int side) {
    uintptr_t me = (uintptr_t)&thread_tag;
    uintptr_t was = atomic_exchange_explicit(&r->holder[side], me, memory_order_relaxed);
    assert((was == 0 || was == me) && "two threads on one side of the ring at once");
    (void)was;
}

static void note_give(pf_ring *r, int side) {
    uintptr_t was = atomic_exchange_explicit(&r->holder[side], 0, memory_order_relaxed);
    assert(was == (uintptr_t)&thread_tag && "publish/release without reserve/acquire by this thread");
    (void)was;
}
#else
#define note_take(r, side) ((void)0)
#define note_give(r, side) ((void)0)
#endif

/* Wake sleepers after an index store; see the file comment for the fence. */
static void wake(pf_ring *r) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&r->sleepers, memory_order_relaxed) > 0) {
        pf_sync_lock(&r->sync);
        pf_sync_broadcast(&r->sync);
        pf_sync_unlock(&r->sync);
    }
}

/* The no-wait paths: PF_OK with *slot, PF_EAGAIN or PF_ECLOSED. In steady
 * state they read closed and the own index, and the other side's index only
 * when the cached copy says "not ready". */
static int try_reserve(pf_ring *r, uint64_t nbytes, uint64_t *slot) {
    if (is_closed(r)) return PF_ECLOSED;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    PF_ASSERT(head - r->tail_cache <= r->capacity);
    if (head - r->tail_cache >= r->capacity) {
        /* Acquire: the consumer's reads of the slot happen before we reuse it. */
        r->tail_cache = atomic_load_explicit(&r->tail, memory_order_acquire);
        if (head - r->tail_cache >= r->capacity) return PF_EAGAIN;
    }
    if (r->max_bytes && head != r->tail_cache) {
        uint64_t buffered = atomic_load_explicit(&r->bytes, memory_order_relaxed);
        if (buffered + nbytes > r->max_bytes) {
            /* The bytes may have been released since tail_cache was read. */
            r->tail_cache = atomic_load_explicit(&r->tail, memory_order_acquire);
            buffered = atomic_load_explicit(&r->bytes, memory_order_relaxed);
            if (head != r->tail_cache && buffered + nbytes > r->max_bytes) return PF_EAGAIN;
        }
    }
    *slot = head % r->capacity;
    return PF_OK;
}

static int try_acquire(pf_ring *r, uint64_t *slot) {
    if (is_closed(r)) return PF_ECLOSED;
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    if (tail == r->head_cache) {
        /* Acquire: pairs with the release in publish, so the slot is filled. */
        r->head_cache = atomic_load_explicit(&r->head, memory_order_acquire);
        if (tail == r->head_cache) return PF_EAGAIN;
    }
    PF_ASSERT(r->head_cache - tail <= r->capacity);
    *slot = tail % r->capacity;
    return PF_OK;
}

static int can_reserve(pf_ring *r, uint64_t nbytes) {
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_seq_cst);
    if (head - tail >= r->capacity) return 0;
    if (!r->max_bytes || head == tail) return 1;
    return atomic_load_explicit(&r->bytes, memory_order_seq_cst) + nbytes <= r->max_bytes;
}

static int can_acquire(pf_ring *r, uint64_t unused) {
    (void)unused;
    return atomic_load_explicit(&r->head, memory_order_seq_cst) !=
           atomic_load_explicit(&r->tail, memory_order_relaxed);
}


static int ready(pf_ring *r, int side, uint64_t nbytes) {
    return side == PF_PRODUCER ? can_reserve(r, nbytes) : can_acquire(r, nbytes);
}

/* Spins (see the file comment), then sleeps until ready(), close or
 * timeout. ready() re-reads the shared index with seq_cst ordering after
 * sleepers++ (the Dekker pair). Returns PF_OK, PF_ETIMEDOUT or PF_ECLOSED. */
static int wait_until(pf_ring *r, int side, uint64_t nbytes, int64_t timeout_ns) {
    int64_t start = pf_now_ns();
    int64_t deadline = timeout_ns > INT64_MAX - start ? INT64_MAX : start + timeout_ns;
    int rc = PF_OK;
    atomic_store_explicit(&r->parked[side], 1, memory_order_seq_cst);
    if (r->spin_ns > 0) {
        /* Adaptive, as glibc's adaptive mutexes: a spin that succeeds lets the
         * next one last up to twice as long (capped by spin_ns); one that
         * fails halves the budget, so slow batches soon cost no spinning. */
        int64_t *budget = &r->spin_budget[side];
        int64_t spin_end = start + (*budget < timeout_ns ? *budget : timeout_ns);
        for (unsigned i = 1;; i++) {
            if (is_closed(r)) break;
            if (ready(r, side, nbytes) && atomic_load_explicit(&r->parked[!side], memory_order_relaxed)) {
                int64_t took = 2 * (pf_now_ns() - start);
                if (took > *budget) *budget = took < r->spin_ns ? took : r->spin_ns;
                goto out;
            }
            if (i % 64 == 0 && pf_now_ns() >= spin_end) break;
            cpu_relax();
        }
        if (*budget > r->spin_ns / 64) *budget /= 2;
        if (ready(r, side, nbytes)) goto out; /* ready, the other side busy: take the GIL as usual */
    }
    pf_sync_lock(&r->sync);
    atomic_fetch_add_explicit(&r->sleepers, 1, memory_order_seq_cst);
    while (!is_closed(r) && !ready(r, side, nbytes)) {
        int64_t left = deadline - pf_now_ns();
        if (left <= 0 || pf_sync_wait(&r->sync, left) == PF_ETIMEDOUT) {
            /* One last look: the condition may have come with the deadline. */
            if (!is_closed(r) && !ready(r, side, nbytes)) rc = PF_ETIMEDOUT;
            break;
        }
    }
    atomic_fetch_sub_explicit(&r->sleepers, 1, memory_order_relaxed);
    pf_sync_unlock(&r->sync);
out:
    atomic_store_explicit(&r->parked[side], 0, memory_order_relaxed);
    return is_closed(r) ? PF_ECLOSED : rc;
}


/* reserve and acquire: the no-wait try, then (timeout_ns > 0) the wait. Once
 * a wait sees its condition it holds until this side acts (the other side
 * only adds room or batches), so the second try succeeds unless the ring
 * closed in between. */
static int get_slot(pf_ring *r, int side, uint64_t nbytes, int64_t timeout_ns, uint64_t *slot) {
    if (timeout_ns < 0) return PF_EINVAL;
    int rc = side == PF_PRODUCER ? try_reserve(r, nbytes, slot) : try_acquire(r, slot);
    if (rc == PF_EAGAIN && timeout_ns > 0) {
        rc = wait_until(r, side, nbytes, timeout_ns);
        if (rc == PF_OK) {
            rc = side == PF_PRODUCER ? try_reserve(r, nbytes, slot) : try_acquire(r, slot);
            PF_ASSERT(rc != PF_EAGAIN);
        }
    }
    if (rc == PF_OK) note_take(r, side);
    return rc;
}

int pf_ring_reserve(pf_ring *r, uint64_t nbytes, int64_t timeout_ns, uint64_t *slot) {
    return get_slot(r, PF_PRODUCER, nbytes, timeout_ns, slot);
}

int pf_ring_acquire(pf_ring *r, int64_t timeout_ns, uint64_t *slot) {
    return get_slot(r, PF_CONSUMER, 0, timeout_ns, slot);
}

void pf_ring_publish(pf_ring *r, uint64_t nbytes) {
    note_give(r, PF_PRODUCER);
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    PF_ASSERT(head - atomic_load_explicit(&r->tail, memory_order_acquire) < r->capacity);
    r->slot_bytes[head % r->capacity] = nbytes;
    uint64_t before = atomic_fetch_add_explicit(&r->bytes, nbytes, memory_order_relaxed);
    PF_ASSERT(before + nbytes >= before);
    (void)before;
    /* Release: the slot's contents (and slot_bytes) are visible before head. */
    atomic_store_explicit(&r->head, head + 1, memory_order_release);
    wake(r);
}

uint64_t pf_ring_release(pf_ring *r) {
    note_give(r, PF_CONSUMER);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    PF_ASSERT(atomic_load_explicit(&r->head, memory_order_acquire) != tail);
    uint64_t n = r->slot_bytes[tail % r->capacity];
    uint64_t before = atomic_fetch_sub_explicit(&r->bytes, n, memory_order_relaxed);
    PF_ASSERT(before >= n);
    (void)before;
    /* Release: we are done reading the slot before the producer may refill it. */
    atomic_store_explicit(&r->tail, tail + 1, memory_order_release);
    wake(r);
    return n;
}

uint64_t pf_ring_fill(pf_ring *r) {
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    uint64_t fill = atomic_load_explicit(&r->head, memory_order_acquire) - tail;
    /* Both indices move while we read them: never report more than exists. */
    return fill > r->capacity ? r->capacity : fill;
}

void pf_ring_close(pf_ring *r) {
    atomic_store_explicit(&r->closed, 1, memory_order_release);
    pf_sync_lock(&r->sync);
    pf_sync_broadcast(&r->sync);
    pf_sync_unlock(&r->sync);
}
