# Declarations for the compiled core: the C in csrc/ (no Python there) and the
# layouts of every cdef class of _core.pyx and the .pxi files it includes.
# Every extern is nogil so it can be called inside `with nogil`.
cimport cython
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t


cdef extern from "pf_sync.h" nogil:
    enum:
        PF_OK
        PF_EAGAIN
        PF_ETIMEDOUT
        PF_ECLOSED
        PF_ENOMEM
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


@cython.final
cdef class _Layout:
    # What a K_STATE type's instances hold besides their items (_tree.pxi).
    cdef int base                  # a Base
    cdef bint has_dict             # instances have a __dict__
    cdef tuple slots               # the __slots__ entries (mangled names), base first


cdef class _Block:
    # Owns one pool block; it is the numpy `base` of the array copied into it,
    # so the block goes back to the pool when the last view is collected.
    cdef pf_block *blk


cdef class _Pool:
    # The pool of a Prefetcher or Loader, shared by its epochs (_pool.pxi).
    cdef pf_pool *p                # NULL once closed
    cdef unsigned _epoch           # pf_fork_epoch() at creation
    cdef pf_pool_stats _final      # snapshot taken at close
    cdef size_t largest            # the largest batch's bytes kept for so far (keep_for)
    cdef void keep_for(self, size_t batches, size_t nbytes)
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


cdef class CopyPlan:
    # One batch's copies (_copy.pxi): pool blocks taken and memcpy jobs queued
    # while the tree is walked (_tree.pxi hands it each leaf, GIL held), run
    # afterwards without the GIL.
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
    # One batch on its way from a stage to the publisher, in its ring slot (_stage.pxi).
    cdef pf_ring *ring             # the publisher's (it frees it)
    cdef uint64_t max_bytes        # the ring's cap on bytes ahead; 0: none
    cdef uint64_t slot             # the slot reserved for the batch (room())
    cdef int64_t wait_ns           # time waiting for room, summed (producer_wait_s)
    cdef list nodes                # the tree's structure (_tree.pxi's preorder nodes)
    cdef list leaves               # its leaves, memory only the prefetcher holds
    cdef list deliver              # indices of the leaves a device delivery gets
    cdef uint64_t nbytes           # array bytes of the batch, for max_bytes
    cdef bint room(self, uint64_t nbytes) except -1
    cdef void clear(self)


cdef class _Stage:
    # What produces batches for a _Core (_stage.pxi): the fetch stage, a map stage's epoch.
    cdef object failure            # with P_FAILED: the error to publish (the core takes it)
    cdef int produce(self, _Parts parts) except -1
    cdef void taken(self, uint64_t nbytes)
    cdef int before_take(self) except -1
    cdef bint on_own_thread(self)
    cdef object device(self)


# -- the stages' parts (_errors, _collate, _batchcopy, _fetch, _assemble,
# _gauge, _epoch_batches, _tune, _threads, _map .pxi): their layouts here, the
# behaviour in the .pxi files.

cdef enum MapMode:  # a map stage's batching mode: which assembly it has (_assemble.pxi)
    M_STACK         # the default collate: rows of pooled blocks
    M_CUSTOM        # collate=f: f(samples) on the thread that finished the batch
    M_SINGLE        # no batching (batch_size=None, prefetch.map): the sample is the batch


cdef class _Failure:
    # An error in its batch's slot (_errors.pxi).
    cdef readonly object exc
    cdef readonly bint ends


@cython.final
cdef class _Column:
    cdef int kind
    cdef object out            # the batch's leaf being filled: an ndarray or a list
    cdef object dtype          # a sample leaf's dtype (array and number columns)
    cdef cnp.PyArray_Descr *descr   # borrowed from dtype: the fast check
    cdef tuple shape           # a sample leaf's shape (array columns)
    cdef type leaf_type        # the first sample's leaf type (ndarray for any ndarray subclass);
                               # every sample's must be the same
    cdef object as_numpy       # a framework leaf's host numpy view, or None
    cdef object from_numpy     # the batch block as the framework's array, or None
    cdef char *data            # C_ARRAY: the block
    cdef size_t row_nbytes


