# Declarations for the compiled core: the C in csrc/ (no Python there) and the
# layouts of the cdef classes of _core.pyx and the .pxi files it includes.
# Every extern is nogil so it can be called inside `with nogil`.
from libc.stdint cimport int64_t, uint64_t


cdef extern from "pf_sync.h" nogil:
    enum:
        PF_OK
        PF_EAGAIN
        PF_ETIMEDOUT
        PF_ECLOSED
        PF_ENOMEM
        PF_EINVAL
        PF_ESYS
    int64_t pf_now_ns()
    unsigned pf_fork_epoch()


cdef extern from "pf_ring.h" nogil:
    ctypedef struct pf_ring:
        pass
    pf_ring *pf_ring_new(uint64_t capacity, uint64_t max_bytes, int64_t spin_ns, int *rc)
    void pf_ring_delete(pf_ring *r)
    int pf_ring_reserve(pf_ring *r, uint64_t nbytes, int64_t timeout_ns, uint64_t *slot)
    void pf_ring_publish(pf_ring *r, uint64_t nbytes)
    int pf_ring_acquire(pf_ring *r, int64_t timeout_ns, uint64_t *slot)
    uint64_t pf_ring_release(pf_ring *r)
    uint64_t pf_ring_fill(pf_ring *r)
    void pf_ring_close(pf_ring *r)


cdef extern from "pf_pool.h" nogil:
    ctypedef struct pf_block:
        size_t capacity
        void *data
    ctypedef struct pf_pool:
        pass
    ctypedef struct pf_pool_stats:
        uint64_t blocks_allocated
        uint64_t blocks_reused
        uint64_t blocks_freed
        uint64_t blocks_out
        uint64_t free_bytes
    pf_pool *pf_pool_new(size_t keep_bytes)
    void pf_pool_set_keep(pf_pool *p, size_t keep_bytes)
    pf_block *pf_pool_get(pf_pool *p, size_t nbytes)
    void pf_pool_put(pf_block *b)
    void pf_pool_close(pf_pool *p)
    pf_pool_stats pf_pool_get_stats(pf_pool *p)
    void pf_pool_live(uint64_t *pools, uint64_t *blocks)


cdef extern from "pf_copy.h" nogil:
    ctypedef struct pf_copy_job:
        void *dst
        const void *src
        size_t nbytes
    ctypedef struct pf_copier:
        pass
    int pf_copier_init(pf_copier *c, int nhelpers)
    void pf_copier_fini(pf_copier *c)
    void pf_copy_run(pf_copier *c, const pf_copy_job *jobs, size_t njobs)
    uint64_t pf_copier_live_threads()


cdef class _Block:
    # Owns one pool block; it is the numpy `base` of the array copied into it,
    # so the block goes back to the pool when the last view is collected.
    cdef pf_block *blk


cdef class _Pool:
    # The pool of a Prefetcher or Loader, shared by its epochs (_pool.pxi).
    cdef pf_pool *p                # NULL once closed
    cdef unsigned _epoch           # pf_fork_epoch() at creation
    cdef pf_pool_stats _final      # snapshot taken at close
    cdef pf_pool_stats stats(self)


from cpython.object cimport PyObject


cdef class _SoleProof:
    # The hand-over proof (_sole.pxi): which leaves of one batch only the batch holds.
    cdef set sole                  # their addresses; None: none proven
    cdef PyObject **_todo          # find()'s stack (borrowed pointers)
    cdef Py_ssize_t _todo_cap
    cdef PyObject **_found         # find()'s finds (borrowed pointers)
    cdef Py_ssize_t _found_cap
    cdef void clear(self)
    cdef bint holds(self, object obj)
    cdef void find(self, PyObject *root) except *


cdef class _LeafSink:
    # What the tree walk (_tree.pxi) hands each leaf to; the base keeps it as is.
    cdef object _leaf(self, object obj, int kind, object handler, Py_ssize_t index)


cdef class CopyPlan(_LeafSink):
    # One batch's copies (_copy.pxi): pool blocks taken and memcpy jobs queued
    # while the tree is walked (GIL held), run afterwards without the GIL.
    cdef pf_pool *_pool            # borrowed from the _Core; NULL once it closed
    cdef pf_copy_job *_jobs
    cdef size_t _njobs
    cdef size_t _jobs_cap
    cdef list _strided             # (out, src) pairs copied by numpy
    cdef list _sources             # arrays the queued memcpys read: alive until _run
    cdef uint64_t nbytes           # bytes of the batch being planned: copied + handed over
    cdef uint64_t handed_bytes     # of which handed over (SPEC §3 rule 1)
    cdef uint64_t copied_leaves
    cdef uint64_t handed_leaves
    cdef _SoleProof _proof         # the leaves of this batch only it holds (copy="auto")
    cdef readonly object device    # the Delivery, or None
    cdef set closers               # close hooks of the leaf adapters used (run once at close)
    cdef list _deliver_idx         # leaves to hand to device.deliver (only with a device)
    cdef readonly uint64_t batches # batches planned so far: adapters tell batches apart
    cdef dict _copying             # id(leaf) -> its copy, while copy_state walks the copy's state
    cdef object __weakref__        # adapters may keep per-prefetcher state keyed by the plan

    cdef void _reset(self)
    cdef object _hand_over(self, object obj, size_t nbytes)
    cdef object _leaf(self, object obj, int kind, object handler, Py_ssize_t index)
    cdef object _copy_array(self, object a)
    cdef void _copy_array_state(self, object a, object out) except *
    cdef void _add_job(self, void *dst, const void *src, size_t nbytes) except *
    cdef void _run(self, pf_copier *copier) except *


