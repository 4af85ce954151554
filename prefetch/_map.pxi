# _map.pxi (included by _core.pyx): the map stage behind prefetch.Loader and
# prefetch.map.
#
# Loader threads (_threads.pxi) claim rows in sampler order, call load(key)
# (dataset[key], or fn(item)) concurrently, and hand each sample to the
# stage's assembly (_assemble.pxi: one per batching mode) before claiming
# the next: the default collate copies it into its batch's row, collate=f
# and no batching copy what they hand on on that thread. So every batch is
# the stage's own (a dataset may refill one buffer per thread). A stream's
# threads are its workers (prefetch/_streams.py): its batches open as slots in
# turn over the workers not ended, each filled by its worker's thread alone
# (a hole, never handed out, where that stream had ended). Each epoch
# is a _MapEpoch, the stage (_stage.pxi) of that epoch's _Core: the core's
# publisher takes whole batches from it as parts; the loader threads never
# touch the ring. The stage calls its parts and none calls it back: the
# epochs and the bounds (_epoch_batches.pxi) open, complete, fail and hand
# out batches and say what may open; each thread works against _ThreadWork,
# which the stage implements, passing its context (_thread_context.pxi);
# after each batch taken the epoch asks the gauge (_gauge.pxi), then the
# tuner (_tune.pxi). Memory is bounded: batches open at most `window`
# ahead of the last one taken, and with max_bytes, the bytes of the batches
# open and those not yet taken by the consumer stay under it (one batch may
# exceed it alone). Threads persist across epochs; each epoch's batches have
# a generation of their own, and work of a dropped one is dropped: the next
# epoch may open before the current one ends. Every field is read and
# written with the GIL held; `_lock` serialises reading the sampler, `_cv`
# carries the wake-ups (a batch completed, room in the window, a new epoch,
# close). Every wait is a timed slice that re-checks close().

# A stage's key range (n_keys) when keys are not dataset indices to check:
cdef enum:
    KEYS_ANY = -1          # prefetch.map's items; sample_rng()'s index is the item's position
    KEYS_UNCHECKED = -2    # a framework loader's sampler: any index object goes to load() as
                           # its own __getitem__ takes it; sample_rng()'s index is the key


cdef _check_key(key, Py_ssize_t n_keys):
    """``key`` is a dataset index: an int (or a numpy or framework integer) in [0, n_keys)."""
    index = _as_index(key)
    if index is None:
        raise TypeError(f"the sampler yielded {key!r} ({type(key).__name__}); a sample index "
                        "must be an int")
    if not 0 <= index < n_keys:
        raise IndexError(f"the sampler yielded index {key}, out of range for a dataset of length {n_keys}")


@cython.final
cdef class _StageHooks:
    """What a drop-in or a stream gives its map stage; by keyword, all optional."""

    def __cinit__(self, *, per_thread=None, Py_ssize_t lookahead=0, bint go_on=False, remedy=None,
                  bint gil_noticed=False, on_notice=None, bint stream=False):
        self.per_thread, self.lookahead, self.go_on, self.remedy = per_thread, lookahead, go_on, remedy
        self.gil_noticed, self.on_notice, self.stream = gil_noticed, on_notice, stream


