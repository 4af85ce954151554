# cython: language_level=3
# _ring.pyx: the compiled core behind prefetch.Prefetcher.
#
# Threads: one fetch thread (a Python thread running _Core._run) calls
# next(source), copies the batch into pool blocks (the memcpy without the GIL,
# split across the C copier's helpers) and publishes it to the ring; the
# consumer calls _Core.take(); any thread may call _Core.close(). Consumers are
# serialised by the GIL: a slot is only taken while the GIL is held.
cimport cython
cimport numpy as cnp
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport INT64_MAX, int64_t, uint64_t
from libc.stdlib cimport free, realloc

import dataclasses
import threading
import warnings

import numpy as np

from prefetch._types import ClosedError

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    # dtype flag: the items hold references (object fields, StringDType).
    enum: NPY_ITEM_REFCOUNT
    # Cython's numpy.pxd leaves this one out; it steals a reference to descr.
    object PyArray_NewFromDescr(object subtype, cnp.PyArray_Descr *descr, int nd,
                                cnp.npy_intp *dims, cnp.npy_intp *strides, void *data,
                                int flags, object obj)
    void Py_INCREF_Descr "Py_INCREF"(cnp.PyArray_Descr *)

# Blocking waits wake up this often to notice Ctrl-C, close() and timeouts
# (SPEC §4 asks for KeyboardInterrupt within 0.2 s).
cdef int64_t WAIT_SLICE_NS = 50 * 1000 * 1000
# Below this, releasing the GIL (and waking the other thread that wants it)
# costs more than the memcpy itself; numpy draws the same line.
cdef size_t NOGIL_MIN_BYTES = 1 << 16
CLOSE_GRACE_S = 2.0
# How long a wait spins (without the GIL) before it sleeps; -1: the C default
# (50 us, 0 on one CPU). Read when a prefetcher is created; bench/ compares.
cdef int64_t _spin_ns = -1


def set_spin_ns(int64_t ns):
    """Spin budget for prefetchers created from now on (-1: default, 0: never spin)."""
    global _spin_ns
    _spin_ns = ns

cdef enum Doing:
    DOING_START
    DOING_ROOM
    DOING_NEXT
    DOING_COPY
    DOING_FINISH
    DOING_DONE

_DOING = {
    DOING_START: "starting",
    DOING_ROOM: "waiting for room in the ring",
    DOING_NEXT: "waiting in next(source)",
    DOING_COPY: "copying",
    DOING_FINISH: "delivering to the device",
    DOING_DONE: "finished",
}


cdef class _Block:
    def __cinit__(self):
        self.blk = NULL

    def __dealloc__(self):
        if self.blk != NULL:
            pf_pool_put(self.blk)


cdef class _Failure:
    # An exception from the fetch thread, in the slot where its batch would be.
    cdef readonly object exc

    def __cinit__(self, exc):
        self.exc = exc


cdef object _END = object()        # the slot after the last batch
cdef Py_ssize_t _live_cores = 0    # _Core objects not yet deallocated


def _live_counts():
    """What is alive process-wide: cores, pools, pool blocks, copy helper
    threads. Tests check these return to their baseline (leak checks)."""
    cdef uint64_t pools, blocks
    pf_pool_live(&pools, &blocks)
    return dict(cores=_live_cores, pools=pools, blocks=blocks,
                copy_threads=pf_copier_live_threads())


class _Closing(Exception):
    """Raised inside the fetch thread when close() pulled the pool away."""


# ---------------------------------------------------------------------------
# Batch structure: which types are containers and how to rebuild them.

cdef enum Kind:
    K_PASS          # a plain leaf: handed out as the same object
    K_ARRAY         # exactly numpy.ndarray
    K_ARRAY_SUB     # an ndarray subclass
    K_LEAF          # registered leaf type (e.g. mx NDArray)
    K_TUPLE
    K_LIST
    K_DICT
    K_NAMEDTUPLE
    K_TUPLE_SUB
    K_LIST_SUB
    K_DICT_SUB
    K_DATACLASS
    K_CONTAINER     # registered container type (e.g. mx DataBatch)

