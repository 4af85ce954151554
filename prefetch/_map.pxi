# _map.pxi (included by _core.pyx): the map stage behind prefetch.Loader and
# prefetch.map.
#
# Loader threads claim rows in sampler order, call load(key) (dataset[key],
# or fn(item)) concurrently, and collate each sample into its batch's row
# (_collate.pxi) before claiming the next; without the default collate, the
# sample (or a collate=f result) is copied by that thread (a _BatchCopy of its
# own) before it claims the next. So every batch is the stage's own (a dataset
# may refill one buffer per thread). Each epoch is a _MapEpoch, the stage
# (_stage.pxi) of that epoch's _Core: the core's publisher takes whole
# batches from it as parts; the loader threads never touch the ring.
# Memory is bounded: batches open at most `window` ahead of the last one
# taken, and with max_bytes, the bytes of the batches open and those not yet
# taken by the consumer stay under it (one batch may exceed it alone).
# Threads persist across epochs; each epoch's batches (_epoch_batches.pxi)
# have a generation of their own, and work of a dropped one is dropped: the
# next epoch may open before the current one ends. Every field is read and written
# with the GIL held; `_lock` serialises reading the sampler and laying out a
# batch, `_cv` carries the wake-ups (a batch completed, room in the window, a
# new epoch, close). Every wait is a timed slice that re-checks close().

cdef enum MapMode:
    M_STACK        # the default collate: rows of pooled blocks
    M_CUSTOM       # collate=f: f(samples) on the thread that finished the batch
    M_SINGLE       # no batching (batch_size=None, prefetch.map): the sample is the batch

# A stage's key range (n_keys) when keys are not dataset indices to check:
cdef enum:
    KEYS_ANY = -1          # prefetch.map's items; sample_rng()'s index is the item's position
    KEYS_UNCHECKED = -2    # a framework loader's sampler: any index object goes to load() as
                           # its own __getitem__ takes it; sample_rng()'s index is the key
cdef object _tls = threading.local()   # per loader thread: .info (WorkerInfo), .sample, .stage


def sample_rng():
    """A ``numpy.random.Generator`` for the sample being loaded: determined by
    the loader's ``seed``, the epoch and the sample's index alone, whichever
    thread runs it and however many there are.

    Call it inside ``dataset[i]`` (or the function given to ``prefetch.map``);
    anywhere else it raises ``RuntimeError``.
    """
    sample = getattr(_tls, "sample", None)
    if sample is None:
        raise RuntimeError("sample_rng() is called inside dataset[i] (or map's function) while a "
                           "prefetch loader thread runs it; this thread is not loading a sample")
    seed, epoch, key = sample
    if type(key) is not int:
        # Any integer is an index (a numpy permutation as the sampler): its
        # stream is the one of the same int. Not a bool.
        try:
            if isinstance(key, (bool, np.bool_)):
                raise TypeError
            key = operator.index(key)
        except TypeError:
            raise TypeError(f"sample_rng() needs a non-negative int sample index, got {key!r} "
                            f"({type(key).__name__})") from None
    if key < 0:
        raise TypeError(f"sample_rng() needs a non-negative int sample index, got {key!r}")
    # Philox is counter based: one key per (seed), and a counter whose high
    # words are (index, epoch), so no two samples' streams overlap.
    return np.random.Generator(np.random.Philox(key=seed, counter=[0, 0, key, epoch]))


def set_sample_index(Py_ssize_t index):
    """Inside load(key) on a loader thread: sample_rng() draws the stream of
    sample ``index`` for the rest of this load (a loader whose items are not
    numbered as the streams it wants: a framework's per-worker replicas,
    whose batches go to whichever task their thread claims)."""
    sample = getattr(_tls, "sample", None)
    if sample is None:
        raise RuntimeError("set_sample_index() is called inside a loader thread's load")
    if index < 0:
        raise ValueError(f"set_sample_index() needs a non-negative index, got {index}")
    _tls.sample = (sample[0], sample[1], index)


