/* pf_copy.h: memcpy of a batch's contiguous leaves, split across threads.
 *
 * A copier owns nhelpers pthreads that touch no Python object. pf_copy_run is
 * called by one thread at a time (the fetch thread, without the GIL); it cuts
 * the batch's bytes into equal shares, copies shares itself, and lets the
 * helpers claim the rest, returning only when every byte is copied and no
 * helper still looks at the job list.
 */
#ifndef PF_COPY_H
#define PF_COPY_H

#include "pf_sync.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pf_copy_job {
    void *dst;
    const void *src;
    size_t nbytes;
} pf_copy_job;

typedef struct pf_copier {
    pf_sync sync;
    pthread_t *helpers;
    int nhelpers;       /* threads started */
    int stopping;
    /* The task in progress; written under sync.mu by pf_copy_run. */
    uint64_t generation; /* bumped per task: helpers wake on a change */
    const pf_copy_job *jobs;
    size_t njobs, total, share_bytes, nshares;
    _Atomic size_t next_share; /* next share to claim */
    size_t shares_done;
    int helpers_busy;    /* helpers that may still read jobs */
} pf_copier;

/* Batches smaller than this are copied by the caller alone: waking a helper
 * costs more than the copy. */
#define PF_COPY_SPLIT_MIN ((size_t)1 << 20)

// Starts nhelpers threads (0 is valid: every copy is then done by the caller).
// Returns 0, PF_ENOMEM or PF_ESYS (then nothing is left to fini).
int pf_copier_init(pf_copier *c, int nhelpers);
// Stops and joins the helpers. Not in a forked child: there they do not exist.
void pf_copier_fini(pf_copier *c);
// Process-wide: helper threads started and not yet joined (leak checks).
uint64_t pf_copier_live_threads(void);
// Copies every job; returns when all bytes are in place.
void pf_copy_run(pf_copier *c, const pf_copy_job *jobs, size_t njobs);

#endif
