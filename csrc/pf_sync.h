/* pf_sync.h: the few pthread primitives the core needs, plus a fork epoch.
 *
 * No Python here: everything compiles standalone and runs under TSan.
 * Waits are always timed (CLOCK_MONOTONIC), so a caller can wake up in short
 * slices to notice signals, closing, or a dead peer; nothing waits forever.
 */
#ifndef PF_SYNC_H
#define PF_SYNC_H

#include <pthread.h>
#include <stdint.h>

#define PF_CACHELINE 64
#define PF_ALIGNED _Alignas(PF_CACHELINE)

/* Return codes shared by every pf_* function: 0 or a negative PF_E* code. */
enum {
    PF_OK = 0,
    PF_ETIMEDOUT = -1, /* the wait slice ran out; the condition may still come */
    PF_ECLOSED = -2,   /* the object was closed while (or before) waiting */
    PF_ENOMEM = -3,    /* an allocation failed */
    PF_EINVAL = -4,    /* bad argument (a bug in the caller) */
    PF_ESYS = -5,      /* a pthread call failed */
};

typedef struct pf_sync {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* bound to CLOCK_MONOTONIC: wall-clock jumps don't matter */
} pf_sync;

// Returns 0 or PF_ESYS.
int pf_sync_init(pf_sync *s);
void pf_sync_fini(pf_sync *s);
void pf_sync_lock(pf_sync *s);
void pf_sync_unlock(pf_sync *s);
void pf_sync_broadcast(pf_sync *s);
// Caller holds the lock. Returns 0 when woken, PF_ETIMEDOUT after timeout_ns.
int pf_sync_wait(pf_sync *s, int64_t timeout_ns);

// Monotonic clock in nanoseconds.
int64_t pf_now_ns(void);

/* Incremented in the child after every fork(). An object records the epoch it
 * was created in; if the epoch differs, its threads and locks belong to the
 * parent and must not be touched (their mutexes may be copied locked). */
unsigned pf_fork_epoch(void);

#endif
