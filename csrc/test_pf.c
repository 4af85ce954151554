/* test_pf.c: standalone driver for csrc/, run under TSan and ASan+UBSan.
 *
 * Single-thread semantics of the ring and the pool, then fuzz runs where a
 * producer thread fills pool blocks, publishes them through the ring, and a
 * consumer checks order and contents and gives the blocks back from yet
 * another thread, while a copier splits large copies. Exits non-zero on the
 * first failed check.
 * Usage: test_pf [iterations] [seed]
 *        test_pf misuse NAME   (a PF_DEBUG build must abort on an assert)
 */
#include "pf_copy.h" /* first: the csrc headers set the feature macros */
#include "pf_pool.h"
#include "pf_ring.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static const int64_t MS = 1000 * 1000;

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static const uint64_t UNSET = 0xdeadbeef;

static void test_ring_semantics(void) {
    pf_ring r;
    uint64_t slot = UNSET;
    CHECK(pf_ring_init(&r, 0, 0, -1) == PF_EINVAL);
    CHECK(pf_ring_init(&r, 3, 0, -1) == PF_OK);
    /* Empty: "try again" without waiting, "timed out" after waiting. *slot
     * is written only on PF_OK. */
    CHECK(pf_ring_acquire(&r, 0, &slot) == PF_EAGAIN && slot == UNSET);
    int64_t t0 = pf_now_ns();
    CHECK(pf_ring_acquire(&r, 1 * MS, &slot) == PF_ETIMEDOUT && slot == UNSET);
    CHECK(pf_now_ns() - t0 >= 1 * MS); /* it did wait the whole timeout */
    CHECK(pf_ring_acquire(&r, -1, &slot) == PF_EINVAL && slot == UNSET);
    CHECK(pf_ring_reserve(&r, 1, -1, &slot) == PF_EINVAL && slot == UNSET);
    for (uint64_t i = 0; i < 3; i++) {
        /* Alternate no-wait and waiting calls: both return the slot at once. */
        CHECK(pf_ring_reserve(&r, 1, i % 2 ? 1 * MS : 0, &slot) == PF_OK && slot == i);
        pf_ring_publish(&r, 1);
    }
    CHECK(pf_ring_fill(&r) == 3);
    slot = UNSET;
    CHECK(pf_ring_reserve(&r, 1, 0, &slot) == PF_EAGAIN && slot == UNSET);
    t0 = pf_now_ns();
    CHECK(pf_ring_reserve(&r, 1, 1 * MS, &slot) == PF_ETIMEDOUT && slot == UNSET);
    CHECK(pf_now_ns() - t0 >= 1 * MS);
    for (uint64_t i = 0; i < 7; i++) { /* wraps around twice */
        CHECK(pf_ring_acquire(&r, i % 2 ? 0 : 1 * MS, &slot) == PF_OK && slot == i % 3);
        pf_ring_release(&r);
        CHECK(pf_ring_fill(&r) == 2);
        CHECK(pf_ring_reserve(&r, 1, i % 2 ? 1 * MS : 0, &slot) == PF_OK && slot == (i + 3) % 3);
        pf_ring_publish(&r, 1);
    }
    /* Huge timeouts are no deadline, not an overflow into the past. */
    CHECK(pf_ring_acquire(&r, INT64_MAX, &slot) == PF_OK && slot == 7 % 3);
    pf_ring_release(&r);
    CHECK(pf_ring_reserve(&r, 1, INT64_MAX, &slot) == PF_OK && slot == 10 % 3);
    pf_ring_publish(&r, 1);
    CHECK(pf_ring_fill(&r) == 3);
    pf_ring_close(&r);
    pf_ring_close(&r); /* idempotent */
    /* Closed wins over the three published slots, for every timeout. */
    slot = UNSET;
    CHECK(pf_ring_acquire(&r, 0, &slot) == PF_ECLOSED && slot == UNSET);
    CHECK(pf_ring_acquire(&r, 1 * MS, &slot) == PF_ECLOSED && slot == UNSET);
    CHECK(pf_ring_reserve(&r, 1, 0, &slot) == PF_ECLOSED && slot == UNSET);
    CHECK(pf_ring_reserve(&r, 1, 1 * MS, &slot) == PF_ECLOSED && slot == UNSET);
    CHECK(pf_ring_acquire(&r, -1, &slot) == PF_EINVAL); /* a bad argument stays one */
    pf_ring_fini(&r);
}