cdef class _Parts:
    # One batch on its way from a stage to the publisher (_stage.pxi).
    cdef list nodes                # the tree's structure (_tree.pxi's preorder nodes)
    cdef list leaves               # its leaves, memory only the prefetcher holds
    cdef list deliver              # indices of the leaves a device delivery gets
    cdef uint64_t nbytes           # array bytes of the batch, for max_bytes
    cdef void clear(self)


cdef class _Stage:
    # What produces batches for a _Core (_stage.pxi): the fetch stage, a map stage's epoch.
    cdef object failure            # with P_FAILED: the error to publish (the core takes it)
    cdef int produce(self, _Parts parts) except -1
    cdef void taken(self, uint64_t nbytes)
    cdef int before_take(self) except -1
    cdef bint on_own_thread(self)


cdef class _Publisher:
    # The producer side of a _Core (_core.pyx): the ring, its slots and the one
    # publisher thread that asks the stage (_stage.pxi) for batches, delivers
    # them to the device and publishes them.
    cdef pf_ring *_ring            # heap, cache-line aligned; NULL until created
    cdef _Stage _stage             # what this core publishes from
    cdef _Parts _parts             # what the stage fills, reused per batch
    cdef object _pool              # the owner's _Pool: stats only (the owner closes it)
    cdef object _delivery          # None or the device adapter's Delivery (the owner closes it)
    cdef bint _counted             # counted in _live_cores (__cinit__ ran)
    cdef unsigned _epoch           # pf_fork_epoch() at creation
    cdef list _slots               # depth entries: batch, _Failure or _END
    cdef list _warnings            # (message, category) raised on the publisher thread for the consumer
    cdef object _thread            # the publisher threading.Thread
    cdef tuple _on_thread          # adapters' thread-state applies, run first on the publisher thread
    cdef object _publisher_ident   # its threading.get_ident(), once it runs
    cdef readonly object name
    cdef readonly str kind         # "prefetcher" or "loader", for messages
    cdef readonly int depth
    cdef uint64_t _max_bytes       # 0: no cap
    cdef readonly bint closed
    cdef int _doing                # what the publisher does, for TimeoutError and close()
    # counters (each written by one thread, read under the GIL)
    cdef uint64_t _produced        # by the publisher
    cdef uint64_t _consumed        # by the consumer
    cdef int64_t _producer_wait_ns
    cdef uint64_t _peak_fill

    cdef int _apply_thread_states(self) except -1
    cdef tuple _next_batch(self, _Stage stage, _Parts parts)
    cdef bint _wait_room(self, uint64_t nbytes, uint64_t *slot) except -1
    cdef void _publish(self, uint64_t slot, object item, uint64_t nbytes, bint is_batch)


cdef class _Core(_Publisher):
    # A _Publisher with its consumer side, close() and stats (_core.pyx).
    cdef unsigned long _acquirer   # ident of the consumer waiting in pf_ring_acquire without the GIL; 0: none
    cdef object _consumer_lock     # held by the consumer that waits without the GIL
    cdef object _close_lock        # RLock: one close() tears down, the others wait for it
    cdef bint _torn_down           # close() finished: the thread joined (or warned about)
    cdef bint _ended               # the consumer saw the end (or the error)
    cdef bint _replaced            # closed because its owner started a newer epoch
    cdef uint64_t _failed          # batch errors the consumer took, the stream going on after them
    cdef int64_t _consumer_wait_ns

    cpdef object take(self, object timeout=*)
    cdef uint64_t _wait_batch(self, object timeout) except? 0xFFFFFFFFFFFFFFFF
    cdef _check_usable(self)
    cdef object _closed_while_waiting(self)
    cdef _tear_down(self, double grace, at)


cdef class _Iterator:
    # Base of the Python Prefetcher; holds what __next__ needs.
    cdef public _Core _core        # None until Prefetcher.__init__ completes
    cdef public object _timeout    # seconds or None, passed to take()



# For compiled adapters (cimport prefetch._core; Cython shares these through
# the module's C API capsule, so the adapter links against nothing): a block of
# the plan's pool for this batch, counted in its bytes, that the adapter fills
# itself (e.g. a framework's engine copies into it); and the call that gives it back,
# from any thread, with or without the GIL.
cdef pf_block *take_block(CopyPlan plan, size_t nbytes) except NULL
cdef void put_block(pf_block *blk) noexcept nogil
