# cython: language_level=3, auto_pickle=False
# _core.pyx: the compiled core behind prefetch.Prefetcher. It names no
# framework: numpy and the builtin containers are built in, everything else
# comes through prefetch.adapters.
#
# Data path, one file per step: source -> fetch thread (_Core._run, here) ->
# tree walk (_tree.pxi) -> copy plan and memcpy without the GIL (_copy.pxi,
# csrc/pf_copy.c) into pool blocks (csrc/pf_pool.c) -> device delivery (an
# adapter's Delivery) -> ring slot (csrc/pf_ring.c) -> consumer (_Core.take).
# Threads: one fetch thread calls next(source) and copies; the consumer calls
# take(); any thread may call close(). Several consumer threads are
# serialised: the fast path runs under the GIL, and only the holder of
# _consumer_lock waits for a slot without it. One close() tears down while
# holding _close_lock; another one waits for it to finish.
cimport cython
cimport numpy as cnp
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport PyThread_get_thread_ident
from libc.stdint cimport INT64_MAX, int64_t, uint64_t
from libc.stdlib cimport free, realloc

import dataclasses
import functools
import operator
import threading
import time
import warnings
import weakref
from copy import copy as _shallow_copy

import numpy as np

from prefetch import _warn
from prefetch._types import ClosedError, WorkerInfo

cnp.import_array()

# Blocking waits wake up this often to notice Ctrl-C, close() and timeouts
# (SPEC §4 asks for KeyboardInterrupt within 0.2 s).
cdef int64_t WAIT_SLICE_NS = 50 * 1000 * 1000
cdef double WAIT_SLICE_S = WAIT_SLICE_NS / 1e9
CLOSE_GRACE_S = 2.0

include "_errors.pxi"
include "_tree.pxi"
include "_pool.pxi"
include "_copy.pxi"
include "_collate.pxi"
include "_map.pxi"


cdef enum Doing:
    DOING_START
    DOING_ROOM
    DOING_NEXT
    DOING_COPY
    DOING_DELIVER
    DOING_DONE

_DOING = {
    DOING_START: "starting",
    DOING_ROOM: "waiting for room in the ring",
    DOING_NEXT: "waiting in next(source)",
    DOING_COPY: "copying",
    DOING_DELIVER: "delivering to the device",
    DOING_DONE: "finished",
}

cdef object _END = object()        # the slot after the last batch
cdef Py_ssize_t _live_cores = 0    # _Core objects not yet deallocated


def _live_counts():
    """What is alive process-wide: cores, pools, pool blocks, copy helper
    threads. Tests check these return to their baseline (leak checks)."""
    cdef uint64_t pools, blocks
    pf_pool_live(&pools, &blocks)
    return dict(cores=_live_cores, pools=pools, blocks=blocks,
                copy_threads=pf_copier_live_threads())