static void test_ring_max_bytes(void) {
    pf_ring r;
    uint64_t slot;
    CHECK(pf_ring_init(&r, 4, 100, -1) == PF_OK);
    /* A batch bigger than the cap still goes through when the ring is empty. */
    CHECK(pf_ring_reserve(&r, 500, 0, &slot) == PF_OK);
    pf_ring_publish(&r, 500);
    CHECK(pf_ring_reserve(&r, 1, 0, &slot) == PF_EAGAIN);
    CHECK(pf_ring_reserve(&r, 1, 1 * MS, &slot) == PF_ETIMEDOUT); /* slots free, bytes not */
    CHECK(pf_ring_acquire(&r, 0, &slot) == PF_OK);
    pf_ring_release(&r);
    CHECK(pf_ring_reserve(&r, 60, 0, &slot) == PF_OK);
    pf_ring_publish(&r, 60);
    /* Reserve for 0 bytes, then again for the real size: the same slot (the
     * fetch thread waits for a slot before it knows the batch's bytes). */
    uint64_t first = UNSET;
    CHECK(pf_ring_reserve(&r, 0, 0, &first) == PF_OK);
    CHECK(pf_ring_reserve(&r, 40, 1 * MS, &slot) == PF_OK && slot == first);
    pf_ring_publish(&r, 40);
    CHECK(pf_ring_reserve(&r, 1, 0, &slot) == PF_EAGAIN); /* 101 > 100 */
    CHECK(pf_ring_acquire(&r, 0, &slot) == PF_OK);
    pf_ring_release(&r);
    CHECK(pf_ring_reserve(&r, 60, 1 * MS, &slot) == PF_OK);
    pf_ring_publish(&r, 60);
    pf_ring_fini(&r);
}

static void test_pool_semantics(void) {
    CHECK(pf_pool_class_capacity(0) == 64);
    CHECK(pf_pool_class_capacity(64) == 64);
    CHECK(pf_pool_class_capacity(65) == 80);
    CHECK(pf_pool_class_capacity(1 << 20) == 1 << 20);
    CHECK(pf_pool_class_capacity((1 << 20) + 1) == (1 << 20) + (1 << 18));
    CHECK(pf_pool_class_capacity(PF_POOL_MAX_BYTES) == PF_POOL_MAX_BYTES + 1);
    CHECK(pf_pool_class_capacity(PF_POOL_MAX_BYTES + 1) == 0); /* would overflow: no class */
    CHECK(pf_pool_class_capacity(SIZE_MAX) == 0);
    for (size_t n = 1; n < 100000; n += 97) {
        size_t cap = pf_pool_class_capacity(n);
        CHECK(cap >= n && (cap <= 64 || cap - n < cap / 4 + 1));
    }
    pf_pool *p = pf_pool_new(1 << 20);
    CHECK(p);
    CHECK(pf_pool_get(p, SIZE_MAX) == NULL); /* refused, not a block of capacity 0 */
    CHECK(pf_pool_get_stats(p).blocks_out == 0);
    pf_block *a = pf_pool_get(p, 1000), *b = pf_pool_get(p, 1000);
    CHECK(a && b && a != b && a->capacity >= 1000);
    CHECK(((uintptr_t)a->data % PF_CACHELINE) == 0);
    memset(a->data, 1, 1000);
    void *a_data = a->data;
    pf_pool_put(a);
    pf_block *c = pf_pool_get(p, 990); /* same class: reused */
    CHECK(c->data == a_data);
    pf_pool_stats s = pf_pool_get_stats(p);
    CHECK(s.blocks_allocated == 2 && s.blocks_reused == 1 && s.blocks_out == 2);
    /* Over the keep cap: freed, not kept. */
    pf_block *big = pf_pool_get(p, 4 << 20);
    pf_pool_put(big);
    CHECK(pf_pool_get_stats(p).blocks_freed == 1);
    pf_pool_put(b);
    pf_pool_close(p); /* c is still out: the pool lives until it returns */
    CHECK(pf_pool_get(p, 10) == NULL);
    memset(c->data, 2, c->capacity);
    pf_pool_put(c); /* frees c, then the pool itself (ASan checks both) */
}

