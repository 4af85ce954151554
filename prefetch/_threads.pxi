# _threads.pxi (included by _core.pyx): the loader threads of a map stage.
#
# Each runs _run against a small interface, _ThreadWork, that the map stage
# implements: claim a row, load its sample, hand it on (loaded, or failed),
# done; until the work closes. The threads count their own time inside
# load(); they hold the work, the work holds them, nothing else does. They
# are started, and a thread whose worker_init failed is replaced, with no
# lock held: Thread.start() waits for the new thread, and the main thread runs
# signal handlers meanwhile (a SIGTERM handler may call close()). The stage's
# condition carries the handshake with close(): no thread starts unjoined
# after close() listed the threads it joins. Persist across epochs.

cdef object _SKIP = object()   # key_of(): the row is not loaded (its batch was dropped)
cdef int64_t WAITING = -1      # woken_at: the thread waits for work


cdef class _ThreadWork:
    """What loader threads work for: the map stage implements each method.
    Loader threads only, GIL held; wake() from any thread."""

    cdef object thread_load(self, _ThreadContext t):
        """Thread ``t`` starts: its load(key); None where its set-up raised
        (the work keeps the error): it leaves."""
        raise NotImplementedError

    cdef _Batch claim(self, _ThreadContext t, Py_ssize_t *row):
        """The batch and row thread ``t`` loads next (waits); None once closed."""
        raise NotImplementedError

    cdef object key_of(self, _Batch b, Py_ssize_t row, _ThreadContext t):
        """The key to load for that row, or _SKIP."""
        raise NotImplementedError

    cdef void check_key(self, key) except *:
        """Raises for a key out of the dataset's range (that row's error)."""

    cdef void failed(self, _Batch b, Py_ssize_t row, _ThreadContext t, exc, str what) except *:
        """That row's ``exc``, raised while ``what`` ("loading", "collating")."""

    cdef void loaded(self, _Batch b, Py_ssize_t row, _ThreadContext t, sample) except *:
        """That row's sample, on the thread that loaded it."""

    cdef void done(self, _Batch b, _ThreadContext t) except *:
        """A row of ``b`` is finished (loaded, failed or skipped) on thread ``t``."""

    cdef void wake(self):
        """Wake whoever waits on the work."""


