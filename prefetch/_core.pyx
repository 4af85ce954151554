# cython: language_level=3, auto_pickle=False
# _core.pyx: the compiled core behind prefetch.Prefetcher and prefetch.Loader.
# It names no framework: numpy and the builtin containers are built in,
# everything else comes through prefetch.adapters.
#
# A stage produces (_stage.pxi): the fetch stage (_fetch.pxi) or a map
# stage's epoch (_map.pxi). The _Core here publishes: its one publisher
# thread reserves a ring slot (csrc/pf_ring.c), asks the stage for the next
# batch's parts, delivers them to the device (an adapter's Delivery),
# rebuilds the batch once and publishes it; the consumer takes it. The data
# path, one file per step: the table of docs/design.md.
# Threads: the publisher is the ring's one producer; any thread may call
# take() (several consumers are serialised: the fast path runs under the
# GIL, and only the holder of _consumer_lock waits for a slot without it);
# any thread may call close(): one tears down while holding _close_lock,
# another waits for it.
cimport cython
cimport numpy as cnp
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport PyThread_get_thread_ident
from libc.stdint cimport INT64_MAX, int64_t, uint64_t
from libc.stdlib cimport free, realloc, strtoll
from libc.stdio cimport snprintf
from libc.string cimport strrchr
from posix.fcntl cimport O_RDONLY
from posix.fcntl cimport open as c_open
from posix.time cimport clock_gettime, nanosleep, timespec
from posix.types cimport clockid_t
from posix.unistd cimport access as c_access
from posix.unistd cimport close as c_close
from posix.unistd cimport read as c_read


import dataclasses
import functools
import operator
import threading
import time
import weakref
from copy import copy as _shallow_copy

import numpy as np

from prefetch import _warn
from prefetch._options import article, kind_of, seconds, usable_cpus
from prefetch._types import ClosedError, GILBoundWarning, WorkerInfo

cnp.import_array()

# Blocking waits wake up this often to notice Ctrl-C, close() and timeouts
# (SPEC §4 asks for KeyboardInterrupt within 0.2 s).
cdef int64_t WAIT_SLICE_NS = 50 * 1000 * 1000
cdef double WAIT_SLICE_S = WAIT_SLICE_NS / 1e9
CLOSE_GRACE_S = 2.0

include "_errors.pxi"
include "_tree.pxi"
include "_pool.pxi"
include "_sole.pxi"
include "_copy.pxi"
include "_stage.pxi"
include "_batchcopy.pxi"
include "_fetch.pxi"
include "_thread_context.pxi"
include "_collate.pxi"
include "_assemble.pxi"
include "_stack.pxi"
include "_meter.pxi"
include "_gauge.pxi"
include "_epoch_batches.pxi"
include "_tune.pxi"
include "_threads.pxi"
include "_map.pxi"


# What the publisher is doing: (for a TimeoutError and close(), "it is ...";
# for the note of an error raised there, "while ..."). The stage's: its doing().
cdef tuple DOING_START = ("starting", None)
cdef tuple DOING_ROOM = ("waiting for room in the ring", None)
cdef tuple DOING_STAGE = (None, "assembling {batch}")
cdef tuple DOING_DELIVER = ("delivering to the device", "delivering {batch} to the device")
cdef tuple DOING_REBUILD = ("rebuilding a batch", "rebuilding {batch} with a registered container's unflatten")
cdef tuple DOING_DONE = ("finished", None)

cdef object _END = object()        # the slot after the last batch
cdef Py_ssize_t _live_cores = 0    # _Core objects not yet deallocated


def _live_counts():
    """What is alive process-wide: cores, pools, pool blocks, copy helper
    threads. Tests check these return to their baseline (leak checks)."""
    cdef uint64_t pools, blocks
    pf_pool_live(&pools, &blocks)
    return dict(cores=_live_cores, pools=pools, blocks=blocks,
                copy_threads=pf_copier_live_threads())


def _fork_epoch():
    """The process's fork epoch: another value in a child forked since."""
    return pf_fork_epoch()


