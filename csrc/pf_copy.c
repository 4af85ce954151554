/* pf_copy.c: bodies for pf_copy.h. */
#include "pf_copy.h"

#include <stdlib.h>
#include <string.h>

/* Every wait here loops on its condition; the timeout only bounds a lost
 * wakeup, if there ever were one. */
#define WAKE_CHECK_NS (100 * 1000 * 1000)

static atomic_uint_fast64_t live_threads;

uint64_t pf_copier_live_threads(void) {
    return atomic_load_explicit(&live_threads, memory_order_relaxed);
}

/* Copies bytes [lo, hi) of the concatenation of all jobs. */
static void copy_range(const pf_copy_job *jobs, size_t njobs, size_t lo, size_t hi) {
    size_t start = 0;
    for (size_t i = 0; i < njobs && start < hi; i++) {
        size_t end = start + jobs[i].nbytes;
        if (end > lo) {
            size_t a = lo > start ? lo - start : 0;
            size_t b = (hi < end ? hi : end) - start;
            memcpy((char *)jobs[i].dst + a, (const char *)jobs[i].src + a, b - a);
        }
        start = end;
    }
}

/* Claims and copies shares until none is left; returns how many it copied. */
static size_t copy_shares(pf_copier *c, const pf_copy_job *jobs, size_t njobs, size_t total,
                          size_t share_bytes, size_t nshares) {
    size_t done = 0;
    for (;;) {
        size_t i = atomic_fetch_add_explicit(&c->next_share, 1, memory_order_relaxed);
        if (i >= nshares) return done;
        size_t lo = i * share_bytes, hi = lo + share_bytes < total ? lo + share_bytes : total;
        copy_range(jobs, njobs, lo, hi);
        done++;
    }
}

static void *helper_main(void *arg) {
    pf_copier *c = arg;
    uint64_t seen = 0;
    pf_sync_lock(&c->sync);
    while (!c->stopping) {
        if (c->generation == seen) {
            (void)pf_sync_wait(&c->sync, WAKE_CHECK_NS);
            continue;
        }
        seen = c->generation;
        /* Snapshot the task under the lock; helpers_busy keeps pf_copy_run
         * from returning (and the caller from freeing jobs) while we copy. */
        const pf_copy_job *jobs = c->jobs;
        size_t njobs = c->njobs, total = c->total, share = c->share_bytes, n = c->nshares;
        c->helpers_busy++;
        pf_sync_unlock(&c->sync);
        size_t done = copy_shares(c, jobs, njobs, total, share, n);
        pf_sync_lock(&c->sync);
        c->shares_done += done;
        PF_ASSERT(c->helpers_busy > 0 && c->shares_done <= n);
        c->helpers_busy--;
        pf_sync_broadcast(&c->sync);
    }
    pf_sync_unlock(&c->sync);
    return NULL;
}

int pf_copier_init(pf_copier *c, int nhelpers) {
    memset(c, 0, sizeof *c);
    atomic_init(&c->next_share, 0);
    if (pf_sync_init(&c->sync) != PF_OK) return PF_ESYS;
    if (nhelpers <= 0) return PF_OK;
    c->helpers = calloc((size_t)nhelpers, sizeof *c->helpers);
    if (!c->helpers) {
        pf_sync_fini(&c->sync);
        return PF_ENOMEM;
    }
    for (int i = 0; i < nhelpers; i++) {
        if (pthread_create(&c->helpers[i], NULL, helper_main, c) != 0) {
            pf_copier_fini(c);
            return PF_ESYS;
        }
        c->nhelpers++;
        atomic_fetch_add_explicit(&live_threads, 1, memory_order_relaxed);
    }
    return PF_OK;
}

void pf_copier_fini(pf_copier *c) {
    pf_sync_lock(&c->sync);
    c->stopping = 1;
    pf_sync_broadcast(&c->sync);
    pf_sync_unlock(&c->sync);
    for (int i = 0; i < c->nhelpers; i++) {
        int err = pthread_join(c->helpers[i], NULL); /* fails only on a bug */
        if (err != 0) pf_fatal("pthread_join", err);
        atomic_fetch_sub_explicit(&live_threads, 1, memory_order_relaxed);
    }
    free(c->helpers);
    c->helpers = NULL;
    c->nhelpers = 0;
    pf_sync_fini(&c->sync);
}

void pf_copy_run(pf_copier *c, const pf_copy_job *jobs, size_t njobs) {
    size_t total = 0;
    for (size_t i = 0; i < njobs; i++) total += jobs[i].nbytes;
    if (c->nhelpers == 0 || total < PF_COPY_SPLIT_MIN) {
        copy_range(jobs, njobs, 0, total);
        return;
    }
    /* Two shares per thread balance a helper that starts late against the
     * cost of claiming; cache-line multiples keep two threads off one line
     * within a leaf. */
    size_t nthreads = (size_t)c->nhelpers + 1;
    size_t share = (total / (2 * nthreads) + PF_CACHELINE - 1) / PF_CACHELINE * PF_CACHELINE;
    size_t nshares = (total + share - 1) / share;
    pf_sync_lock(&c->sync);
    /* A helper that woke too late for the last task may still hold its
     * snapshot; it must drop it before next_share is reset under it. */
    while (c->helpers_busy > 0) (void)pf_sync_wait(&c->sync, WAKE_CHECK_NS); /* re-checks */
    c->jobs = jobs;
    c->njobs = njobs;
    c->total = total;
    c->share_bytes = share;
    c->nshares = nshares;
    c->shares_done = 0;
    atomic_store_explicit(&c->next_share, 0, memory_order_relaxed);
    c->generation++;
    pf_sync_broadcast(&c->sync);
    pf_sync_unlock(&c->sync);

    size_t done = copy_shares(c, jobs, njobs, total, share, nshares);

    pf_sync_lock(&c->sync);
    c->shares_done += done;
    while (c->shares_done < nshares || c->helpers_busy > 0) (void)pf_sync_wait(&c->sync, WAKE_CHECK_NS);
    PF_ASSERT(c->shares_done == nshares);
    pf_sync_unlock(&c->sync);
}