@cython.final
cdef class _LoaderThreads:

    def __cinit__(self, name, cv):
        self.name = name
        self._cv = cv
        self._threads = []
        self.contexts = []
        self._starters = []

    cdef void ensure(self, int n, _ThreadWork work) except *:
        """Threads numbered 0 .. n - 1 load for ``stage``: the missing ones
        start, each number once per call (a replacement whose worker_init
        fails again is replaced by the next call, not by this one)."""
        cdef int wid
        cdef _ThreadContext context
        me = threading.get_ident()
        todo = [wid for wid in range(min(len(self.contexts), n)) if (<_ThreadContext>self.contexts[wid]).gone]
        todo.extend(range(len(self.contexts), n))
        for wid in todo:
            # `closed` is read under _cv, and close() waits for the threads
            # being started by others before it lists the threads it joins.
            with self._cv:
                if self.closed:
                    return
                if wid < len(self.contexts) and not (<_ThreadContext>self.contexts[wid]).gone:
                    continue   # another call (the autotuner's, an epoch's) started it
                context = _ThreadContext(work, wid)
                if wid < len(self.contexts):
                    self.contexts[wid] = context
                else:
                    self.contexts.append(context)
                self._starters.append(me)
            t = None
            join = False
            try:
                t = threading.Thread(target=self._run, args=(work, context), name=f"{self.name}-w{wid}",
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

    def _run(self, _ThreadWork work, _ThreadContext t):
        """Loader thread ``t``: claim a row, load its sample, hand it to the
        work, until the work closes. Its time inside load() is counted here."""
        cdef _Batch b
        cdef Py_ssize_t row = 0
        cdef int64_t t0
        cdef unsigned fork_epoch = pf_fork_epoch()
        t.enter()
        t.clock = _this_thread_clock()
        t.tid = threading.get_native_id()
        try:
            load = work.thread_load(t)
            if load is None:
                t.gone = True   # the next ensure() starts another in its place
                # Woken only now that this frame holds the error no more: the
                # consumer's frames join its traceback once it is raised there.
                work.wake()
                return
            while True:
                b = None   # not held while this thread waits: it may be dropped meanwhile
                b = work.claim(t, &row)
                if b is None:
                    return
                key = work.key_of(b, row, t)
                if key is _SKIP:
                    work.done(b, t)   # dropped, or an earlier batch failed: never taken
                    continue
                t0 = pf_now_ns()
                t.busy(key, t0)
                sample = None
                try:
                    work.check_key(key)
                    sample = load(key)
                except BaseException as exc:
                    if fork_epoch != pf_fork_epoch():
                        raise   # in a child forked inside load: its own exception (sys.exit())
                    work.failed(b, row, t, exc, "loading")
                if fork_epoch != pf_fork_epoch():
                    # load(key) forked and this is the child, on this thread's
                    # stack: the work, its locks and the pool belong to the
                    # parent's threads. Touch none of them; this thread, the
                    # child's only one, ends here, and the child with it.
                    return
                self.load_ns += pf_now_ns() - t0
                t.busy(None, 0)
                t.sample = None
                work.loaded(b, row, t, sample)
                sample = None   # before the next load: a dataset may check its buffer is free
                work.done(b, t)
        finally:
            t.leave()

    # A thread woken from its wait for work needs the GIL to run again, and
    # where the dataset's Python holds it may wait a whole batch: the gauge
    # counts that wait as time at work, so that it sees the threads queue
    # (why: docs/loader.md, "Where threads lose", its last paragraph).

    cdef int64_t wait_for_work(self, _ThreadContext t) except -1:
        """Thread ``t`` waits for work a slice (the condition held): the time
        it then waited to run since woken (0: its wait timed out)."""
        cdef int64_t since
        t.woken_at = WAITING
        try:
            self._cv.wait(WAIT_SLICE_S)
        finally:
            since = t.woken_at
            t.woken_at = 0
        if since <= 0:
            return 0
        since = pf_now_ns() - since
        self.ready_ns += since
        return since

    cdef void woken(self, int64_t now):
        """The condition is notified at ``now`` (under it): the threads waiting for work wake."""
        cdef _ThreadContext t
        for t in self.contexts:
            if t.woken_at == WAITING:
                t.woken_at = now

    cdef int64_t at_work_ns(self, int64_t now):
        """The threads' time at work so far, summed: inside load(), or woken
        for work and waiting to run (the gauge's `busy`)."""
        cdef int64_t total = self.load_ns + self.ready_ns
        cdef _ThreadContext t
        for t in self.contexts:
            if t.busy_since:
                total += now - t.busy_since
            if t.woken_at > 0:
                total += now - t.woken_at
        return total

    cdef tuple clocks_and_tids(self, bint at_work):
        """The CPU clocks and kernel ids of the threads (the meter's), or
        with ``at_work`` of those at work now, inside load() or woken for it
        (the GIL probe's: a thread waiting for work waits for work, not for
        the GIL)."""
        cdef _ThreadContext t
        clocks, tids = [], []
        for t in self.contexts:
            if not at_work or t.busy_since or t.woken_at > 0:
                clocks.append(t.clock)
                tids.append(t.tid)
        return clocks, tids

    cdef str describe(self):
        cdef int64_t now = pf_now_ns()
        cdef _ThreadContext t
        busy = [f"thread {self.name}-w{t.wid} inside load({t.busy_key!r}) for {(now - t.busy_since) / 1e9:.1f} s"
                for t in self.contexts if t.busy_since]
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
                          _inside_dataset, waited=grace)
        finally:
            if held is not None:
                self._cv._acquire_restore(held)


cdef str _inside_dataset(thread):
    return "inside the dataset"