@cython.final
cdef class _BatchCopy:
    cdef CopyPlan plan             # reused per batch
    cdef pf_copier _copier
    cdef bint _copier_ok           # the copier's helper threads run (fini once)
    cdef readonly int workers      # threads that copy: this one and workers - 1 helpers
    cdef bint _handover            # copy="auto": hand over what the _SoleProof proves sole
    cdef _Pool pool
    cdef size_t _keep_batches      # batches ahead the pool keeps blocks for; 0: its owner's policy
    cdef uint64_t bytes_copied
    cdef uint64_t bytes_handed
    cdef uint64_t leaves_copied
    cdef uint64_t leaves_handed
    cdef unsigned _fork_epoch      # pf_fork_epoch() at creation

    cdef void copy(self, object item, _Parts parts) except *
    cdef void new_epoch(self)


@cython.final
cdef class _FetchStage(_Stage):
    cdef object source             # the iterator; None once the publisher thread ended
    cdef _BatchCopy batch_copy
    cdef object name
    cdef unsigned _fork_epoch      # pf_fork_epoch() at creation
    cdef bint _stopped             # stop() ran
    cdef str _doing                # what it does, for a TimeoutError
    cdef uint64_t _fetched         # batches fetched, for the error note


cdef class _Batch:
    # One batch of a map stage being assembled (_assemble.pxi).
    cdef Py_ssize_t k              # its number in the epoch, from 0
    cdef Py_ssize_t n              # rows
    cdef Py_ssize_t done           # rows finished (loaded and assembled, failed, or skipped)
    cdef bint complete             # done == n and the batch is built: the publisher may take it
    cdef unsigned long gen         # its epoch's generation
    cdef list keys                 # the sampler's indices, one per row
    cdef uint64_t held             # bytes counted for it by the epochs' _Ahead
    cdef object failure            # the exception of its lowest failed row, or None
    cdef Py_ssize_t fail_row
    # A stream's batch (_map.pxi): its worker (-1: a map-style batch, any
    # thread's), and that worker's part of the state once it is delivered.
    # Opened as a slot of no rows; its worker's thread reads the samples and
    # puts the batch of those rows in its place (none: a hole, never handed out).
    cdef int worker
    cdef object part


@cython.final
cdef class _StackBatch(_Batch):
    # A batch collated into pooled columns (_stack.pxi).
    cdef list nodes                # the layout (row 0's key order once it has come)
    cdef list cols                 # one _Column per leaf, made by the first finished sample
    cdef Py_ssize_t layout_row     # the row whose sample made cols
    # layout_row > 0 (row 0 finished later; see _settle):
    cdef int row0                  # a Row0
    cdef tuple row0_layout         # R0_DIFFERS: row 0's (nodes, leaf descriptions)
    cdef Py_ssize_t min_filled     # the lowest row filled before row 0 came
    cdef list odd                  # [(row, its layout)]: rows that did not fit cols before row 0 came


cdef class _OwnedBatch(_Batch):
    # A batch that is one object its thread copied (_assemble.pxi).
    cdef list samples              # collate=f: the samples, until it runs
    cdef _Parts parts              # the copied sample or collate result
    cdef tuple copied              # ...its copy's figures (_COPY_FIGURES), for stats


@cython.final
cdef class _ThreadContext:
    # One loader thread's context (_thread_context.pxi): its thread alone uses it.
    cdef readonly int wid          # its thread number
    cdef object work               # the _ThreadWork it runs
    cdef object info               # its WorkerInfo (worker_info()); None before its set-up
    cdef object sample             # (seed, epoch, index) of the sample it loads (sample_rng()); None between
    cdef _BatchCopy copy           # its batch copy (collate=f, no batching), made on first use
    # A stream's: its worker (prefetch/_streams.py), the batch it read last and that batch's next row.
    cdef object reader
    cdef _Batch filling
    cdef Py_ssize_t filling_row
    # What it is busy with, which its crew reads (_threads.pxi):
    cdef object clock              # its CPU clock id (None: none), for the gauge
    cdef object tid                # its kernel thread id (None: not started), for the gauge
    cdef int64_t busy_since        # pf_now_ns() when its load began, 0 when idle
    cdef object busy_key           # the key it loads
    cdef int64_t woken_at          # waiting for work (WAITING), woken from that wait at
                                   # pf_now_ns() and not yet running again (> 0), or neither (0)
    cdef bint gone                 # its thread left (worker_init failed): ensure() replaces it

    cdef void busy(self, key, int64_t since)
    cdef void enter(self)
    cdef void leave(self)
    cdef _BatchCopy batch_copy(self, _Pool pool, delivery)
    cdef tuple read_stream(self, Py_ssize_t epoch, Py_ssize_t workers, seed, name)
    cdef void loads(self, Py_ssize_t epoch, index, seed, int workers)