static void test_copier(int nhelpers, uint64_t *seed) {
    pf_copier c;
    CHECK(pf_copier_init(&c, nhelpers) == PF_OK);
    for (int round = 0; round < 8; round++) {
        size_t njobs = 1 + rng_next(seed) % 5;
        pf_copy_job jobs[5];
        for (size_t i = 0; i < njobs; i++) {
            size_t n = rng_next(seed) % 2 ? rng_next(seed) % 4096 : rng_next(seed) % (3u << 20);
            unsigned char *src = malloc(n + 1), *dst = malloc(n + 1);
            for (size_t k = 0; k < n; k++) src[k] = (unsigned char)(k * 31 + i + round);
            jobs[i] = (pf_copy_job){dst, src, n};
        }
        pf_copy_run(&c, jobs, njobs);
        for (size_t i = 0; i < njobs; i++) {
            CHECK(memcmp(jobs[i].dst, jobs[i].src, jobs[i].nbytes) == 0);
            free(jobs[i].dst);
            free((void *)jobs[i].src);
        }
    }
    pf_copier_fini(&c);
}

/* The fuzz: producer -> ring -> consumer, blocks returned by a third thread. */
typedef struct fuzz {
    pf_ring *ring;
    pf_pool *pool;
    pf_copier copier;
    pf_block **slots;     /* payload per ring slot */
    uint64_t *slot_seq;   /* sequence number per ring slot */
    uint64_t n, seed;
    /* consumer -> returner hand-off, a tiny mutex-protected stack */
    pf_sync ret_sync;
    pf_block **ret;
    size_t nret;
    int consumer_done;
} fuzz;

/* Batch seq's bytes are pattern_buf[seq % 251 ...]: distinct per batch,
 * without a byte loop per batch (slow under TSan). */
#define PATTERN_MAX (2u << 20)
static unsigned char pattern_buf[PATTERN_MAX + 256];
static const unsigned char *pattern(uint64_t seq) { return pattern_buf + seq % 251; }

/* As the Cython callers do: one no-wait call, then waits in slices until
 * ready. Mostly long slices; now and then 20 us ones, so that many waits end
 * in PF_ETIMEDOUT (mid-spin or mid-sleep) and are retried. */
static int64_t wait_slice(uint64_t *seed) { return rng_next(seed) % 4 == 0 ? 20 * 1000 : 50 * MS; }

static void *fuzz_producer(void *arg) {
    fuzz *f = arg;
    uint64_t seed = f->seed;
    for (uint64_t seq = 0; seq < f->n; seq++) {
        size_t n = rng_next(&seed) % 16 == 0 ? rng_next(&seed) % PATTERN_MAX : rng_next(&seed) % 512;
        uint64_t slot;
        int rc = pf_ring_reserve(f->ring, n, 0, &slot);
        CHECK(rc == PF_OK || rc == PF_EAGAIN);
        if (rc == PF_EAGAIN) {
            int64_t slice = wait_slice(&seed);
            while ((rc = pf_ring_reserve(f->ring, n, slice, &slot)) == PF_ETIMEDOUT) continue;
        }
        CHECK(rc == PF_OK);
        pf_block *b = pf_pool_get(f->pool, n + sizeof seq);
        CHECK(b);
        pf_copy_job job = {(char *)b->data + sizeof seq, pattern(seq), n};
        pf_copy_run(&f->copier, &job, 1);
        memcpy(b->data, &seq, sizeof seq);
        f->slots[slot] = b;
        f->slot_seq[slot] = n;
        pf_ring_publish(f->ring, n);
    }
    return NULL;
}

