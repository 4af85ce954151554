/* pf_sync.c: bodies for pf_sync.h. */
#define _POSIX_C_SOURCE 200809L /* posix_memalign, condattr_setclock, nanosleep */
#include "pf_sync.h"

#include <errno.h>
#include <stdatomic.h>
#include <time.h>

int pf_sync_init(pf_sync *s) {
    pthread_condattr_t attr;
    if (pthread_mutex_init(&s->mu, NULL) != 0) return PF_ESYS;
    if (pthread_condattr_init(&attr) != 0) goto fail_mu;
    if (pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) != 0 ||
        pthread_cond_init(&s->cv, &attr) != 0) {
        pthread_condattr_destroy(&attr);
        goto fail_mu;
    }
    pthread_condattr_destroy(&attr);
    return PF_OK;
fail_mu:
    pthread_mutex_destroy(&s->mu);
    return PF_ESYS;
}

void pf_sync_fini(pf_sync *s) {
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

void pf_sync_lock(pf_sync *s) { pthread_mutex_lock(&s->mu); }
void pf_sync_unlock(pf_sync *s) { pthread_mutex_unlock(&s->mu); }
void pf_sync_broadcast(pf_sync *s) { pthread_cond_broadcast(&s->cv); }

int64_t pf_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int pf_sync_wait(pf_sync *s, int64_t timeout_ns) {
    int64_t deadline = pf_now_ns() + (timeout_ns > 0 ? timeout_ns : 0);
    struct timespec ts = {.tv_sec = deadline / 1000000000, .tv_nsec = deadline % 1000000000};
    int rc = pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    return rc == ETIMEDOUT ? PF_ETIMEDOUT : PF_OK;
}

static atomic_uint fork_epoch;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void) {
    atomic_fetch_add_explicit(&fork_epoch, 1, memory_order_relaxed);
}

static void install_fork_handler(void) { pthread_atfork(NULL, NULL, on_fork_child); }

unsigned pf_fork_epoch(void) {
    pthread_once(&fork_once, install_fork_handler);
    return atomic_load_explicit(&fork_epoch, memory_order_relaxed);
}