cdef class _Assembly:
    # What a map stage makes of each sample, one subclass per batching mode (_assemble.pxi).
    cdef _Pool pool
    cdef object name               # the loader's, for notes
    cdef object delivery           # the loader's device Delivery, or None: its one holder, which
                                   # closes it; the publisher delivers to it, adapters may copy there
    cdef size_t keep_batches       # batches in flight the pool keeps blocks for (the stage sets it)
    cdef set closers               # close hooks of the leaf adapters its copies used (collate=f, no batching)

    cdef _Batch new_batch(self, Py_ssize_t k, list keys, unsigned long gen)
    cdef int64_t take_sample(self, _Batch b, Py_ssize_t row, object sample, _ThreadContext t) except -2
    cdef int64_t finish(self, _Batch b, _ThreadContext t) except -2
    cdef void hand(self, _Batch b, _Parts parts) except *
    cdef void new_epoch(self)
    cdef void fail(self, _Batch b, Py_ssize_t row, int wid, exc, str what) except *


@cython.final
cdef class _StackAssembly(_Assembly):
    # The default collate (_stack.pxi).
    cdef object _lock              # a batch's columns are made, and row 0 settles them, under it
    cdef uint64_t bytes_collated

    cdef _settle(self, _StackBatch b, Py_ssize_t row, list nodes, list leaves, list ref, list cols,
                 bint differs, object idx, int wid)
    cdef _blame(self, _StackBatch b, Py_ssize_t row, why, int wid)


cdef class _OwningAssembly(_Assembly):
    # No batching, and collate=f's base: the thread copies what it hands on (_assemble.pxi).
    cdef object collate            # collate=f (no batching: applied to the one sample), or None
    # the copies of the batches taken (_COPY_FIGURES), per epoch as the core's
    # counters (a batch of the next epoch may be copied before that epoch starts)
    cdef list copied

    cdef int64_t _own(self, object item, _OwnedBatch b, _ThreadContext t) except -2


@cython.final
cdef class _CustomAssembly(_OwningAssembly):
    pass


@cython.final
cdef class _EpochBatches:
    # One epoch's key lists and its open batches (_epoch_batches.pxi).
    cdef object token              # what its order is a function of (the loader's own); None: unknown
    cdef readonly Py_ssize_t epoch # sample_rng()'s and WorkerInfo's
    cdef object keys               # its iterator of key lists; None: none to read
    cdef unsigned long gen         # its batches' generation, never reused
    cdef bint exhausted            # every key list is read
    cdef bint reading              # a thread is inside next(keys)
    cdef Py_ssize_t next_k         # the number of the next batch to open
    cdef Py_ssize_t taken          # batches handed to the publisher
    cdef Py_ssize_t stop_k         # no batch from here on opens (an error came before it)
    cdef dict pending              # k -> _Batch, opened and not taken
    cdef object failure            # an error of the sampler or a worker_init, raised after batch stop_k - 1
    # A stream epoch's slots open in turn over its workers not ended (a framework's
    # order): `ended` is None for a map-style epoch.
    cdef list ended                # per worker: its iterator has ended (or raised)
    cdef int turn                  # the worker whose slot opens next
    cdef Py_ssize_t cap            # ordered=False: slots not filled the workers alive may have
                                   # (a framework's prefetch_factor * num_workers, shared); 0: no cap

    cdef bint may_open(self)
    cdef Py_ssize_t open_count(self)
    cdef void stop_after(self, _Batch b)
    cdef list read_keys(self)
    cdef void add(self, _Batch b)
    cdef _Batch next_complete(self, bint ordered)
    cdef void take(self, _Batch b, bint stop)
    cdef bint at_end(self)
    cdef object take_failure(self)
    cdef _Batch slot_read(self, _Assembly asm, _Batch slot, int w, list keys, bint ended, part, failure,
                          bint stop)
    cdef void fail(self, exc, Py_ssize_t k)
    cdef void drop(self)
    cdef uint64_t held(self)
    cdef int next_worker(self)
    cdef _Batch slot_of(self, int w)