cdef _check_key(key, Py_ssize_t n_keys):
    """``key`` is a dataset index: an int (or a numpy or framework integer) in [0, n_keys)."""
    if isinstance(key, bool) or not isinstance(key, int):
        try:
            if isinstance(key, np.bool_):
                # numpy < 2.3 only warns (DeprecationWarning) where 2.3 raises: one answer
                raise TypeError
            key = operator.index(key)   # a numpy or framework integer
        except TypeError:
            raise TypeError(f"the sampler yielded {key!r} ({type(key).__name__}); a sample index "
                            "must be an int") from None
    if not 0 <= key < n_keys:
        raise IndexError(f"the sampler yielded index {key}, out of range for a dataset of length {n_keys}")


def worker_info():
    """The ``WorkerInfo`` of the loader thread calling it, or None elsewhere."""
    return getattr(_tls, "info", None)


@cython.final
cdef class _Ahead:
    """What an epoch holds ahead of its consumer, and the bounds on it: bytes
    (max_bytes: of the batches open, and taken but not yet consumed; one batch
    may exceed it alone) and batches (lookahead: opened and not yet consumed).
    Under the stage's condition."""
    cdef uint64_t max_bytes        # 0: no cap
    cdef uint64_t held_bytes
    cdef bint sized                # a batch's real size is known (before: no estimate)
    cdef uint64_t estimate         # the largest batch's real bytes so far: a new batch's count
    cdef Py_ssize_t lookahead      # 0: no cap
    cdef Py_ssize_t n_consumed     # batches of the epoch the consumer has taken

    def __cinit__(self, uint64_t max_bytes):
        self.max_bytes = max_bytes

    cdef void new_epoch(self):
        self.held_bytes = 0
        self.n_consumed = 0

    cdef bint bounded(self):
        return self.max_bytes != 0 or self.lookahead != 0

    cdef bint has_room(self, Py_ssize_t next_k, size_t batch_bytes, Py_ssize_t open_now):
        """Batch ``next_k`` (of about ``batch_bytes``) may open, ``open_now``
        batches being open. Until one batch's size is known there is no
        estimate: one batch opens at a time."""
        if self.lookahead != 0 and next_k - self.n_consumed >= self.lookahead:
            return False
        if self.max_bytes == 0 or self.held_bytes == 0 and open_now == 0:
            return True
        if not self.sized:
            return False
        return self.held_bytes + batch_bytes <= self.max_bytes

    cdef void sized_one(self, uint64_t nbytes):
        """A batch's real size is known (its layout, or its copy)."""
        self.sized = True
        if nbytes > self.estimate:
            self.estimate = nbytes

    cdef void release(self, uint64_t nbytes):
        self.held_bytes -= min(nbytes, self.held_bytes)

    cdef void consumed(self, bint this_epoch, uint64_t nbytes):
        if this_epoch:
            self.n_consumed += 1
        self.release(nbytes)