@cython.final
cdef class _MapStage(_ThreadWork):
    """A Loader's or map's threads, epochs and assembly: its _ThreadWork, and the Loader's calls."""

    def __cinit__(self, load, _Assembly asm, options, worker_init, seed, tuple on_thread, auto,
                  _StageHooks hooks not None):
        """``options``: the loader's Options; ``auto``: workers="auto"'s (max_threads, cpus)."""
        self.load, self.asm, self.worker_init, self.seed = load, asm, worker_init, seed
        self.on_thread = on_thread
        self.name, self.ordered, self.depth, self.hooks = options.name, options.ordered, options.depth, hooks
        self._lock = threading.Lock()
        # Re-entrant: a signal handler may call close() while its thread holds it.
        self._cv = threading.Condition(threading.RLock())
        self.crew = _LoaderThreads(self.name, self._cv)
        self.epochs = _Epochs(options.max_bytes, hooks.lookahead)
        self.n_keys = KEYS_ANY
        self.gauge = _Gauge(self.name, hooks.remedy, hooks.gil_noticed)
        if auto is not None:
            self.tuner = _Tuner(*auto)

    # The Loader's calls (consumer side, GIL held).
    def start_epoch(self, batches, Py_ssize_t epoch, Py_ssize_t n_keys, int threads,
                    Py_ssize_t batch_rows, order=None, following=None):
        """Begins epoch ``epoch`` over ``batches`` (an iterator of key lists) on ``threads``
        threads (auto: as the last epoch ended); returns its _Core's stage (_Epochs.begin, set_keys)."""
        cdef _EpochBatches e
        if self.tuner is not None:
            threads = max(self.target, 1)
            self.tuner.restart()
        self.gauge.restart("the stream's next()" if self.hooks.stream
                           else "the mapped function" if n_keys == KEYS_ANY else "dataset[i]")
        with self._cv:
            if self.closed:
                raise ClosedError(f"loader {self.name!r} is closed")
            e = self.epochs.begin(epoch, order)
            self.n_keys = n_keys
            self.asm.new_epoch()   # per epoch, as the core's counters of the batches
        # Not under _cv: Thread.start() may run a signal handler that calls close().
        # No keys until every thread has started: they find the work at once.
        self._set_threads(threads, batch_rows)
        if self.hooks.stream:   # a stream's (workers, turn), and its cap
            batches = (*batches, 0 if self.ordered else self.epochs.ahead.lookahead or self.epochs.window)
        with self._cv:
            if self.closed:   # by a signal handler inside Thread.start(), or another thread
                raise ClosedError(f"loader {self.name!r} was closed while its epoch started")
            self.epochs.set_keys(e, batches, following)
            self._notify()
        return _MapEpoch(self, e)

    def drop_following(self):
        """What opened early of an epoch not coming next (set_epoch, load_state_dict) is dropped."""
        with self._cv:
            self.epochs.drop_after()
            self._notify()

    cdef _set_threads(self, int threads, Py_ssize_t batch_rows):
        """``threads`` threads claim work (more may be parked: workers="auto"), the
        missing ones started; without _cv or _lock held (_LoaderThreads.ensure)."""
        # A row open for every thread, and a batch more that a thread finishing one finds open.
        self.epochs.window = (2 * threads if self.hooks.stream   # a slot per worker, and its next
                              else max(2, (threads + batch_rows - 1) // batch_rows + 1))
        self.asm.keep_batches = self.epochs.window + self.depth + 2   # open, in the ring, held by the user
        self.target = threads
        self.rows = batch_rows
        self.crew.ensure(threads, self)

    def close(self, double grace=CLOSE_GRACE_S):
        """Stops and joins every thread (at most ``grace`` s in all); idempotent."""
        with self._cv:
            self.closed = True
            self.epochs.close()
            self._notify()
        self.crew.close(grace)
        self.asm.close()

    def stats(self):
        """The stage's fields of Stats, over every epoch."""
        return dict(workers=self.target, load_s=self.crew.load_ns / 1e9, loader_idle_s=self.idle_ns / 1e9,
                    samples=self.samples, tune_reason="" if self.tuner is None else self.tuner.reason,
                    **self.gauge.counts(), **self.asm.counts())

    @property
    def threads(self):   # thread numbers in use
        return len(self.crew.contexts)

    @property
    def gil_noticed(self):   # the GIL notice was made (or given before this stage)
        return self.gauge.noticed

    # The loader threads' work (_ThreadWork).
    cdef object thread_load(self, _ThreadContext t):
        cdef _EpochBatches now
        per_thread = self.hooks.per_thread
        try:
            t.info = WorkerInfo(t.wid, self.target, self.seed, self.epochs.now.epoch)
            for apply in self.on_thread:
                apply()
            if self.hooks.stream:   # this thread's worker of the stream
                t.reader = per_thread(t.wid)
                t.info = WorkerInfo(t.wid, self.target, self.seed, t.info.epoch, t.reader.dataset)
            # its worker's, or this thread's own dataset's (made before worker_init)
            load = (t.reader.sample if t.reader is not None else self.load if per_thread is None
                    else per_thread(t.wid).__getitem__)
            if self.worker_init is not None:
                self.worker_init(t.wid)
        except BaseException as exc:   # the epoch ends with it (the thread wakes the publisher)
            now = self.epochs.now
            _noted(exc, f"raised while starting loader thread {self.name}-w{t.wid} (worker_init({t.wid}))")
            now.fail(exc, now.taken)
            return None
        return load

    cdef _Batch claim(self, _ThreadContext t, Py_ssize_t *row):
        """The batch and row this thread loads next, in sampler order (a stream's: of its
        worker's batches); None once closed. A thread past the target count is parked."""
        cdef _Batch b
        cdef int64_t t0, ready
        cdef _Epochs epochs = self.epochs
        cdef bint stream = self.hooks.stream, opened = False
        while True:
            if self.closed:
                return None
            if t.wid >= self.target:
                with self._cv:
                    if not self.closed and t.wid >= self.target:
                        self._cv.wait(WAIT_SLICE_S)
                continue
            b = self._stream_row(t, row) if stream else epochs.claim_row(row)
            if b is not None:
                return b
            if epochs.to_open() is not None:
                with self._lock:   # one thread reads the sampler at a time
                    opened = epochs.open_next(self.asm, self.name)
                if not opened or stream:   # the end, an error (this frame holding it no more),
                    self.wake()            # a stream's slot: its worker may wait
                continue
            t0 = pf_now_ns()
            ready = 0
            with self._cv:
                if not self.closed and epochs.to_open() is None and not (
                        epochs.now.slot_of(t.wid) is not None if stream else epochs.has_rows()):
                    ready = self.crew.wait_for_work(t)
            self.idle_ns += pf_now_ns() - t0 - ready

    cdef _Batch _stream_row(self, _ThreadContext t, Py_ssize_t *row):
        """A stream's: the next row of the batch this thread's worker read last, else of the
        one it reads into its next slot, whose place that batch takes (no rows, its stream
        ended, leave a hole; the stream's error is the slot's, and its end); None where it
        has none (or left a hole)."""
        cdef _Batch b = t.filling, slot
        cdef _EpochBatches e = self.epochs.now
        cdef int64_t t0
        if b is None or t.filling_row >= b.n or self.epochs.epoch_of(b) is None:
            t.filling, t.filling_row = None, 0
            slot = e.slot_of(t.wid)
            if slot is None:
                return None
            keys, ended, failure = None, True, None
            if not e.ended[t.wid]:
                t0 = pf_now_ns()
                t.busy(f"the stream's batch {slot.k + 1}", t0)
                keys, ended, failure = t.read_stream(e.epoch, len(e.ended), self.seed, self.name)
                t.busy(None, 0)
                self.crew.load_ns += pf_now_ns() - t0
            with self._cv:
                if self.epochs.epoch_of(slot) is not e:
                    return None   # dropped meanwhile
                b = t.filling = e.slot_read(self.asm, slot, t.wid, keys, ended, t.reader.state, failure,
                                            not self.hooks.go_on)
                self._notify()
            if b is None:
                return None
        row[0] = t.filling_row
        t.filling_row += 1
        return b

    cdef object key_of(self, _Batch b, Py_ssize_t row, _ThreadContext t):
        cdef _EpochBatches e = self.epochs.epoch_of(b)
        if e is None or b.k >= e.stop_k:
            return _SKIP
        key = b.keys[row]
        # sample_rng's index: the dataset index, or the item's position for map
        t.loads(e.epoch, b.k if self.n_keys == KEYS_ANY else key, self.seed, self.target)
        return key

    cdef void check_key(self, key) except *:
        if self.n_keys >= 0:
            _check_key(key, self.n_keys)

    cdef void failed(self, _Batch b, Py_ssize_t row, _ThreadContext t, exc, str what) except *:
        cdef _EpochBatches e = self.epochs.epoch_of(b)
        self.asm.fail(b, row, t.wid, exc, what)
        if e is not None and not self.hooks.go_on:
            e.stop_after(b)   # no batch after it opens

    cdef void loaded(self, _Batch b, Py_ssize_t row, _ThreadContext t, sample) except *:
        cdef int64_t nbytes
        if b.failure is not None or self.epochs.epoch_of(b) is None:
            return
        try:
            nbytes = self.asm.take_sample(b, row, sample, t)
        except BaseException as exc:
            self.failed(b, row, t, exc, "collating")
            return
        if nbytes >= 0:
            self._sized(b, nbytes)

    cdef void done(self, _Batch b, _ThreadContext t) except *:
        cdef _EpochBatches e
        cdef int64_t nbytes
        b.done += 1
        self.samples += 1
        if b.done < b.n:
            return
        e = self.epochs.epoch_of(b)
        if e is not None:
            nbytes = self.asm.finish(b, t)
            if nbytes >= 0:
                self._sized(b, nbytes)
            if b.failure is not None and not self.hooks.go_on:
                e.stop_after(b)
        b.complete = True
        self.wake()

    cdef void wake(self):
        with self._cv:
            self._notify()

    cdef void _notify(self):
        """Wakes every thread waiting on the condition (held). Where there is work, the
        threads waiting for it are noted woken: the gauge counts their wait to run it."""
        if self.epochs.has_rows() or self.epochs.to_open() is not None:
            self.crew.woken(pf_now_ns())
        self._cv.notify_all()

    cdef _sized(self, _Batch b, uint64_t nbytes):
        """``b``'s size is known: its bytes replace the estimate held for it (no cap:
        nothing to recount, nobody waits for room; no batching meets this per sample)."""
        if self.epochs.ahead.max_bytes == 0:
            b.held = nbytes
            return
        with self._cv:
            self.epochs.ahead.resize(b, nbytes, self.epochs.epoch_of(b) is not None)
            self._notify()   # an estimate now exists: more batches may open


@cython.final
cdef class _MapEpoch(_Stage):
    """One epoch of a _MapStage, as the stage of that epoch's _Core."""

    def __cinit__(self, _MapStage stage, _EpochBatches e):
        self.stage = stage
        self.e = e
        self.order = []
        self.streamed = []

    cdef int produce(self, _Parts parts) except -1:
        """The next batch of this epoch (in order, or the first complete one)
        into ``parts``; P_END at its end; P_FAILED with the error in
        self.failure; P_STOPPED once the epoch was abandoned or the stage closed."""
        cdef _MapStage st = self.stage
        cdef _EpochBatches e = self.e
        cdef _Batch b = None
        cdef int64_t t0
        while True:
            if st.closed or e is not st.epochs.now:
                return P_STOPPED
            b = e.next_complete(st.ordered)
            if b is not None and b.n == 0 and b.failure is None:
                # A stream's hole (its worker had ended): its room is let go.
                e.take(b, False)
                with st._cv:
                    st.epochs.ahead.consumed(True, b.held)
                    st._notify()
                continue
            if b is not None:
                break
            if e.at_end():
                self.failure = e.take_failure()
                return P_END if self.failure is None else P_FAILED
            t0 = pf_now_ns()
            if st.gauge.due(t0, st.crew):
                st.gauge.end_window(t0, st.crew, st.target)
            with st._cv:
                if e is st.epochs.now and not st.closed:
                    st._cv.wait(WAIT_SLICE_S)
            st.wait_ns += pf_now_ns() - t0
        e.take(b, not st.hooks.go_on)
        st.wake()      # room in the window
        self._measure()   # after: the gauge's probe watches the threads at work
        if b.worker >= 0:
            self.streamed.append((b.worker, b.part))
            b.part = None
        if b.failure is not None:
            # Handed on once, and not kept: the stage outlives the consumer's
            # frames, which the error's traceback holds.
            self.failure, b.failure = b.failure, None
            with st._cv:
                st.epochs.ahead.release(b.held)
            return P_BATCH_FAILED if st.hooks.go_on else P_FAILED
        if not st.ordered:
            self.order.append(b.k)
        st.asm.hand(b, parts)
        return P_BATCH

    cdef void _measure(self) except *:
        """After each batch taken: the gauge's window, then the tuner's, which
        reads the gauge's verdict on it; a new thread count starts new ones."""
        cdef int threads
        cdef int64_t now = pf_now_ns()
        cdef _MapStage st = self.stage
        if st.gauge.due(now) or st.tuner is not None and st.tuner.due(now):
            st.gauge.end_window(now, st.crew, st.target)
        if st.tuner is None:
            return
        threads = st.tuner.after_batch(st.target, st.samples, st.wait_ns, st.gauge)
        if threads != st.target:
            st._set_threads(threads, st.rows)
            st.wake()   # parked threads' turn
            st.gauge.end_window(pf_now_ns(), st.crew, threads)

    cdef void taken(self, uint64_t nbytes):
        cdef _MapStage st = self.stage
        if st.hooks.on_notice is not None:   # a verdict reached while it waited: to the drop-in now
            self.before_take()
        if st.epochs.ahead.bounded():
            with st._cv:   # no longer held ahead
                st.epochs.ahead.consumed(self.e is st.epochs.now, nbytes)
                st._notify()

    cdef int before_take(self) except -1:
        note = self.stage.gauge.take_notice()
        if note is not None and self.stage.hooks.on_notice is not None:
            self.stage.hooks.on_notice(note)   # consumer thread: the drop-in says what it does about it
        elif note is not None:
            _warn.warn_consumer(note, GILBoundWarning)   # at the user's line; nothing is taken yet
        return 0

    cdef bint on_own_thread(self):
        cdef _ThreadContext t = _calling_thread()
        return t is not None and t.work is self.stage

    cdef object device(self):
        return self.stage.asm.delivery

    def stop(self):
        """Its core closes: its work is dropped, not the next epoch's."""
        with self.stage._cv:
            self.stage.epochs.abandon(self.e)
            self.stage._notify()

    def doing(self):
        return "waiting for its loader threads: " + self.stage.crew.describe()

    def counts(self):
        return self.stage.stats()


# For prefetch/loader.py: what the stage does with samples.
MAP_STACK = M_STACK
MAP_CUSTOM = M_CUSTOM
MAP_SINGLE = M_SINGLE
MAP_KEYS_UNCHECKED = KEYS_UNCHECKED