cdef dict _leaf_handlers = {}       # type -> fn(leaf, copy_array)
cdef dict _container_handlers = {}  # type -> fn(obj, recurse)
cdef dict _kinds = {}               # type -> (kind, handler); cleared on register
cdef bint _mx_imported = False     # prefetch.mx imported: its handlers are registered


def register_leaf(cls, fn):
    """Copy leaves of type ``cls`` (and subclasses) with ``fn(leaf, copy_array)``.

    ``copy_array(a)`` returns a fresh pool-backed copy of the numpy array ``a``
    whose bytes are filled in later in the same batch (without the GIL), so
    ``fn`` may wrap it but must not read it. Called on the fetch thread.
    """
    _leaf_handlers[cls] = fn
    _kinds.clear()


def register_container(cls, fn):
    """Rebuild containers of type ``cls`` with ``fn(obj, recurse)``."""
    _container_handlers[cls] = fn
    _kinds.clear()


cdef tuple _classify(type t):
    global _mx_imported
    for cls, fn in _leaf_handlers.items():
        if issubclass(t, cls):
            return (K_LEAF, fn)
    for cls, fn in _container_handlers.items():
        if issubclass(t, cls):
            return (K_CONTAINER, fn)
    if issubclass(t, cnp.ndarray):
        return (K_ARRAY_SUB, None)
    if issubclass(t, tuple):
        if hasattr(t, "_fields") and hasattr(t, "_make"):
            return (K_NAMEDTUPLE, None)
        return (K_TUPLE_SUB, None)
    if issubclass(t, list):
        return (K_LIST_SUB, None)
    if issubclass(t, dict):
        return (K_DICT_SUB, None)
    if dataclasses.is_dataclass(t):
        return (K_DATACLASS, None)
    if not _mx_imported and (t.__module__ or "").split(".")[0] == "mxnet":
        # An MXNet object: its handlers live in prefetch.mx, which registers
        # them on import. MXNet is importable (this is its object), so if
        # prefetch.mx fails, raise rather than hand the object out uncopied.
        import prefetch.mx  # noqa: F401
        _mx_imported = True
        return _classify(t)
    return (K_PASS, None)


cdef inline tuple _kind_of(object obj):
    cdef type t = type(obj)
    found = _kinds.get(t)
    if found is None:
        found = _classify(t)
        _kinds[t] = found
    return <tuple>found


cdef class _TreeMap:
    cpdef object walk(self, object obj):
        """Return ``obj`` rebuilt with every leaf replaced by ``self._leaf``."""
        cdef type t = type(obj)
        # The common containers first, without a dictionary lookup.
        if t is cnp.ndarray:
            return self._leaf(obj, K_ARRAY, None)
        if t is tuple:
            return tuple([self.walk(x) for x in <tuple>obj])
        if t is list:
            return [self.walk(x) for x in <list>obj]
        if t is dict:
            return {k: self.walk(v) for k, v in (<dict>obj).items()}
        kind, handler = _kind_of(obj)
        return self._walk_other(obj, kind, handler)

    cdef object _walk_other(self, object obj, int kind, object handler):
        if kind == K_PASS or kind == K_ARRAY_SUB or kind == K_LEAF:
            return self._leaf(obj, kind, handler)
        if kind == K_NAMEDTUPLE:
            return type(obj)._make([self.walk(x) for x in obj])
        if kind == K_TUPLE_SUB:
            return type(obj)([self.walk(x) for x in obj])
        if kind == K_CONTAINER:
            return handler(obj, self.walk)
        # Subclassed lists and dicts, and dataclasses: a shallow copy keeps the
        # type and any extra state (default_factory, non-field attributes);
        # then every element is replaced.
        new = _shallow_copy(obj)
        if kind == K_LIST_SUB:
            new[:] = [self.walk(x) for x in obj]
        elif kind == K_DICT_SUB:
            for k, v in obj.items():
                new[k] = self.walk(v)
        elif kind == K_DATACLASS:
            for f in dataclasses.fields(obj):
                # object.__setattr__ also works on frozen dataclasses.
                object.__setattr__(new, f.name, self.walk(getattr(obj, f.name)))
        return new

    cdef object _leaf(self, object obj, int kind, object handler):
        return obj