@cython.final
cdef class _MapStage:
    cdef object load               # key -> sample
    cdef _Assembly asm             # what becomes of each sample (_assemble.pxi)
    cdef int mode
    cdef object name
    cdef object worker_init        # worker_id -> None, on each thread before its first sample
    cdef public object per_thread  # worker_id -> that thread's load (a dataset of its own), or None
    cdef tuple on_thread           # applied on each thread first: the creator's framework modes
    cdef public object seed        # of sample_rng(); a resumed loader may adopt a saved one between epochs
    cdef bint ordered
    cdef bint go_on                # a failed batch is its own error; the epoch goes on (framework loaders)
    cdef object _lock
    cdef object _cv
    cdef _LoaderThreads crew       # the threads (_threads.pxi)
    cdef int target                # threads that claim work; more may be parked (workers="auto")
    cdef Py_ssize_t rows           # rows per batch, for the window
    cdef _Tuner tuner              # workers="auto"; None: a fixed count
    cdef readonly _Gauge gauge     # do the threads run in parallel (_gauge.pxi)
    cdef int64_t wait_ns           # the publisher's wait for batches, for the tuner
    cdef int depth                 # the ring's, for the pool's keep
    cdef _Ahead ahead              # the bounds on what the epoch holds ahead of the consumer
    cdef bint closed
    cdef unsigned long last_gen    # the last generation given (none is reused)
    # the epochs (_epoch_batches.pxi)
    cdef _EpochBatches now         # the current one
    cdef _EpochBatches after       # the next one, opened before it starts; None: not known
    cdef Py_ssize_t n_keys         # a key must be an int in [0, n_keys); KEYS_ANY, KEYS_UNCHECKED: any key
    cdef _Batch cur                # the batch whose rows are being claimed
    cdef Py_ssize_t cur_row
    cdef Py_ssize_t window         # batches open ahead of the last one taken
    # counters (GIL held)
    cdef int64_t load_ns           # inside load(key), summed over threads
    cdef int64_t idle_ns           # threads waiting for room in the window or a new epoch
    cdef uint64_t samples

    def __cinit__(self, load, int mode, collate, _Pool pool, name, worker_init, seed, bint ordered,
                  int depth, tuple on_thread=(), delivery=None, uint64_t max_bytes=0):
        self.load = load
        self.mode = mode
        self.asm = _Assembly(mode, collate, pool, delivery, name)
        self.name = name
        self.worker_init = worker_init
        self.on_thread = on_thread
        self.seed = seed
        self.ordered = ordered
        self.depth = depth
        self._lock = threading.Lock()
        # Re-entrant: a signal handler may call close() while its thread holds it.
        self._cv = threading.Condition(threading.RLock())
        self.crew = _LoaderThreads(name, self._cv)
        self.now = _EpochBatches(0, 0, None, None)
        self.n_keys = KEYS_ANY
        self.ahead = _Ahead(max_bytes)
        self.gauge = _Gauge(name)

    # -- consumer side (the Loader, under the GIL) ---------------------------

    def set_auto(self, int max_threads, double cpus):
        """workers="auto": from one thread up to ``max_threads``, growing while
        that helps and less than ``cpus`` CPUs are busy."""
        self.tuner = _Tuner(max_threads, cpus)

    def start_epoch(self, batches, Py_ssize_t epoch, Py_ssize_t n_keys, int threads,
                    Py_ssize_t batch_rows, order=None, following=None):
        """Begins epoch ``epoch`` over ``batches`` (an iterator of lists of
        keys) on ``threads`` threads (auto: as many as the last epoch ended
        with); returns the stage of its _Core. ``order`` names the epoch's
        order where the loader gives it (None: not known ahead): the epoch
        opened early is adopted when it is that one. ``following``, (order,
        epoch, batches) of the epoch after it where known, opens once this
        one has no batch left to open."""
        cdef _EpochBatches e
        if self.tuner is not None:
            threads = max(self.target, 1)
            self.tuner.restart()
        self.gauge.restart(n_keys == KEYS_ANY)
        with self._cv:
            if self.closed:
                raise ClosedError(f"loader {self.name!r} is closed")
            self.now.drop()
            e = self.after
            if e is not None and e.adoptable(order):
                self.after = None   # opened early: its batches are this epoch's first
            else:
                self._drop_after()
                # No keys until every thread has started: they find the work at once.
                e = _EpochBatches(self._new_gen(), epoch, order, None)
            self.now = e
            self.n_keys = n_keys
            if self.cur is not None and self.cur.gen != e.gen:
                self.cur = None
            self.ahead.new_epoch()
            self.ahead.held_bytes = e.held()
            # Per epoch, as the core's counters of the batches.
            self.asm.new_epoch()
        # Not under _cv: Thread.start() may run a signal handler that calls close().
        self._set_threads(threads, batch_rows)
        with self._cv:
            if self.closed:   # by a signal handler inside Thread.start(), or another thread
                raise ClosedError(f"loader {self.name!r} was closed while its epoch started")
            if e is self.now:
                if e.keys is None:
                    e.keys = batches
                if following is not None:
                    self.after = _EpochBatches(self._new_gen(), following[1], following[0], following[2])
            self._cv.notify_all()
        return _MapEpoch(self, e)

    cdef unsigned long _new_gen(self):
        self.last_gen += 1
        return self.last_gen

    def drop_following(self):
        """The next epoch is not the one planned (set_epoch, load_state_dict):
        what was opened of it early is dropped."""
        with self._cv:
            self._drop_after()
            self._cv.notify_all()

    cdef _drop_after(self):
        cdef _EpochBatches a = self.after
        if a is None:
            return
        self.after = None
        self.ahead.release(a.held())
        a.drop()
        if self.cur is not None and self.cur.gen == a.gen:
            self.cur = None

    cdef _set_threads(self, int threads, Py_ssize_t batch_rows):
        """``threads`` threads claim work (more may be parked: workers="auto");
        the missing ones are started. Called without _cv or _lock held (see
        _LoaderThreads.ensure)."""
        # Enough batches open for every thread to have a row, and one more
        # so that a thread finishing a batch finds the next one open.
        self.window = max(2, (threads + batch_rows - 1) // batch_rows + 1)
        self.asm.keep_batches = self.window + self.depth + 2   # open, in the ring, held by the user
        self.target = threads
        self.rows = batch_rows
        self.crew.ensure(threads, self)

    def set_lookahead(self, Py_ssize_t batches):
        """At most ``batches`` batches of an epoch are opened and not yet taken
        by the consumer (0: no cap beyond the window and the ring): a
        framework loader's bound on work done ahead (workers times a
        prefetch factor)."""
        with self._cv:
            self.ahead.lookahead = max(batches, 0)
            self._cv.notify_all()

    def set_continue_after_failure(self, bint go_on):
        """With ``go_on``, a batch whose sample or collate raised is that
        batch's error and the epoch goes on with the next batch, as a
        framework's loader does; the sampler's error and a thread's
        worker_init error still end the epoch. Set between epochs."""
        with self._cv:
            self.go_on = go_on

    def abandon(self, _EpochBatches e):
        """Ends epoch ``e`` early (its core is closing): work of it is dropped
        (not the next epoch's: it still follows)."""
        with self._cv:
            if e is self.now:
                self.now = _EpochBatches(self._new_gen(), e.epoch, None, None)
                if self.cur is not None and self.cur.gen == e.gen:
                    self.cur = None
            e.drop()
            self._cv.notify_all()

    def close(self, double grace=CLOSE_GRACE_S):
        """Stops and joins every thread (at most ``grace`` s in all); idempotent."""
        with self._cv:
            self.closed = True
            self._drop_after()
            self.now.drop()
            self.now = _EpochBatches(self._new_gen(), self.now.epoch, None, None)
            self.cur = None
            self._cv.notify_all()
        self.crew.close(grace)
        self.asm.close()

    def stats(self):
        """The stage's fields of Stats, over every epoch."""
        return dict(workers=self.target, load_s=self.load_ns / 1e9, loader_idle_s=self.idle_ns / 1e9,
                    samples=self.samples, tune_reason="" if self.tuner is None else self.tuner.reason,
                    **self.gauge.counts(), **self.asm.counts())

    @property
    def threads(self):
        """Thread numbers in use."""
        return self.crew.count

    def describe(self):
        """What the threads are doing, for a TimeoutError."""
        return "waiting for its loader threads: " + self.crew.describe()

    cdef void taken_by_consumer(self, _EpochBatches e, uint64_t nbytes):
        """The consumer took a batch of epoch ``e``: no longer held ahead."""
        with self._cv:
            self.ahead.consumed(e is self.now, nbytes)
            self._cv.notify_all()

    # -- loader threads ------------------------------------------------------

    cdef _Batch _claim(self, int wid, Py_ssize_t *row):
        """The batch and row this thread loads next, in sampler order; None once
        closed. A thread numbered past the target count waits (parked)."""
        cdef _Batch b
        cdef int64_t t0
        while True:
            b = self.cur
            if self.closed:
                return None
            if wid >= self.target:
                with self._cv:
                    if not self.closed and wid >= self.target:
                        self._cv.wait(WAIT_SLICE_S)
                continue
            if b is not None and self.cur_row < b.n and self.epoch_of(b) is not None:
                row[0] = self.cur_row
                self.cur_row += 1
                return b
            if self._to_open() is not None:
                self._open_batch()
                continue
            t0 = pf_now_ns()
            with self._cv:
                if not self.closed and self._to_open() is None and (
                        self.cur is None or self.cur_row >= self.cur.n or self.epoch_of(self.cur) is None):
                    self._cv.wait(WAIT_SLICE_S)
            self.idle_ns += pf_now_ns() - t0

    cdef _EpochBatches _to_open(self):
        """The epoch whose next batch may open now: the current one, or once
        it has none left to open, the next one, beside it within the window
        and the bounds; None."""
        cdef _EpochBatches e = self.now, a = self.after
        cdef size_t nbytes = self.ahead.estimate
        if e.may_open():
            if e.open_count() < self.window and self.ahead.has_room(e.next_k, nbytes, e.open_count()):
                return e
        elif (e.exhausted and a is not None and a.may_open()
                and e.open_count() + a.next_k < self.window
                and self.ahead.has_room(e.next_k + a.next_k, nbytes, e.open_count() + a.open_count())):
            return a
        return None

    cdef _EpochBatches epoch_of(self, _Batch b):
        """The epoch ``b`` is of; None once that one is dropped."""
        if b.gen == self.now.gen:
            return self.now
        if self.after is not None and b.gen == self.after.gen:
            return self.after
        return None

    cdef _open_batch(self):
        cdef _EpochBatches e
        with self._lock:   # one thread reads the sampler at a time
            e = self._to_open()
            if e is not None and not (self.cur is not None and self.cur_row < self.cur.n
                                      and self.epoch_of(self.cur) is not None):
                e.open_batch(self)   # (else another thread opened one meanwhile)

    cdef _laid_out(self, _Batch b, size_t nbytes):
        """``b``'s layout is known: its bytes replace the estimate held for it."""
        with self._cv:
            if self.epoch_of(b) is not None:
                self.ahead.release(b.held)
                self.ahead.held_bytes += nbytes
            b.held = nbytes
            self.ahead.sized_one(nbytes)
            self._cv.notify_all()   # an estimate now exists: more batches may open

    cdef _row_failed(self, _Batch b, Py_ssize_t row, key, int wid, exc, str what):
        cdef _EpochBatches e = self.epoch_of(b)
        self.asm.fail(b, row, wid, exc, what)
        if e is not None and not self.go_on:
            e.stop_after(b)   # no batch after it opens

    cdef _row_done(self, _Batch b):
        cdef _EpochBatches e
        b.done += 1
        self.samples += 1
        if b.done < b.n:
            return
        e = self.epoch_of(b)
        if e is not None:
            self.asm.finish(b)
            if b.parts is not None and self.mode == M_CUSTOM:
                self._laid_out(b, b.parts.nbytes)   # the collate result's real size
            if b.failure is not None and not self.go_on:
                e.stop_after(b)
        b.complete = True
        with self._cv:
            self._cv.notify_all()

    cdef _fail_thread(self, int wid, exc):
        """worker_init raised: the epoch ends with its error (the caller wakes
        the fetch thread once it no longer holds the error)."""
        _add_note(exc, f"raised while starting loader thread {self.name}-w{wid} (worker_init({wid}))")
        self.now.failure = exc
        self.now.stop_k = min(self.now.stop_k, self.now.taken)

    cdef _wake_all(self):
        with self._cv:
            self._cv.notify_all()


@cython.final
cdef class _MapEpoch(_Stage):
    """One epoch of a _MapStage, as the stage of that epoch's _Core."""
    cdef _MapStage stage
    cdef _EpochBatches e           # its batches (_epoch_batches.pxi)
    # ordered=False: the numbers of the batches published, in the ring's
    # order, so that the first `consumed` of them are those delivered (a
    # Loader's state_dict()); empty when ordered.
    cdef readonly list order

    def __cinit__(self, _MapStage stage, _EpochBatches e):
        self.stage = stage
        self.e = e
        self.order = []

    cdef int produce(self, _Parts parts) except -1:
        """The next batch of this epoch (in order, or the first complete one)
        into ``parts``; P_END at its end; P_FAILED with the error in
        self.failure; P_STOPPED once the epoch was abandoned or the stage closed."""
        cdef _MapStage st = self.stage
        cdef _EpochBatches e = self.e
        cdef _Batch b = None
        cdef int64_t t0
        cdef Py_ssize_t i
        while True:
            if st.closed or e is not st.now:
                return P_STOPPED
            if st.ordered:
                found = e.pending.get(e.taken)
                if found is not None and (<_Batch>found).complete:
                    b = <_Batch>found
            else:
                for found in e.pending.values():
                    # A batch at or past stop_k had rows skipped (an earlier one failed): never handed out.
                    if ((<_Batch>found).complete and (<_Batch>found).k < e.stop_k
                            and (b is None or (<_Batch>found).k < b.k)):
                        b = <_Batch>found
            if b is not None:
                break
            if e.exhausted and not e.pending or e.stop_k <= e.taken:
                if e.failure is not None:
                    # Handed on once, and not kept: the stage outlives the
                    # consumer's frames, which the error's traceback holds.
                    self.failure, e.failure = e.failure, None
                    return P_FAILED
                return P_END
            t0 = pf_now_ns()
            with st._cv:
                if e is st.now and not st.closed:
                    st._cv.wait(WAIT_SLICE_S)
            st.wait_ns += pf_now_ns() - t0
        del e.pending[b.k]
        e.taken += 1
        with st._cv:
            st._cv.notify_all()   # room in the window
        _after_batch(st)          # after: the gauge's probe watches the threads at work
        if b.failure is not None:
            if not st.go_on:
                e.stop_k = min(e.stop_k, e.taken)
            self.failure, b.failure = b.failure, None   # not kept: as the epoch's failure above
            with st._cv:
                st.ahead.release(b.held)
            return P_BATCH_FAILED if st.go_on else P_FAILED
        if not st.ordered:
            self.order.append(b.k)
        if st.mode == M_STACK:
            # The collated columns are the batch's leaves; only lists of
            # other objects stay on the host.
            parts.nodes = b.nodes
            parts.leaves = [(<_Column>c).result() for c in b.cols]
            parts.deliver = [i for i in range(len(b.cols)) if (<_Column>b.cols[i]).kind != C_LIST]
            parts.nbytes = b.held
            return P_BATCH
        st.asm.taken(b)
        own = b.parts
        b.parts = None
        parts.nodes, parts.leaves, parts.deliver, parts.nbytes = own.nodes, own.leaves, own.deliver, own.nbytes
        return P_BATCH

    cdef void taken(self, uint64_t nbytes):
        if self.stage.ahead.bounded():
            self.stage.taken_by_consumer(self.e, nbytes)

    cdef int before_take(self) except -1:
        note = self.stage.gauge.take_notice()
        if note is not None:
            _warn.warn_consumer(note, GILBoundWarning)   # at the user's line; nothing is taken yet
        return 0

    cdef bint on_own_thread(self):
        return getattr(_tls, "stage", None) is self.stage

    def stop(self):
        self.stage.abandon(self.e)

    def doing(self):
        return self.stage.describe()

    def counts(self):
        return self.stage.stats()


# For prefetch/loader.py: what the stage does with samples.
MAP_STACK = M_STACK
MAP_CUSTOM = M_CUSTOM
MAP_SINGLE = M_SINGLE
MAP_KEYS_UNCHECKED = KEYS_UNCHECKED