@cython.final
cdef class _Ahead:
    # What the epochs hold ahead of the consumer, and its bounds (_epoch_batches.pxi).
    cdef uint64_t max_bytes        # 0: no cap
    cdef uint64_t held_bytes       # of the batches open, and taken but not consumed
    cdef bint sized                # a batch's real size is known (before: no estimate)
    cdef uint64_t estimate         # the largest batch's real bytes so far: a new batch's count
    cdef Py_ssize_t lookahead      # batches opened and not consumed, at most; 0: no cap
    cdef Py_ssize_t n_consumed     # batches of the epoch the consumer has taken

    cdef void new_epoch(self, uint64_t held)
    cdef bint bounded(self)
    cdef bint has_room(self, Py_ssize_t next_k, Py_ssize_t open_now)
    cdef void hold(self, _Batch b)
    cdef void resize(self, _Batch b, uint64_t nbytes, bint counted)
    cdef void release(self, uint64_t nbytes)
    cdef void consumed(self, bint this_epoch, uint64_t nbytes)


@cython.final
cdef class _Epochs:
    # The current epoch, the next one opened early, and what opens when (_epoch_batches.pxi).
    cdef _EpochBatches now         # the current one
    cdef _EpochBatches after       # the next one, opened before it starts; None: not known
    cdef unsigned long last_gen    # the last generation given (none is reused)
    cdef _Batch cur                # the batch whose rows are being claimed
    cdef Py_ssize_t cur_row        # its next row
    cdef Py_ssize_t window         # batches open ahead of the last one taken (the stage sets it)
    cdef _Ahead ahead              # the bounds on what is held ahead of the consumer

    cdef unsigned long new_gen(self)
    cdef _EpochBatches begin(self, Py_ssize_t epoch, order)
    cdef void set_keys(self, _EpochBatches e, batches, following)
    cdef void drop_after(self)
    cdef void abandon(self, _EpochBatches e)
    cdef void close(self)
    cdef _EpochBatches epoch_of(self, _Batch b)
    cdef bint has_rows(self)
    cdef _Batch claim_row(self, Py_ssize_t *row)
    cdef _EpochBatches to_open(self)
    cdef bint open_next(self, _Assembly asm, name) except -1


cdef class _ThreadWork:
    # What loader threads work for; the map stage implements it (_threads.pxi).
    cdef object thread_load(self, _ThreadContext t)
    cdef _Batch claim(self, _ThreadContext t, Py_ssize_t *row)
    cdef object key_of(self, _Batch b, Py_ssize_t row, _ThreadContext t)
    cdef void check_key(self, key) except *
    cdef void failed(self, _Batch b, Py_ssize_t row, _ThreadContext t, exc, str what) except *
    cdef void loaded(self, _Batch b, Py_ssize_t row, _ThreadContext t, sample) except *
    cdef void done(self, _Batch b, _ThreadContext t) except *
    cdef void wake(self)


@cython.final
cdef class _LoaderThreads:
    # The loader threads of a map stage (_threads.pxi).
    cdef object name               # the loader's: threads are "<name>-w<number>"
    cdef object _cv                # the stage's condition (re-entrant)
    cdef list _threads             # the threads close() joins
    cdef list contexts             # per thread number: its _ThreadContext (a replacement's, once one left)
    cdef list _starters            # idents of the threads inside ensure()'s Thread.start()
    cdef bint _listed              # close() has taken the list of threads it joins
    cdef bint closed
    cdef int64_t load_ns           # time inside load(key), summed over threads (each adds its own)
    cdef int64_t ready_ns          # time from woken to running again, summed over threads

    cdef void ensure(self, int n, _ThreadWork work) except *
    cdef void woken(self, int64_t now)
    cdef int64_t wait_for_work(self, _ThreadContext t) except -1
    cdef int64_t at_work_ns(self, int64_t now)
    cdef tuple clocks_and_tids(self, bint at_work)
    cdef str describe(self)
    cdef void close(self, double grace) except *