static void *fuzz_consumer(void *arg) {
    fuzz *f = arg;
    uint64_t seed = f->seed ^ 0x9e3779b97f4a7c15ull;
    for (uint64_t seq = 0; seq < f->n; seq++) {
        uint64_t slot;
        int rc = pf_ring_acquire(f->ring, 0, &slot);
        CHECK(rc == PF_OK || rc == PF_EAGAIN);
        if (rc == PF_EAGAIN) {
            int64_t slice = wait_slice(&seed);
            while ((rc = pf_ring_acquire(f->ring, slice, &slot)) == PF_ETIMEDOUT) continue;
        }
        CHECK(rc == PF_OK);
        pf_block *b = f->slots[slot];
        size_t n = f->slot_seq[slot];
        uint64_t got;
        memcpy(&got, b->data, sizeof got);
        CHECK(got == seq); /* in order, exactly once */
        const unsigned char *data = (const unsigned char *)b->data + sizeof got;
        for (size_t k = 0; k < n; k += 1 + k / 8) CHECK(data[k] == pattern(seq)[k]);
        f->slots[slot] = NULL;
        pf_ring_release(f->ring);
        if (rng_next(&seed) % 64 == 0) { /* now and then, let the producer fill up */
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
        pf_sync_lock(&f->ret_sync);
        f->ret[f->nret++] = b;
        pf_sync_broadcast(&f->ret_sync);
        pf_sync_unlock(&f->ret_sync);
    }
    pf_sync_lock(&f->ret_sync);
    f->consumer_done = 1;
    pf_sync_broadcast(&f->ret_sync);
    pf_sync_unlock(&f->ret_sync);
    return NULL;
}

static void *fuzz_returner(void *arg) {
    fuzz *f = arg;
    pf_sync_lock(&f->ret_sync);
    for (;;) {
        while (f->nret > 0) {
            pf_block *b = f->ret[--f->nret];
            pf_sync_unlock(&f->ret_sync);
            pf_pool_put(b);
            pf_sync_lock(&f->ret_sync);
        }
        if (f->consumer_done) break;
        pf_sync_wait(&f->ret_sync, 50 * MS);
    }
    pf_sync_unlock(&f->ret_sync);
    return NULL;
}

static void run_fuzz(uint64_t capacity, uint64_t max_bytes, int nhelpers, int64_t spin_ns, uint64_t n,
                     uint64_t seed) {
    fuzz f;
    memset(&f, 0, sizeof f);
    f.n = n;
    f.seed = seed;
    int rc;
    CHECK((f.ring = pf_ring_new(capacity, max_bytes, spin_ns, &rc)) != NULL && rc == PF_OK);
    CHECK((f.pool = pf_pool_new(8u << 20)) != NULL);
    CHECK(pf_copier_init(&f.copier, nhelpers) == PF_OK);
    CHECK(pf_sync_init(&f.ret_sync) == PF_OK);
    f.slots = calloc(capacity, sizeof *f.slots);
    f.slot_seq = calloc(capacity, sizeof *f.slot_seq);
    f.ret = calloc(n, sizeof *f.ret);
    CHECK(f.slots && f.slot_seq && f.ret);
    pthread_t prod, cons, ret;
    CHECK(pthread_create(&prod, NULL, fuzz_producer, &f) == 0);
    CHECK(pthread_create(&cons, NULL, fuzz_consumer, &f) == 0);
    CHECK(pthread_create(&ret, NULL, fuzz_returner, &f) == 0);
    CHECK(pthread_join(prod, NULL) == 0);
    CHECK(pthread_join(cons, NULL) == 0);
    CHECK(pthread_join(ret, NULL) == 0);
    pf_pool_stats s = pf_pool_get_stats(f.pool);
    CHECK(s.blocks_out == 0);
    CHECK(s.blocks_allocated + s.blocks_reused == n);
    CHECK(s.blocks_reused > 0);
    pf_ring_close(f.ring);
    pf_ring_delete(f.ring);
    pf_copier_fini(&f.copier);
    pf_pool_close(f.pool);
    pf_sync_fini(&f.ret_sync);
    free(f.slots);
    free(f.slot_seq);
    free(f.ret);
}

/* close() from another thread wakes a consumer blocked on an empty ring and
 * a producer blocked on a full one, both waiting with no deadline. */
static void *closer(void *arg) {
    struct timespec ts = {0, 5 * MS};
    CHECK(nanosleep(&ts, NULL) == 0);
    pf_ring_close(arg);
    return NULL;
}

static void test_close_wakes_waiters(int side) {
    pf_ring r;
    uint64_t slot = UNSET;
    pthread_t t;
    CHECK(pf_ring_init(&r, 1, 0, -1) == PF_OK);
    if (side == PF_PRODUCER) {
        CHECK(pf_ring_reserve(&r, 1, 0, &slot) == PF_OK);
        pf_ring_publish(&r, 1);
        slot = UNSET;
    }
    CHECK(pthread_create(&t, NULL, closer, &r) == 0);
    int rc = side == PF_PRODUCER ? pf_ring_reserve(&r, 1, INT64_MAX, &slot)
                                 : pf_ring_acquire(&r, INT64_MAX, &slot);
    CHECK(rc == PF_ECLOSED && slot == UNSET); /* returned at all: woken by close */
    CHECK(pthread_join(t, NULL) == 0);
    pf_ring_fini(&r);
}

static void *second_consumer(void *arg) {
    uint64_t slot;
    CHECK(pf_ring_acquire(arg, 0, &slot) == PF_OK); /* the slot main holds: a double hand-out */
    return NULL;
}

/* Misuse that a PF_DEBUG build must catch with an assert (tests/test_csrc.py
 * expects SIGABRT); returns normally in a release build. */
static void misuse(const char *name) {
    pf_ring r;
    uint64_t slot;
    CHECK(pf_ring_init(&r, 2, 0, 0) == PF_OK);
    if (strcmp(name, "release-without-acquire") == 0) {
        CHECK(pf_ring_reserve(&r, 1, 0, &slot) == PF_OK);
        pf_ring_publish(&r, 1);
        pf_ring_release(&r);
        pf_ring_release(&r);
    } else if (strcmp(name, "publish-without-reserve") == 0) {
        pf_ring_publish(&r, 1);
    } else if (strcmp(name, "two-consumers") == 0) {
        pthread_t t;
        CHECK(pf_ring_reserve(&r, 1, 0, &slot) == PF_OK);
        pf_ring_publish(&r, 1);
        CHECK(pf_ring_acquire(&r, 0, &slot) == PF_OK);
        CHECK(pthread_create(&t, NULL, second_consumer, &r) == 0);
        CHECK(pthread_join(t, NULL) == 0);
    } else {
        fprintf(stderr, "test_pf: unknown misuse %s\n", name);
        exit(2);
    }
    pf_ring_fini(&r);
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "misuse") == 0) {
        misuse(argv[2]);
        printf("test_pf: misuse not caught\n");
        return 0;
    }
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 20000;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : (uint64_t)time(NULL);
    printf("test_pf: n=%llu seed=%llu\n", (unsigned long long)n, (unsigned long long)seed);
    if (seed == 0) seed = 1;
    for (size_t k = 0; k < sizeof pattern_buf; k++) pattern_buf[k] = (unsigned char)(k * 7 + k / 251);
    test_ring_semantics();
    test_ring_max_bytes();
    test_pool_semantics();
    test_close_wakes_waiters(PF_CONSUMER);
    test_close_wakes_waiters(PF_PRODUCER);
    uint64_t s = seed;
    test_copier(0, &s);
    test_copier(1, &s);
    test_copier(3, &s);
    run_fuzz(1, 0, 0, 0, n, seed);            /* sleep-only waits */
    run_fuzz(4, 0, 1, -1, n, seed + 1);       /* spin, then sleep */
    run_fuzz(3, 1 << 20, 2, -1, n, seed + 2); /* with a byte cap */
    uint64_t pools, blocks;
    pf_pool_live(&pools, &blocks);
    CHECK(pools == 0 && blocks == 0 && pf_copier_live_threads() == 0);
    printf("test_pf: ok\n");
    return 0;
}
