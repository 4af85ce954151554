/* pf_sync.h: the few pthread primitives the core needs, plus a fork epoch.
 *
 * No Python here: everything compiles standalone and runs under TSan.
 * Waits are always timed (CLOCK_MONOTONIC), so a caller can wake up in short
 * slices to notice signals, closing, or a dead peer; nothing waits forever.
 *
 * Every csrc header includes this file before any system header, and every
 * csrc .c file includes its own header first, so the feature macro below is
 * set once, here, before <features.h> is read.
 */
#ifndef PF_SYNC_H
#define PF_SYNC_H

/* POSIX.1-2008 for posix_memalign, clock_gettime, pthread_condattr_setclock
 * (and nanosleep in the test driver): -std=c11 alone hides them. CPython's
 * pyconfig.h sets the same value, so the Cython module, which includes this
 * after it, gets the same declarations. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <assert.h>
#include <pthread.h>
#include <stdint.h>

#define PF_CACHELINE 64
#define PF_ALIGNED _Alignas(PF_CACHELINE)
_Static_assert((PF_CACHELINE & (PF_CACHELINE - 1)) == 0, "PF_CACHELINE must be a power of two");

/* Invariant checks of the debug build (setup.py: PREFETCH_DEBUG=1 gives
 * -UNDEBUG -DPF_DEBUG=1). Off otherwise: some cost an extra shared load. */
#if defined(PF_DEBUG) && PF_DEBUG
#define PF_ASSERT(cond) assert(cond)
#else
#define PF_ASSERT(cond) ((void)0)
#endif

/* Return codes shared by every pf_* function: 0 or a negative PF_E* code. */
enum {
    PF_OK = 0,
    PF_ETIMEDOUT = -1, /* waited the whole timeout and the condition still does not hold */
    PF_ECLOSED = -2,   /* the object was closed while (or before) waiting */
    PF_ENOMEM = -3,    /* an allocation failed */
    PF_EINVAL = -4,    /* bad argument (a bug in the caller) */
    PF_ESYS = -5,      /* a pthread call failed */
    PF_EAGAIN = -6,    /* not ready, and the caller asked not to wait (timeout 0): try again */
};

typedef struct pf_sync {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* bound to CLOCK_MONOTONIC: wall-clock jumps don't matter */
} pf_sync;

// Returns 0 or PF_ESYS (then nothing is left to fini).
int pf_sync_init(pf_sync *s);
/* The calls below fail only on a bug (an uninitialised, destroyed or
 * unowned mutex, a busy condvar): they abort with a message then, as
 * CPython does for its GIL mutex, rather than return a code that no caller
 * could recover from. */
void pf_sync_fini(pf_sync *s);
void pf_sync_lock(pf_sync *s);
void pf_sync_unlock(pf_sync *s);
void pf_sync_broadcast(pf_sync *s);
// Caller holds the lock. Returns PF_OK when woken (perhaps spuriously: the
// caller re-checks its condition) or PF_ETIMEDOUT after timeout_ns (<= 0:
// at once; huge: clamped, no overflow).
int pf_sync_wait(pf_sync *s, int64_t timeout_ns);

// Monotonic clock in nanoseconds.
int64_t pf_now_ns(void);

/* Incremented in the child after every fork(). An object records the epoch it
 * was created in; if the epoch differs, its threads and locks belong to the
 * parent and must not be touched (their mutexes may be copied locked). */
unsigned pf_fork_epoch(void);

// Prints "prefetch: <what> failed: <strerror(err)>" and aborts (bugs only).
_Noreturn void pf_fatal(const char *what, int err);

#endif