from copy import copy as _shallow_copy


cdef class _FnMap(_TreeMap):
    cdef object _fn

    def __cinit__(self, fn):
        self._fn = fn

    cdef object _leaf(self, object obj, int kind, object handler):
        return self._fn(obj)


def map_leaves(fn, tree):
    """Return ``tree`` rebuilt with the same containers and ``fn(leaf)`` for each leaf."""
    return _FnMap(fn).walk(tree)


# ---------------------------------------------------------------------------
# The core.

@cython.final
cdef class _Core(_TreeMap):
    def __cinit__(self, source, int depth, int workers, uint64_t max_bytes, name, finish):
        global _live_cores
        cdef int rc = PF_OK
        _live_cores += 1
        self._counted = True
        self._copier_ok = False
        self._pool = NULL
        self._jobs = NULL
        self._epoch = pf_fork_epoch()   # also installs the at-fork handler
        self._source = source
        self._finish = finish
        # The device pass may own engine work that close() must wait for
        # (SPEC §5); kept here because the worker drops _finish when it exits.
        self._finish_close = getattr(finish, "close", None)
        self.name = name
        self.depth = depth
        self.workers = workers
        self._max_bytes = max_bytes
        self._slots = [None] * depth
        self._strided = []
        self._doing = DOING_START
        self._ring = pf_ring_new(depth, max_bytes, _spin_ns, &rc)
        _check_rc(rc, "the ring")
        self._pool = pf_pool_new(0)
        if self._pool == NULL:
            raise MemoryError("prefetch: cannot allocate the buffer pool")
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
        if self._pool != NULL:
            pf_pool_close(self._pool)
        free(self._jobs)

    def start(self):
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
                    item = next(self._source)
                except (StopIteration, GeneratorExit):
                    self._publish(slot, _END, 0, False)
                    return
                except BaseException as exc:
                    self._fail(slot, exc, n, "fetching")
                    return
                self._doing = DOING_COPY
                try:
                    batch = self._copy_batch(item)
                    # Drop the source's object before the next next(source):
                    # a source that refills one buffer may check it is free.
                    item = None
                    if self._finish is not None:
                        self._doing = DOING_FINISH
                        batch = self._finish(batch)
                except BaseException as exc:
                    if not self.closed:
                        self._fail(slot, exc, n, "copying")
                    return
                if self._max_bytes and not self._wait_room(self._batch_bytes, &slot):
                    return
                self._publish(slot, batch, self._batch_bytes, True)
                batch = None
                n += 1
        finally:
            self._doing = DOING_DONE
            self._source = None
            self._finish = None
            if self._copier_ok:
                self._copier_ok = False
                with nogil:
                    pf_copier_fini(&self._copier)

    def _fail(self, uint64_t slot, exc, uint64_t n, what):
        try:
            _add_note(exc, f"raised in prefetch worker {self.name!r} while {what} batch {n}")
        except Exception:
            pass  # an exception type that refuses notes is still delivered
        self._publish(slot, _Failure(exc), 0, False)

    cdef bint _wait_room(self, uint64_t nbytes, uint64_t *slot) except -1:
        """Wait for a free slot (and room under max_bytes); False once closed."""
        cdef int rc = pf_ring_try_reserve(self._ring, nbytes, slot)
        cdef int64_t t0
        if rc == PF_ETIMEDOUT:
            t0 = pf_now_ns()
            while rc == PF_ETIMEDOUT:
                with nogil:
                    pf_ring_wait_reserve(self._ring, nbytes, WAIT_SLICE_NS)
                rc = pf_ring_try_reserve(self._ring, nbytes, slot)
            self._producer_wait_ns += pf_now_ns() - t0
        return rc == PF_OK

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
        self._njobs = 0
        self._batch_bytes = 0
        self._strided = []
        batch = self.walk(item)
        if self._batch_bytes >= NOGIL_MIN_BYTES:
            with nogil:
                pf_copy_run(&self._copier, self._jobs, self._njobs)
        else:
            pf_copy_run(&self._copier, self._jobs, self._njobs)
        for out, src in self._strided:
            # numpy releases the GIL itself for large strided copies.
            cnp.PyArray_CopyInto(<cnp.ndarray>out, <cnp.ndarray>src)
        self._strided = []
        self._bytes_copied += self._batch_bytes
        if self._batch_bytes > self._max_batch_bytes and self._pool != NULL:
            # Keep enough free blocks for the ring, the batch being filled and
            # a few the user holds, of mixed sizes (blocks are binned by size
            # class): 2 x (depth + 2) of the largest batch. With 1x, bench/soak.py
            # (4 shapes, 3 batches held) re-allocated 1.3% of blocks for ever;
            # with 2x, 3 blocks in 21,730 batches. A dropped hoard is still freed.
            self._max_batch_bytes = self._batch_bytes
            pf_pool_set_keep(self._pool, 2 * (self.depth + 2) * self._batch_bytes)
        return batch

    cdef object _leaf(self, object obj, int kind, object handler):
        if kind == K_ARRAY or kind == K_ARRAY_SUB:
            return self._copy_array(obj)
        if kind == K_LEAF:
            return handler(obj, self.copy_array)
        return obj

    def copy_array(self, a):
        """A fresh pool-backed copy of numpy array ``a``, filled later in this batch."""
        if not isinstance(a, cnp.ndarray):
            raise TypeError(f"copy_array needs a numpy.ndarray, got {type(a).__name__}")
        return self._copy_array(a)

    cdef object _copy_array(self, object obj):
        cdef cnp.ndarray a = <cnp.ndarray>obj
        cdef size_t nbytes = <size_t>cnp.PyArray_NBYTES(a)
        cdef pf_block *blk
        cdef _Block base
        if type(a) is not cnp.ndarray or a.descr.flags & NPY_ITEM_REFCOUNT:
            # Subclasses keep their type (and e.g. a mask); object and string
            # dtypes hold references that must be copied one by one, with the
            # GIL. numpy allocates these itself.
            self._batch_bytes += nbytes
            return np.array(a, copy=True, order="C", subok=True)
        if self._pool == NULL:
            raise _Closing()
        blk = pf_pool_get(self._pool, nbytes)
        if blk == NULL:
            raise MemoryError(
                f"prefetch: cannot allocate {nbytes} bytes to copy an array of shape "
                f"{obj.shape} and dtype {obj.dtype}")
        base = _Block.__new__(_Block)
        base.blk = blk
        descr = cnp.PyArray_DESCR(a)
        Py_INCREF_Descr(descr)
        out = PyArray_NewFromDescr(np.ndarray, descr, cnp.PyArray_NDIM(a), cnp.PyArray_DIMS(a),
                                   NULL, blk.data, cnp.NPY_ARRAY_CARRAY, None)
        cnp.set_array_base(<cnp.ndarray>out, base)
        if cnp.PyArray_IS_C_CONTIGUOUS(a):
            if nbytes:
                self._add_job(blk.data, cnp.PyArray_DATA(a), nbytes)
        else:
            self._strided.append((out, a))
        self._batch_bytes += nbytes
        return out

    cdef void _add_job(self, void *dst, const void *src, size_t nbytes) except *:
        cdef pf_copy_job *grown
        if self._njobs == self._jobs_cap:
            grown = <pf_copy_job *>realloc(self._jobs, (2 * self._jobs_cap + 8) * sizeof(pf_copy_job))
            if grown == NULL:
                raise MemoryError("prefetch: cannot grow the copy plan")
            self._jobs = grown
            self._jobs_cap = 2 * self._jobs_cap + 8
        self._jobs[self._njobs].dst = dst
        self._jobs[self._njobs].src = src
        self._jobs[self._njobs].nbytes = nbytes
        self._njobs += 1

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
        if pf_ring_try_acquire(self._ring, &slot) != PF_OK:
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
        try:
            while True:
                wait_ns = WAIT_SLICE_NS
                if timeout is not None:
                    wait_ns = min(wait_ns, max(deadline - pf_now_ns(), 0))
                with nogil:
                    pf_ring_wait_acquire(self._ring, wait_ns)
                rc = pf_ring_try_acquire(self._ring, &slot)
                if rc == PF_OK:
                    return slot
                if rc == PF_ECLOSED:
                    raise ClosedError(f"prefetcher {self.name!r} was closed while waiting")
                PyErr_CheckSignals()   # raises KeyboardInterrupt; nothing was taken
                if timeout is not None and pf_now_ns() >= deadline:
                    raise TimeoutError(
                        f"no batch from prefetcher {self.name!r} within {timeout} s; its "
                        f"worker is {_DOING[self._doing]} (batch {self._batch_no})")
                if self._thread is None or not self._thread.is_alive():
                    # The worker publishes before it exits; re-check once so
                    # a batch published just before its exit is not missed.
                    if pf_ring_try_acquire(self._ring, &slot) == PF_OK:
                        return slot
                    raise RuntimeError(f"the worker of prefetcher {self.name!r} is not running "
                                       "(it died or never started); no batch can come")
        finally:
            self._consumer_wait_ns += pf_now_ns() - t0

    # -- lifecycle ----------------------------------------------------------

    def close(self, double grace=CLOSE_GRACE_S):
        """Stop the fetch thread, drop unconsumed batches, free the pool. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._epoch != pf_fork_epoch():
            self._slots = [None] * self.depth
            return
        pf_ring_close(self._ring)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(grace)
            if thread.is_alive():
                warnings.warn(
                    f"prefetcher {self.name!r}: the worker is still {_DOING[self._doing]} "
                    f"after {grace} s; it is left as a daemon thread and exits when that returns",
                    RuntimeWarning, stacklevel=3)
        self._slots = [None] * self.depth
        if self._finish_close is not None:
            self._finish_close()   # e.g. MXNet's engine frees the dropped device arrays
        if self._pool != NULL:
            self._final_pool_stats = pf_pool_get_stats(self._pool)
            pf_pool_close(self._pool)
            self._pool = NULL

    def stats(self):
        cdef pf_pool_stats ps = self._final_pool_stats
        if self._pool != NULL:
            ps = pf_pool_get_stats(self._pool)
        return dict(
            produced=self._produced,
            consumed=self._consumed,
            bytes_copied=self._bytes_copied,
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
        if self._core is None:
            raise ValueError("Prefetcher.__init__ did not complete")
        return self._core.take(self._timeout)


cdef _check_rc(int rc, what):
    if rc == PF_OK:
        return
    if rc == PF_ENOMEM:
        raise MemoryError(f"prefetch: out of memory creating {what}")
    raise OSError(f"prefetch: cannot create {what} (error {rc})")


def _add_note(exc, note):
    """PEP 678 note: add_note() on 3.11+, the same __notes__ list on 3.10."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
        notes.append(note)
        exc.__notes__ = notes


cdef pf_block *take_block(_Core core, size_t nbytes) except NULL:
    cdef pf_block *blk
    if core._pool == NULL:
        raise _Closing()
    blk = pf_pool_get(core._pool, nbytes)
    if blk == NULL:
        raise MemoryError(f"prefetch: cannot allocate {nbytes} bytes for an array")
    core._batch_bytes += nbytes
    return blk


cdef void put_block(pf_block *blk) noexcept nogil:
    pf_pool_put(blk)