@cython.final
cdef class _Core:
    def __cinit__(self, source, int depth, int workers, uint64_t max_bytes, name, delivery,
                  bint handover=True, _Pool pool=None, bint owned=False, wake=None, describe=None):
        global _live_cores
        cdef int rc = PF_OK
        _live_cores += 1
        self._counted = True
        self._copier_ok = False
        self._pool = NULL
        self._epoch = pf_fork_epoch()   # also installs the at-fork handler
        self._source = source
        self._delivery = delivery
        self._owned = owned
        self._wake = wake
        self._describe = describe
        self._consumer_lock = threading.Lock()
        self._close_lock = threading.RLock()
        self.name = name
        self.depth = depth
        self.workers = workers
        self._max_bytes = max_bytes
        self._handover = handover
        self._slots = [None] * depth
        self._doing = DOING_START
        self._ring = pf_ring_new(depth, max_bytes, -1, &rc)
        _check_rc(rc, "the ring")
        self._own_pool = pool is None
        self._pool_obj = _Pool() if pool is None else pool
        self._pool = self._pool_obj.p
        self._plan = CopyPlan.__new__(CopyPlan)
        self._plan._pool = self._pool
        self._plan.device = delivery
        self._plan._trusted = owned
        _check_rc(pf_copier_init(&self._copier, workers - 1), "the copy threads")
        self._copier_ok = True

    def __dealloc__(self):
        global _live_cores
        if self._counted:   # False when argument conversion failed before __cinit__ ran
            _live_cores -= 1
        if self._epoch != pf_fork_epoch():
            # Forked child: the parent's threads are gone and its locks may be
            # held. Touch nothing; leaking a few structs beats a deadlock.
            return
        if self._copier_ok:
            pf_copier_fini(&self._copier)
        if self._ring != NULL:
            pf_ring_delete(self._ring)
        if self._own_pool and self._pool_obj is not None:
            self._pool_obj.close()

    def start(self, on_thread=()):
        """Start the fetch thread; it calls each of ``on_thread`` first (the
        adapters' thread states, prefetch.adapters.register_thread_state)."""
        self._on_thread = tuple(on_thread)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    # -- fetch thread -------------------------------------------------------

    def _run(self):
        cdef uint64_t slot = 0
        cdef uint64_t n = 0
        self._worker_ident = threading.get_ident()
        try:
            while True:
                self._batch_no = n
                self._doing = DOING_ROOM
                if not self._wait_room(0, &slot):
                    return
                self._doing = DOING_NEXT
                try:
                    if self._on_thread:
                        on_thread, self._on_thread = self._on_thread, None
                        for apply in on_thread:
                            apply()
                    item = next(self._source)
                except (StopIteration, GeneratorExit):
                    if self._epoch == pf_fork_epoch():
                        self._publish(slot, _END, 0, False)
                    return
                except _Closing:
                    return   # close() woke a loader's stage
                except _Noted as noted:
                    # A loader's stage has named the sample, batch and thread.
                    self._publish(slot, _Failure(noted.exc), 0, False)
                    return
                except BaseException as exc:
                    if self._epoch != pf_fork_epoch():
                        raise   # in a child forked inside the source: its own exception (sys.exit())
                    self._fail(slot, exc, n, "fetching")
                    return
                if self._epoch != pf_fork_epoch():
                    # The source forked and this is the child, on the worker's
                    # stack: the ring, the pool and the copy helpers belong to
                    # the parent's threads (their locks may be held there for
                    # ever). Touch none of them; this thread, the child's only
                    # one, ends here.
                    return
                self._doing = DOING_COPY
                try:
                    batch = self._copy_batch(item)
                    # Drop the source's object before the next next(source):
                    # a source that refills one buffer may check it is free.
                    item = None
                except BaseException as exc:
                    if not self.closed:
                        self._fail(slot, exc, n, "copying")
                    return
                if self._max_bytes and not self._wait_room(self._plan.nbytes, &slot):
                    return
                self._publish(slot, batch, self._plan.nbytes, True)
                batch = None
                n += 1
        finally:
            self._doing = DOING_DONE
            self._source = None
            # In a forked child the copy helpers do not exist (and their
            # condition variables still count the parent's waiters): no fini.
            if self._copier_ok and self._epoch == pf_fork_epoch():
                self._copier_ok = False
                with nogil:
                    pf_copier_fini(&self._copier)

    def _fail(self, uint64_t slot, exc, uint64_t n, what):
        try:
            _add_note(exc, f"raised in prefetch worker {self.name!r} while {what} batch {n + 1} "
                           f"(counted from 1: the {n} before it are delivered first)")
        except Exception:
            pass  # an exception type that refuses notes is still delivered
        self._publish(slot, _Failure(exc), 0, False)

    cdef bint _wait_room(self, uint64_t nbytes, uint64_t *slot) except -1:
        """Wait for a free slot (and room under max_bytes); False once closed."""
        cdef int rc = pf_ring_reserve(self._ring, nbytes, 0, slot)
        cdef int64_t t0
        if rc == PF_EAGAIN:
            t0 = pf_now_ns()
            rc = PF_ETIMEDOUT
            while rc == PF_ETIMEDOUT:   # the GIL is taken between slices, as before
                with nogil:
                    rc = pf_ring_reserve(self._ring, nbytes, WAIT_SLICE_NS, slot)
            self._producer_wait_ns += pf_now_ns() - t0
        if rc == PF_ECLOSED:
            return False
        _check_ring(rc, "waiting for room")
        return True

    cdef void _publish(self, uint64_t slot, object item, uint64_t nbytes, bint is_batch):
        cdef uint64_t fill
        if self.closed:
            return  # close() already emptied the slots; don't refill one
        self._slots[slot] = item
        if is_batch:
            self._produced += 1
        pf_ring_publish(self._ring, nbytes)
        fill = self._produced - self._consumed
        if fill > self._peak_fill:
            self._peak_fill = fill

    # -- copying ------------------------------------------------------------

    cdef object _copy_batch(self, object item):
        """The fresh copy of ``item``: walk, copy (or hand over), deliver, rebuild.

        ``item`` is what next(source) returned; _run's variable is its one
        reference here when the source kept none (a cdef argument is borrowed),
        which is what plan._find_sole counts on (the hand-over rule)."""
        cdef CopyPlan plan = self._plan
        cdef list leaves = []
        cdef Py_ssize_t i
        cdef uint64_t copied
        if self._owned and self._delivery is None:
            return item   # collated into pooled memory by a loader: already only ours
        plan._reset()
        if self._handover and not self._owned:
            plan._find_sole(<PyObject *>item)
        nodes = _flatten(item, plan, leaves)
        plan._run(&self._copier)
        if self._delivery is not None:
            self._doing = DOING_DELIVER
            for i in plan._deliver_idx:
                leaves[i] = self._delivery.deliver(leaves[i])
            self._delivery.ready()
        copied = plan.nbytes - plan.handed_bytes   # adapters add to nbytes what they copy
        self._bytes_copied += copied
        self._bytes_handed += plan.handed_bytes
        self._leaves_copied += plan.copied_leaves
        self._leaves_handed += plan.handed_leaves
        if copied > self._max_batch_bytes and self._pool != NULL and not self._owned:
            # Keep enough free blocks for the ring, the batch being filled and
            # a few the user holds, of mixed sizes (blocks are binned by size
            # class): 2 x (depth + 2) of the largest batch. With 1x, bench/soak.py
            # (4 shapes, 3 batches held) re-allocated 1.3% of blocks for ever;
            # with 2x, 3 blocks in 21,730 batches. A dropped hoard is still freed.
            self._max_batch_bytes = copied
            pf_pool_set_keep(self._pool, 2 * (self.depth + 2) * copied)
        return _unflatten(nodes, leaves)

    # -- consumer -----------------------------------------------------------

    cdef _check_usable(self):
        if self._epoch != pf_fork_epoch():
            raise RuntimeError(
                f"prefetcher {self.name!r} was inherited through os.fork(); its threads "
                "exist only in the parent process. Create a new Prefetcher in the child.")
        if self.closed:
            raise ClosedError(f"prefetcher {self.name!r} is closed")

    cpdef object take(self, object timeout=None):
        """The next batch; StopIteration at the end; the source's error in its place."""
        cdef uint64_t slot = 0
        self._check_usable()
        if self._ended:
            raise StopIteration
        # Only while no other consumer waits in pf_ring_acquire without the
        # GIL: one thread per side holds a slot (pf_ring.h).
        if self._acquirer or pf_ring_acquire(self._ring, 0, &slot) != PF_OK:
            slot = self._wait_batch(timeout)
        item = self._slots[slot]
        self._slots[slot] = None
        pf_ring_release(self._ring)
        if item is _END:
            self._ended = True
            raise StopIteration
        if type(item) is _Failure:
            self._ended = True
            raise (<_Failure>item).exc
        self._consumed += 1
        return item

    cdef uint64_t _wait_batch(self, object timeout) except? 0xFFFFFFFFFFFFFFFF:
        cdef uint64_t slot = 0
        cdef int rc
        cdef int64_t t0 = pf_now_ns(), deadline = 0, wait_ns
        cdef double timeout_ns
        if timeout is not None:
            timeout_ns = float(timeout) * 1e9
            if timeout_ns >= <double>(INT64_MAX - t0):
                timeout = None   # centuries: no deadline (and no int64 overflow)
            else:
                deadline = t0 + <int64_t>timeout_ns
        if threading.get_ident() == self._worker_ident:
            # A source calling next() on its own prefetcher would wait for
            # the one thread that can produce the batch: itself.
            raise RuntimeError(f"next() on prefetcher {self.name!r} called from its own worker "
                               "thread (inside next(source)); it would wait for itself forever")
        if self._acquirer == PyThread_get_thread_ident():
            # A signal handler (or a callback) inside a next() that holds the
            # consumer lock: that lock is not re-entrant, and the slot it waits
            # for is the outer call's.
            raise RuntimeError(f"next() on prefetcher {self.name!r} called while the same thread "
                               "already waits in next() (from a signal handler?); it would wait "
                               "for itself forever")
        # One consumer at a time waits in pf_ring_acquire without the GIL (it
        # hands the slot to its caller alone); other threads calling next()
        # meanwhile queue on this lock, as on a queue.Queue's.
        lock = self._consumer_lock
        while not lock.acquire(True, WAIT_SLICE_S):   # releases the GIL while it waits
            PyErr_CheckSignals()
            if self._ended:
                # Another consumer took the end; the next epoch may have closed this core since.
                raise StopIteration
            if self.closed:
                raise ClosedError(f"prefetcher {self.name!r} was closed while waiting")
            if timeout is not None and pf_now_ns() >= deadline:
                raise TimeoutError(f"no batch from prefetcher {self.name!r} within {timeout} s; "
                                   "another thread was waiting for one")
        self._acquirer = PyThread_get_thread_ident()
        try:
            if self._ended:
                raise StopIteration   # another consumer thread took the end meanwhile
            while True:
                wait_ns = WAIT_SLICE_NS
                if timeout is not None:
                    wait_ns = min(wait_ns, max(deadline - pf_now_ns(), 0))
                with nogil:
                    rc = pf_ring_acquire(self._ring, wait_ns, &slot)
                if rc == PF_ECLOSED or self.closed:
                    # closed: close() may have emptied the slot we were handed
                    # while we waited for the GIL; it goes with the ring.
                    raise ClosedError(f"prefetcher {self.name!r} was closed while waiting")
                if rc == PF_OK:
                    return slot
                if self._ended:
                    raise StopIteration   # another consumer thread took the end
                if rc != PF_ETIMEDOUT and rc != PF_EAGAIN:   # EAGAIN: the deadline had passed
                    _check_ring(rc, "waiting for a batch")
                PyErr_CheckSignals()   # raises KeyboardInterrupt; nothing was taken
                if self.closed:   # by a signal handler just now, or by another thread
                    raise ClosedError(f"prefetcher {self.name!r} was closed while waiting")
                if timeout is not None and pf_now_ns() >= deadline:
                    doing = _DOING[self._doing] if self._describe is None else self._describe()
                    raise TimeoutError(
                        f"no batch from prefetcher {self.name!r} within {timeout} s; its "
                        f"worker is {doing} (batch {self._batch_no + 1}, counted from 1)")
                if self._thread is None or not self._thread.is_alive():
                    # The worker publishes before it exits; re-check once so
                    # a batch published just before its exit is not missed.
                    rc = pf_ring_acquire(self._ring, 0, &slot)
                    if self.closed:   # meanwhile: is_alive() may switch threads
                        raise ClosedError(f"prefetcher {self.name!r} was closed while waiting")
                    if rc == PF_OK:
                        return slot
                    raise RuntimeError(f"the worker of prefetcher {self.name!r} is not running "
                                       "(it died or never started); no batch can come")
        finally:
            self._acquirer = 0
            lock.release()
            self._consumer_wait_ns += pf_now_ns() - t0

    # -- lifecycle ----------------------------------------------------------

    def close(self, double grace=CLOSE_GRACE_S, at=None):
        """Stop the fetch thread, drop unconsumed batches, free the pool.

        Idempotent, and returns only once the teardown is complete (or the
        worker, stuck in the source, was warned about), whichever close()
        does it: another thread's close() waits for it. A close() cut short
        (Ctrl-C during the join) leaves the rest to the next close(). A worker
        still busy after ``grace`` s is warned about at ``at`` (filename, line:
        where a finalizer's prefetcher was created), else at the user's line."""
        if self._torn_down:
            return
        self.closed = True
        if self._epoch != pf_fork_epoch():
            # Forked child: the parent's threads and locks are not this process's.
            self._slots = [None] * self.depth
            return
        if threading.current_thread() is self._thread:
            # The worker (a source closing its prefetcher): another close()
            # may be joining this very thread; waiting for it would only
            # spend its grace period.
            if not self._close_lock.acquire(False):
                return
        else:
            # Re-entrant: a signal handler's close() inside this thread's
            # close() finishes the teardown rather than wait for the outer one.
            self._close_lock.acquire()
        try:
            if not self._torn_down:
                self._tear_down(grace, at)
        finally:
            self._close_lock.release()

    cdef _tear_down(self, double grace, at):
        """close()'s work, under _close_lock. Each step may run again after an
        interruption, and does nothing twice (hooks, pool)."""
        pf_ring_close(self._ring)
        if self._wake is not None:
            self._wake()   # a loader's stage: its fetch thread waits there, not in the ring
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(grace)
            if self._torn_down:
                return   # a signal handler's close() finished it during the join
            if thread.is_alive():
                _warn.warn(
                    f"prefetcher {self.name!r}: the worker is still {_DOING[self._doing]} "
                    f"after {grace} s; it is left as a daemon thread and exits when that returns",
                    RuntimeWarning, at)
        self._slots = [None] * self.depth
        if self._close_hooks is None:
            # Each adapter used returns the memory behind the dropped batches
            # (e.g. an engine sync), once: the same hook is in the set once.
            # (The device delivery belongs to the owner, closed once by it.)
            self._close_hooks = set(self._plan.closers)
        try:
            while self._close_hooks:
                self._close_hooks.pop()()   # popped first: run once, even if interrupted
        finally:
            self._plan._pool = NULL
            self._pool = NULL
            if self._own_pool:
                self._pool_obj.close()
        self._torn_down = True

    def stats(self):
        cdef pf_pool_stats ps = self._pool_obj.stats()
        return dict(
            produced=self._produced,
            consumed=self._consumed,
            bytes_copied=self._bytes_copied,
            leaves_copied=self._leaves_copied,
            bytes_handed_over=self._bytes_handed,
            leaves_handed_over=self._leaves_handed,
            consumer_wait_s=self._consumer_wait_ns / 1e9,
            producer_wait_s=self._producer_wait_ns / 1e9,
            fill=self._produced - self._consumed if not self.closed else 0,
            peak_fill=self._peak_fill,
            depth=self.depth,
            blocks_allocated=ps.blocks_allocated,
            blocks_reused=ps.blocks_reused,
        )

    @property
    def fill(self):
        return self._produced - self._consumed if not self.closed else 0

    @property
    def state(self):
        if self.closed:
            return "closed"
        if self._ended:
            return "ended"
        return "running"


cdef class _Iterator:
    """Base class of prefetch.Prefetcher: the iterator protocol in C, since a
    Python-level __next__ costs about as much as the whole hand-off."""

    def __iter__(self):
        return self

    def __next__(self):
        # A reference of its own: another thread (or a signal handler) may
        # start the next epoch while take() waits, replacing and freeing
        # self._core; that take() then ends as its epoch did (StopIteration).
        cdef _Core core = self._core
        if core is None:
            core = self._first_core()
        return core.take(self._timeout)

    def _first_core(self):
        """The core to take from when none was started (a subclass may start one)."""
        raise ValueError(f"{type(self).__name__}.__init__ did not complete")


