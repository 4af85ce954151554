# _threads.pxi (included by _core.pyx): the loader threads of a map stage.
#
# Each runs _run: claim a row of the stage, load its sample, hand it to the
# stage's assembly, until the stage closes; the threads hold the stage, the
# stage holds them, nothing else does. They are started, and a thread whose worker_init failed is replaced, with no
# lock held: Thread.start() waits for the new thread, and the main thread runs
# signal handlers meanwhile (a SIGTERM handler may call close()). The stage's
# condition carries the handshake with close(): no thread starts unjoined
# after close() listed the threads it joins. Persist across epochs.

@cython.final
cdef class _LoaderThreads:
    cdef object name               # the loader's: threads are "<name>-w<number>"
    cdef object _cv                # the stage's condition (re-entrant)
    cdef list _threads             # the threads close() joins
    cdef list _gone                # per thread number: its thread has left (worker_init failed)
    cdef list _starters            # idents of the threads inside ensure()'s Thread.start()
    cdef bint _listed              # close() has taken the list of threads it joins
    cdef bint closed
    cdef readonly int count        # thread numbers in use (started, or gone and replaced later)
    cdef list busy_since           # per thread: pf_now_ns() when its load began, 0 when idle
    cdef list busy_key             # per thread: the key it loads
    cdef list clocks               # per thread: its CPU clock id (None: none), for the gauge
    cdef list tids                 # per thread: its kernel thread id (None: not started), for the gauge

    def __cinit__(self, name, cv):
        self.name = name
        self._cv = cv
        self._threads = []
        self._gone = []
        self._starters = []
        self.busy_since = []
        self.busy_key = []
        self.clocks = []
        self.tids = []

    cdef void ensure(self, int n, _MapStage stage) except *:
        """Threads numbered 0 .. n - 1 load for ``stage``: the missing ones
        start, each number once per call (a replacement whose worker_init
        fails again is replaced by the next call, not by this one)."""
        cdef int wid
        me = threading.get_ident()
        todo = [wid for wid in range(min(self.count, n)) if self._gone[wid]]
        todo.extend(range(self.count, n))
        for wid in todo:
            # `closed` is read under _cv, and close() waits for the threads
            # being started by others before it lists the threads it joins.
            with self._cv:
                if self.closed:
                    return
                if wid < self.count:
                    if not self._gone[wid]:
                        continue   # another call (the autotuner's, an epoch's) started it
                    self._gone[wid] = False
                else:
                    self.busy_since.append(0)
                    self.busy_key.append(None)
                    self.clocks.append(None)
                    self.tids.append(None)
                    self._gone.append(False)
                    self.count += 1
                self._starters.append(me)
            t = None
            join = False
            try:
                t = threading.Thread(target=self._run, args=(stage, wid), name=f"{self.name}-w{wid}",
                                     daemon=True)
                t.start()
            finally:
                with self._cv:
                    self._starters.remove(me)
                    if t is not None:
                        self._threads.append(t)
                    # A close() already past its list ran inside t.start(), on
                    # this thread (a signal handler): t is this call's to join.
                    join = self._listed
                    self._cv.notify_all()
            if join and t is not None:
                _join_or_warn((t,), CLOSE_GRACE_S, f"loader {self.name!r}", _inside_dataset)

    def _run(self, _MapStage st, int wid):
        """Loader thread ``wid``: claim a row, load its sample, hand it to the
        stage's assembly, mark it done; until the stage closes."""
        cdef _Batch b
        cdef _EpochBatches e
        cdef Py_ssize_t row = 0
        cdef int64_t t0
        cdef size_t layout_bytes = 0
        cdef Py_ssize_t epoch = st.now.epoch
        cdef unsigned fork_epoch = pf_fork_epoch()
        _tls.info = WorkerInfo(wid, st.target, st.seed, epoch)
        _tls.stage = st
        self.clocks[wid] = _this_thread_clock()
        self.tids[wid] = threading.get_native_id()
        try:
            failed = False
            load = st.load
            try:
                for apply in st.on_thread:
                    apply()
                if st.per_thread is not None:
                    load = st.per_thread(wid)   # this thread's own dataset, before worker_init
                if st.worker_init is not None:
                    st.worker_init(wid)
            except BaseException as exc:
                st._fail_thread(wid, exc)
                failed = True
            if failed:
                self.gone(wid)   # the next _set_threads starts another in its place
                # Woken only now that this frame holds the error no more: the
                # consumer's frames join its traceback once it is raised there.
                st._wake_all()
                return
            while True:
                b = None   # not held while this thread waits: it may be dropped meanwhile
                b = st._claim(wid, &row)
                if b is None:
                    return
                key = b.keys[row]
                e = st.epoch_of(b)
                if e is None or b.k >= e.stop_k:
                    st._row_done(b)   # dropped, or an earlier batch failed: never taken
                    continue
                if epoch != e.epoch:   # the next epoch's batches may open before it starts
                    epoch = e.epoch
                    _tls.info = WorkerInfo(wid, st.target, st.seed, epoch)
                e = None
                # sample_rng's index: the dataset index, or the item's position for map
                _tls.sample = (st.seed, epoch, b.k if st.n_keys == KEYS_ANY else key)
                t0 = pf_now_ns()
                self.busy(wid, key, t0)
                sample = None
                try:
                    if st.n_keys >= 0:
                        _check_key(key, st.n_keys)
                    sample = load(key)
                except BaseException as exc:
                    if fork_epoch != pf_fork_epoch():
                        raise   # in a child forked inside load: its own exception (sys.exit())
                    st._row_failed(b, row, key, wid, exc, "loading")
                if fork_epoch != pf_fork_epoch():
                    # load(key) forked and this is the child, on this thread's
                    # stack: the stage, its locks and the pool belong to the
                    # parent's threads. Touch none of them; this thread, the
                    # child's only one, ends here, and the child with it.
                    return
                st.load_ns += pf_now_ns() - t0
                self.busy(wid, None, 0)
                _tls.sample = None
                if b.failure is None and st.epoch_of(b) is not None:
                    try:
                        if st.asm.take_sample(b, row, sample, &layout_bytes):
                            st._laid_out(b, layout_bytes)
                    except BaseException as exc:
                        st._row_failed(b, row, key, wid, exc, "collating")
                sample = None   # before the next load: a dataset may check its buffer is free
                st._row_done(b)
        finally:
            _tls.info = None
            _tls.stage = None

    cdef void gone(self, int wid):
        """Thread ``wid`` left (its worker_init failed): the next ensure() replaces it."""
        self._gone[wid] = True

    cdef void busy(self, int wid, key, int64_t since):
        """Thread ``wid`` loads ``key`` since ``since`` (0: it is idle)."""
        self.busy_since[wid] = since
        self.busy_key[wid] = key

    cdef int64_t busy_ns(self, int64_t now):
        """The time the threads have spent inside loads still running, summed."""
        cdef int64_t total = 0
        cdef int w
        for w in range(self.count):
            since = self.busy_since[w]
            if since:
                total += now - <int64_t>since
        return total

    cdef str describe(self):
        cdef int64_t now = pf_now_ns()
        busy = [f"thread {self.name}-w{w} inside load({self.busy_key[w]!r}) for "
                f"{(now - self.busy_since[w]) / 1e9:.1f} s"
                for w in range(self.count) if self.busy_since[w]]
        return "; ".join(busy) if busy else "none is loading"

    cdef void close(self, double grace) except *:
        """Joins every thread within ``grace`` s (the caller has woken them:
        they see the stage closed and leave); warns about those still inside
        the dataset, left as daemon threads."""
        cdef int64_t deadline = pf_now_ns() + <int64_t>(grace * 1e9)
        ident = threading.get_ident()
        with self._cv:
            self.closed = True
            # Threads another thread is starting are joined too (they see
            # `closed` and leave). One this thread is starting (close() from a
            # signal handler inside that Thread.start()) its starter joins.
            while any(s != ident for s in self._starters) and pf_now_ns() < deadline:
                self._cv.wait(WAIT_SLICE_S)
            threads, self._threads = self._threads, []
            self._listed = True
        # A signal handler's close() may run while its thread holds _cv (inside
        # start_epoch, abandon, ...): the threads need it to leave, so that
        # hold is let go for the join and taken back after it.
        held = self._cv._release_save() if self._cv._is_owned() else None
        try:
            _join_or_warn(threads, max(0.0, (deadline - pf_now_ns()) / 1e9), f"loader {self.name!r}",
                          _inside_dataset)
        finally:
            if held is not None:
                self._cv._acquire_restore(held)


cdef str _inside_dataset(thread):
    return "inside the dataset"
