/* pf_sync.c: bodies for pf_sync.h. */
#include "pf_sync.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Noreturn void pf_fatal(const char *what, int err) {
    fprintf(stderr, "prefetch: %s failed: %s\n", what, strerror(err));
    abort();
}

/* For pthread calls that fail only on a bug (see pf_sync.h). */
static void must(int err, const char *what) {
    if (err != 0) pf_fatal(what, err);
}

int pf_sync_init(pf_sync *s) {
    pthread_condattr_t attr;
    if (pthread_mutex_init(&s->mu, NULL) != 0) return PF_ESYS;
    if (pthread_condattr_init(&attr) == 0) {
        int err = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        if (err == 0) err = pthread_cond_init(&s->cv, &attr);
        must(pthread_condattr_destroy(&attr), "pthread_condattr_destroy");
        if (err == 0) return PF_OK;
    }
    must(pthread_mutex_destroy(&s->mu), "pthread_mutex_destroy");
    return PF_ESYS;
}

void pf_sync_fini(pf_sync *s) {
    must(pthread_cond_destroy(&s->cv), "pthread_cond_destroy");
    must(pthread_mutex_destroy(&s->mu), "pthread_mutex_destroy");
}

void pf_sync_lock(pf_sync *s) { must(pthread_mutex_lock(&s->mu), "pthread_mutex_lock"); }
void pf_sync_unlock(pf_sync *s) { must(pthread_mutex_unlock(&s->mu), "pthread_mutex_unlock"); }
void pf_sync_broadcast(pf_sync *s) { must(pthread_cond_broadcast(&s->cv), "pthread_cond_broadcast"); }

int64_t pf_now_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) pf_fatal("clock_gettime(CLOCK_MONOTONIC)", errno);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int pf_sync_wait(pf_sync *s, int64_t timeout_ns) {
    int64_t now = pf_now_ns();
    if (timeout_ns < 0) timeout_ns = 0;
    int64_t deadline = timeout_ns > INT64_MAX - now ? INT64_MAX : now + timeout_ns;
    struct timespec ts = {.tv_sec = deadline / 1000000000, .tv_nsec = deadline % 1000000000};
    int err = pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    if (err == ETIMEDOUT) return PF_ETIMEDOUT;
    must(err, "pthread_cond_timedwait");
    return PF_OK;
}

static atomic_uint fork_epoch;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void) {
    atomic_fetch_add_explicit(&fork_epoch, 1, memory_order_relaxed);
}

/* Without the handler a forked child would use its parent's locks: fail
 * loudly instead (pthread_atfork fails only with ENOMEM). */
static void install_fork_handler(void) {
    must(pthread_atfork(NULL, NULL, on_fork_child), "pthread_atfork");
}

unsigned pf_fork_epoch(void) {
    must(pthread_once(&fork_once, install_fork_handler), "pthread_once");
    return atomic_load_explicit(&fork_epoch, memory_order_relaxed);
}