@cython.final
cdef class _Core:
    """A stage's batches through a ring: its producer side, the one publisher
    thread, which asks the stage for each batch, delivers it to the device and
    publishes it; its consumer side, take() by any thread (several are served
    in turn); close() from any thread; stats. The threads reference only this
    object and its stage, never the object the user holds."""

    def __cinit__(self, _Stage stage not None, *, int depth, uint64_t max_bytes, name,
                  _Pool pool not None, str kind="prefetcher"):
        global _live_cores
        cdef int rc = PF_OK
        _live_cores += 1
        self._counted = True
        self._epoch = pf_fork_epoch()   # also installs the at-fork handler
        self._stage = stage
        self._parts = _Parts.__new__(_Parts)
        self._parts.max_bytes = max_bytes
        self._pool = pool
        self.name = name
        self.kind = kind
        self.depth = depth
        self._slots = [None] * depth
        self._warnings = []
        self._doing = DOING_START
        self._consumer_lock = threading.Lock()
        self._close_lock = threading.RLock()
        self._ring = self._parts.ring = pf_ring_new(depth, max_bytes, -1, &rc)
        _check_rc(rc, "the ring")

    def __dealloc__(self):
        global _live_cores
        if self._counted:   # False when argument conversion failed before __cinit__ ran
            _live_cores -= 1
        if self._epoch != pf_fork_epoch():
            # Forked child: the parent's threads are gone and its locks may be
            # held. Touch nothing; leaking a few structs beats a deadlock.
            return
        if self._ring != NULL:
            pf_ring_delete(self._ring)

    def start(self, on_thread=()):
        """Start the publisher thread; it calls each of ``on_thread`` first (the
        adapters' thread states, prefetch.adapters.register_thread_state)."""
        self._on_thread = tuple(on_thread)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self):
        cdef uint64_t nbytes
        cdef int got
        cdef _Stage stage = self._stage
        cdef _Parts parts = self._parts
        delivery = stage.device()
        _warn.relay_into(self._warnings)   # a source's warnings for the consumer (_warn.py)
        try:
            while True:
                self._doing = DOING_ROOM
                if not parts.room(0):   # a slot (a stage waits for its bytes before it makes them)
                    return
                try:
                    # The stage's next batch, delivered to the device and rebuilt.
                    self._doing = DOING_STAGE
                    got = self._apply_thread_states() if self._on_thread else stage.produce(parts)
                    if got == P_BATCH:
                        if delivery is not None:
                            self._doing = DOING_DELIVER
                            for i in parts.deliver:
                                parts.leaves[i] = delivery.deliver(parts.leaves[i])
                            delivery.ready()
                        self._doing = DOING_REBUILD
                        batch = _unflatten(parts.nodes, parts.leaves)
                except BaseException as exc:
                    # Code run here for this batch (a stage's conversion, a
                    # delivery, a container's unflatten: adapters' hooks) raised:
                    # its error takes the batch's place and the stream ends, as
                    # a source's error does. The publisher never dies silently.
                    if self._epoch != pf_fork_epoch():
                        raise   # a forked child on this thread's stack: its own exit
                    parts.clear()
                    if not self.closed:
                        self._publish(_Failure(_note_batch(
                            exc, "in " + _publisher_name(self.kind, self.name), self._doing[1],
                            self._produced + 1, True)), 0, False)
                    return
                if got == P_STOPPED:
                    return
                if got == P_END:
                    self._publish(_END, 0, False)
                    return
                if got == P_FAILED or got == P_BATCH_FAILED:
                    failure, stage.failure = stage.failure, None
                    self._publish(_Failure(failure, got == P_FAILED), 0, False)
                    failure = None
                    if got == P_FAILED:
                        return
                    continue
                nbytes = parts.nbytes
                parts.clear()
                self._publish(batch, nbytes, True)
                batch = None
        finally:
            self._doing = DOING_DONE
            _warn.relay_into(None)
            stage.finish()

    cdef int _apply_thread_states(self) except -1:
        """The creator's framework modes on this thread, then the first batch;
        an error here is the first batch's."""
        on_thread, self._on_thread = self._on_thread, None
        try:
            for apply in on_thread:
                apply()
        except BaseException as exc:
            self._stage.failure = _note_batch(exc, "in " + _publisher_name(self.kind, self.name),
                                              "applying the creating thread's framework settings, "
                                              "before {batch}", 1)
            return P_FAILED
        return self._stage.produce(self._parts)

    cdef void _publish(self, object item, uint64_t nbytes, bint is_batch):
        """``item`` into the slot reserved (parts.room) and out to the consumer."""
        cdef uint64_t fill
        if self.closed:
            return  # close() already emptied the slots; don't refill one
        self._slots[self._parts.slot] = item
        if is_batch:
            self._produced += 1
        pf_ring_publish(self._ring, nbytes)
        fill = self._produced - self.consumed
        if fill > self._peak_fill:
            self._peak_fill = fill

    def _doing_text(self, thread=None):
        return self._stage.doing() if self._doing is DOING_STAGE else self._doing[0]

    # -- consumer -----------------------------------------------------------

    cpdef object take(self, object timeout=None):
        """The next batch; StopIteration at the end; the source's error in its place."""
        cdef uint64_t slot = 0
        cdef uint64_t nbytes
        if self._epoch != pf_fork_epoch():
            raise RuntimeError(
                f"{self.kind} {self.name!r} was inherited through os.fork(); its threads "
                f"exist only in the parent process. Create a new {self.kind} in the child.")
        if self.closed:
            if self._replaced:
                raise StopIteration   # its epoch ended when a newer one started
            raise ClosedError(f"{self.kind} {self.name!r} is closed")
        if self.ended:
            raise StopIteration
        if self._warnings:
            _warn.deliver(self._warnings)   # at the user's line; nothing is taken yet
        self._stage.before_take()
        # Only while no other consumer waits in pf_ring_acquire without the
        # GIL: one thread per side holds a slot (pf_ring.h).
        if self._acquirer or pf_ring_acquire(self._ring, 0, &slot) != PF_OK:
            slot = self._wait_batch(timeout)
        item = self._slots[slot]
        self._slots[slot] = None
        nbytes = pf_ring_release(self._ring)
        if item is _END:
            self.ended = True
            raise StopIteration
        if type(item) is _Failure:
            if (<_Failure>item).ends:
                self.ended = True
            else:
                self.failed += 1
                self._stage.taken(0)   # in the place of its batch: counted as taken
            raise (<_Failure>item).exc
        self.consumed += 1
        self._stage.taken(nbytes)
        return item

    cdef object _closed_while_waiting(self):
        """What a consumer waiting on this core meets once it is closed: the end
        of its epoch where a newer epoch replaced it, else ClosedError."""
        if self._replaced:
            return StopIteration()
        return ClosedError(f"{self.kind} {self.name!r} was closed while waiting")

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
        if threading.current_thread() is self._thread or self._stage.on_own_thread():
            # The stage's code (a source, a dataset) calling next() on its own
            # prefetcher would wait for the threads that produce the batch: itself.
            raise RuntimeError(f"next() on {self.kind} {self.name!r} called from one of its own "
                               f"threads (while it was {self._doing_text()}); it would wait for "
                               "itself forever")
        if self._acquirer == PyThread_get_thread_ident():
            # A signal handler (or a callback) inside a next() that holds the
            # consumer lock: that lock is not re-entrant, and the slot it waits
            # for is the outer call's.
            raise RuntimeError(f"next() on {self.kind} {self.name!r} called while the same thread "
                               "already waits in next() (from a signal handler?); it would wait "
                               "for itself forever")
        # One consumer at a time waits in pf_ring_acquire without the GIL (it
        # hands the slot to its caller alone); other threads calling next()
        # meanwhile queue on this lock, as on a queue.Queue's.
        lock = self._consumer_lock
        while not lock.acquire(True, WAIT_SLICE_S):   # releases the GIL while it waits
            PyErr_CheckSignals()
            if self.ended:
                # Another consumer took the end; the next epoch may have closed this core since.
                raise StopIteration
            if self.closed:
                raise self._closed_while_waiting()
            if timeout is not None and pf_now_ns() >= deadline:
                raise TimeoutError(f"no batch from {self.kind} {self.name!r} within {timeout} s; "
                                   "another thread was waiting for one")
        self._acquirer = PyThread_get_thread_ident()
        try:
            if self.ended:
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
                    raise self._closed_while_waiting()
                if rc == PF_OK:
                    # A signal that came while this thread waited (Ctrl-C) is
                    # raised here, before the batch is taken (it stays for the
                    # next take), not in the caller's frame once it holds it.
                    PyErr_CheckSignals()
                    if self.closed:   # by that signal's handler
                        raise self._closed_while_waiting()
                    return slot
                if self.ended:
                    raise StopIteration   # another consumer thread took the end
                if rc != PF_ETIMEDOUT and rc != PF_EAGAIN:   # EAGAIN: the deadline had passed
                    _check_ring(rc, "waiting for a batch")
                PyErr_CheckSignals()   # raises KeyboardInterrupt; nothing was taken
                if self.closed:   # by a signal handler just now, or by another thread
                    raise self._closed_while_waiting()
                if timeout is not None and pf_now_ns() >= deadline:
                    raise TimeoutError(
                        f"no batch from {self.kind} {self.name!r} within {timeout} s; it is "
                        f"{self._doing_text()} (batch {self._produced + 1}, counted from 1)")
                if self._thread is None or not self._thread.is_alive():
                    # The publisher publishes before it exits; re-check once so
                    # a batch published just before its exit is not missed.
                    rc = pf_ring_acquire(self._ring, 0, &slot)
                    if self.closed:   # meanwhile: is_alive() may switch threads
                        raise self._closed_while_waiting()
                    if rc == PF_OK:
                        return slot
                    raise RuntimeError(f"the publisher thread of {self.kind} {self.name!r} is not running "
                                       "(it died or never started); no batch can come")
        finally:
            self._acquirer = 0
            lock.release()
            self._consumer_wait_ns += pf_now_ns() - t0

    # -- lifecycle ----------------------------------------------------------

    def end_replaced(self):
        """The owner started a newer epoch: this one closes, and its consumers
        meet the end of their epoch (StopIteration), not ClosedError: the
        owner is open."""
        self._replaced = True
        self.close()

    def close(self, double grace=CLOSE_GRACE_S, at=None):
        """Stop the publisher and its stage, drop unconsumed batches.

        Idempotent, and returns only once the teardown is complete (or the
        publisher, stuck in its stage, was warned about), whichever close()
        does it: another thread's close() waits for it. A close() cut short
        (Ctrl-C during the join) leaves the rest to the next close(). A thread
        still busy after ``grace`` s is warned about at ``at`` (filename, line:
        where a finalizer's prefetcher was created), else at the user's line.
        The pool and the device delivery are not the core's: their holders close them."""
        if self._torn_down:
            return
        self.closed = True
        if self._epoch != pf_fork_epoch():
            # Forked child: the parent's threads and locks are not this process's.
            self._slots = [None] * self.depth
            return
        if threading.current_thread() is self._thread:
            # The publisher (a source closing its prefetcher): another close()
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
        interruption. What the stage copied is the owner's to release (the
        adapters' close hooks run when the owner closes the stage's parts)."""
        pf_ring_close(self._ring)
        self._stage.stop()   # a stage waiting for work stops waiting
        _join_or_warn((self._thread,), grace, f"{self.kind} {self.name!r}", self._doing_text, at)
        if self._torn_down:
            return   # a signal handler's close() finished it during the join
        self._slots = [None] * self.depth
        self._torn_down = True

    def stats(self):
        """The core's and its stage's fields of Stats, as a dict."""
        cdef pf_pool_stats ps = self._pool.stats()
        return dict(
            produced=self._produced,
            consumed=self.consumed,
            consumer_wait_s=self._consumer_wait_ns / 1e9,
            producer_wait_s=self._parts.wait_ns / 1e9,
            fill=self.fill,
            peak_fill=self._peak_fill,
            depth=self.depth,
            blocks_allocated=ps.blocks_allocated,
            blocks_reused=ps.blocks_reused,
            **self._stage.counts(),
        )

    @property
    def fill(self):
        return self._produced - self.consumed if not self.closed else 0

    @property
    def state(self):
        if self.closed:
            return "closed"
        if self.ended:
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