@cython.final
cdef class _Gauge:
    cdef object name               # the stage's, for the notice
    cdef object what               # what the threads call: "dataset[i]", "the mapped function"
    cdef object remedy             # the notice's advice on processes (a drop-in may name its framework's)
    cdef int64_t t0                # the window's start; 0: the next batch starts one
    cdef int64_t busy0             # the threads' time inside load() at the window's start
    cdef object cpu0, runq0, proc0 # the meter's figures then (_meter.pxi; None: unknown)
    cdef int threads               # threads claiming work in the window
    cdef int cpus                  # CPUs the process may use
    # over every window (seconds, and seconds times a figure)
    cdef double wall_s, busy_s, par_s, wait_s
    # over the serialized windows (the notice's figures)
    cdef double ser_wall_s, ser_busy_s, ser_par_s
    cdef int probes, probes_ser    # probes of the GIL made, and those that found the threads waiting
    cdef bint last_probe           # the last probe's verdict
    cdef int skip                  # judged windows until the next probe
    cdef bint last_serialized      # the last window's verdict, and its thread count
    cdef int last_threads
    cdef double last_busy, last_par, last_cpu
    cdef bint last_open            # the last window called for a probe that did not tell
    cdef tuple at_work             # the clocks and ids of the threads at work when it closed,
    cdef object probe              # and what probes them (a meter, or a test's verdict)
    cdef bint noticed              # the notice was made (it is given once; a drop-in whose loader
                                   # makes a stage per epoch carries it over)
    cdef object notice             # a GILBoundWarning for the consumer to raise, or None

    cdef void restart(self, str what)
    cdef bint due(self, int64_t now, _LoaderThreads waiting=*)
    cdef int end_window(self, int64_t now, _LoaderThreads crew, int threads) except -1
    cpdef bint window(self, double wall, int threads, double busy, cpu, runq, others, probe,
                      tuple at_work=*) except -1
    cdef object _probe(self, probe, tuple at_work)
    cpdef bint trial_failed(self, int tried, int kept, double speedup) except -1
    cdef _make_notice(self, int threads, double par, double wait_share, trial)
    cpdef object take_notice(self)


@cython.final
cdef class _Tuner:
    cdef int max_threads           # the most threads a trial may reach
    cdef double cpus               # CPUs the process may use
    cdef int ceiling               # no trial above this (lowered by a failed trial)
    cdef int retry                 # windows until the ceiling is lifted again
    cdef int trial_from            # the count before the trial running, or 0
    cdef double trial_rate         # samples/s before the trial: the best of the recent windows
    cdef double trial_low          # the trial's slowest window so far
    cdef int trial_windows         # windows measured in the trial
    cdef list recent               # samples/s of the last RECENT windows at the current count
    cdef int64_t t0                # the window's start; 0: the next batch starts one
    cdef int64_t wait0             # the publisher's wait at the window's start
    cdef double cpu0               # process CPU time at the window's start
    cdef uint64_t samples0
    cdef Py_ssize_t batches        # batches in the window
    cdef readonly str reason       # why the count is not growing now ("" before the first window)

    cdef void restart(self)
    cdef bint due(self, int64_t now)
    cdef int after_batch(self, int threads, uint64_t samples, int64_t wait_ns, _Gauge gauge) except -1
    cpdef int decide(self, int threads, double rate, double waited, double busy, _Gauge gauge) except -1
    cdef void _new_window(self, int64_t now, uint64_t samples, int64_t wait_ns) except *


@cython.final
cdef class _StageHooks:
    # What a drop-in gives its map stage (prefetch/_framework.py), or a stream
    # (prefetch/_streams.py); a Loader's own: none (_map.pxi).
    cdef readonly object per_thread     # worker_id -> its dataset (a copy), a stream's worker; or None
    cdef readonly Py_ssize_t lookahead  # batches opened and not yet consumed, at most; 0: no cap
    cdef readonly bint go_on            # a failed batch is its own error; the epoch goes on
    cdef readonly object remedy         # what the GIL notice names as the remedy, or None
    cdef readonly bint gil_noticed      # the GIL notice was given already: not again
    cdef readonly object on_notice      # note -> None: takes the GIL notice in place of the warning
    cdef readonly bint stream           # per_thread gives each thread its worker of a stream


