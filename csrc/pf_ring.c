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
#define _POSIX_C_SOURCE 200809L /* posix_memalign, condattr_setclock, nanosleep */
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
    /* Spinning only helps when the other side runs on another CPU meanwhile. */
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

/* Wake sleepers after an index store; see the file comment for the fence. */
static void wake(pf_ring *r) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&r->sleepers, memory_order_relaxed) > 0) {
        pf_sync_lock(&r->sync);
        pf_sync_broadcast(&r->sync);
        pf_sync_unlock(&r->sync);
    }
}

int pf_ring_try_reserve(pf_ring *r, uint64_t nbytes, uint64_t *slot) {
    if (is_closed(r)) return PF_ECLOSED;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    if (head - r->tail_cache >= r->capacity) {
        /* Acquire: the consumer's reads of the slot happen before we reuse it. */
        r->tail_cache = atomic_load_explicit(&r->tail, memory_order_acquire);
        if (head - r->tail_cache >= r->capacity) return PF_ETIMEDOUT;
    }
    if (r->max_bytes && head != r->tail_cache) {
        uint64_t buffered = atomic_load_explicit(&r->bytes, memory_order_relaxed);
        if (buffered + nbytes > r->max_bytes) {
            /* The bytes may have been released since tail_cache was read. */
            r->tail_cache = atomic_load_explicit(&r->tail, memory_order_acquire);
            buffered = atomic_load_explicit(&r->bytes, memory_order_relaxed);
            if (head != r->tail_cache && buffered + nbytes > r->max_bytes) return PF_ETIMEDOUT;
        }
    }
    *slot = head % r->capacity;
    return PF_OK;
}

void pf_ring_publish(pf_ring *r, uint64_t nbytes) {
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    r->slot_bytes[head % r->capacity] = nbytes;
    atomic_fetch_add_explicit(&r->bytes, nbytes, memory_order_relaxed);
    /* Release: the slot's contents (and slot_bytes) are visible before head. */
    atomic_store_explicit(&r->head, head + 1, memory_order_release);
    wake(r);
}

int pf_ring_try_acquire(pf_ring *r, uint64_t *slot) {
    if (is_closed(r)) return PF_ECLOSED;
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    if (tail == r->head_cache) {
        /* Acquire: pairs with the release in publish, so the slot is filled. */
        r->head_cache = atomic_load_explicit(&r->head, memory_order_acquire);
        if (tail == r->head_cache) return PF_ETIMEDOUT;
    }
    *slot = tail % r->capacity;
    return PF_OK;
}

void pf_ring_release(pf_ring *r) {
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    atomic_fetch_sub_explicit(&r->bytes, r->slot_bytes[tail % r->capacity], memory_order_relaxed);
    /* Release: we are done reading the slot before the producer may refill it. */
    atomic_store_explicit(&r->tail, tail + 1, memory_order_release);
    wake(r);
}

/* Spins (see the file comment), then sleeps until ready(r), close or
 * timeout. ready() re-reads the shared index with seq_cst ordering after
 * sleepers++ (the Dekker pair). */
static int wait_until(pf_ring *r, int side, int (*ready)(pf_ring *, uint64_t), uint64_t arg,
                      int64_t timeout_ns) {
    int64_t start = pf_now_ns(), deadline = start + timeout_ns;
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
            if (ready(r, arg) && atomic_load_explicit(&r->parked[!side], memory_order_relaxed)) {
                int64_t took = 2 * (pf_now_ns() - start);
                if (took > *budget) *budget = took < r->spin_ns ? took : r->spin_ns;
                goto out;
            }
            if (i % 64 == 0 && pf_now_ns() >= spin_end) break;
            cpu_relax();
        }
        if (*budget > r->spin_ns / 64) *budget /= 2;
        if (ready(r, arg)) goto out; /* ready, the other side busy: take the GIL as usual */
    }
    pf_sync_lock(&r->sync);
    atomic_fetch_add_explicit(&r->sleepers, 1, memory_order_seq_cst);
    while (!is_closed(r) && !ready(r, arg)) {
        int64_t left = deadline - pf_now_ns();
        if (left <= 0) {
            rc = PF_ETIMEDOUT;
            break;
        }
        pf_sync_wait(&r->sync, left);
    }
    atomic_fetch_sub_explicit(&r->sleepers, 1, memory_order_relaxed);
    pf_sync_unlock(&r->sync);
out:
    atomic_store_explicit(&r->parked[side], 0, memory_order_relaxed);
    return is_closed(r) ? PF_ECLOSED : rc;
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

int pf_ring_wait_reserve(pf_ring *r, uint64_t nbytes, int64_t timeout_ns) {
    return wait_until(r, PF_PRODUCER, can_reserve, nbytes, timeout_ns);
}

int pf_ring_wait_acquire(pf_ring *r, int64_t timeout_ns) {
    return wait_until(r, PF_CONSUMER, can_acquire, 0, timeout_ns);
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