@cython.final
cdef class _MapStage(_ThreadWork):
    # The map stage behind Loader and map (_map.pxi).
    cdef object load               # key -> sample
    cdef _Assembly asm             # what becomes of each sample (_assemble.pxi)
    cdef object name
    cdef object worker_init        # worker_id -> None, on each thread before its first sample
    cdef _StageHooks hooks         # a drop-in's (each thread's load, lookahead, ...), or a stream's
    cdef tuple on_thread           # applied on each thread first: the creator's framework modes
    cdef public object seed        # of sample_rng(); a resumed loader may adopt a saved one between epochs
    cdef bint ordered
    cdef object _lock              # one thread reads the sampler at a time
    cdef object _cv                # the wake-ups: a batch complete, room, a new epoch, close
    cdef _LoaderThreads crew       # the threads (_threads.pxi)
    cdef int target                # threads that claim work; more may be parked (workers="auto")
    cdef Py_ssize_t rows           # rows per batch, for the window
    cdef _Tuner tuner              # workers="auto"; None: a fixed count
    cdef _Gauge gauge              # do the threads run in parallel (_gauge.pxi)
    cdef int depth                 # the ring's, for the pool's keep
    cdef _Epochs epochs            # the epochs, what opens when, the bounds (_epoch_batches.pxi)
    cdef bint closed
    cdef Py_ssize_t n_keys         # a key must be an int in [0, n_keys); KEYS_ANY, KEYS_UNCHECKED: any key
    # counters (GIL held)
    cdef int64_t wait_ns           # the publisher's wait for batches, for the tuner
    cdef int64_t idle_ns           # threads waiting for room in the window or a new epoch (not
                                   # for the GIL once woken: that is the gauge's)
    cdef uint64_t samples

    cdef _set_threads(self, int threads, Py_ssize_t batch_rows)
    cdef _Batch _stream_row(self, _ThreadContext t, Py_ssize_t *row)
    cdef _sized(self, _Batch b, uint64_t nbytes)
    cdef void _notify(self)


@cython.final
cdef class _MapEpoch(_Stage):
    # One epoch of a _MapStage, as the stage of its _Core (_map.pxi).
    cdef _MapStage stage
    cdef _EpochBatches e           # its batches
    # ordered=False: the numbers of the batches published, in the ring's
    # order, so that the first `consumed` of them are those delivered (a
    # Loader's state_dict()); empty when ordered.
    cdef readonly list order
    # A stream's: (worker, its part) of each batch published, in the ring's
    # order: the first `consumed + failed` of them are those delivered.
    cdef readonly list streamed

    cdef void _measure(self) except *


@cython.final
cdef class _Core:
    # A stage's batches through a ring (_core.pyx). The producer side: the
    # ring, its slots and the one publisher thread that asks the stage
    # (_stage.pxi) for batches, delivers them to the device and publishes them.
    cdef pf_ring *_ring            # heap, cache-line aligned; NULL until created
    cdef _Stage _stage             # what this core publishes from
    cdef _Parts _parts             # what the stage fills, reused per batch
    cdef _Pool _pool               # the owner's: stats only (the owner closes it)
    cdef bint _counted             # counted in _live_cores (__cinit__ ran)
    cdef unsigned _epoch           # pf_fork_epoch() at creation
    cdef list _slots               # depth entries: batch, _Failure or _END
    cdef list _warnings            # (message, category) raised on the publisher thread for the consumer
    cdef object _thread            # the publisher threading.Thread
    cdef tuple _on_thread          # adapters' thread-state applies, run first on the publisher thread
    cdef readonly object name
    cdef readonly str kind         # "prefetcher" or "loader", for messages
    cdef readonly int depth
    cdef readonly bint closed
    cdef tuple _doing              # what the publisher does (a DOING_...), for TimeoutError and close()
    # counters (each written by one thread, read under the GIL)
    cdef uint64_t _produced        # by the publisher
    cdef readonly uint64_t consumed   # batches the consumer has taken
    cdef uint64_t _peak_fill

    # The consumer side, close() and stats:
    cdef unsigned long _acquirer   # ident of the consumer waiting in pf_ring_acquire without the GIL; 0: none
    cdef object _consumer_lock     # held by the consumer that waits without the GIL
    cdef object _close_lock        # RLock: one close() tears down, the others wait for it
    cdef bint _torn_down           # close() finished: the thread joined (or warned about)
    cdef readonly bint ended       # the consumer saw the end of the stream (or its error)
    cdef bint _replaced            # closed because its owner started a newer epoch
    cdef readonly uint64_t failed  # batch errors the consumer took, the stream going on after each
    cdef int64_t _consumer_wait_ns

    cdef int _apply_thread_states(self) except -1
    cdef void _publish(self, object item, uint64_t nbytes, bint is_batch)
    cpdef object take(self, object timeout=*)
    cdef uint64_t _wait_batch(self, object timeout) except? 0xFFFFFFFFFFFFFFFF
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
