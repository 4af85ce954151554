# _gauge.pxi (included by _core.pyx): do a map stage's threads run in parallel?
#
# The publisher measures windows (>= 50 ms, closed at a batch taken): the
# threads' time inside load(key), per second the threads busy on average,
# and the CPU time the loader threads used (each thread's own CPU clock, read
# once per window, never per sample). Where >= 1.25 threads were busy and
# they used some CPU (threads sleeping on I/O hold no GIL) but less than one
# each (else they ran in parallel), it probes the GIL: holding it, it watches
# the threads' CPU clocks for 2 ms; a thread running numpy, a decoder or any
# code that released the GIL runs on, a thread that needs the GIL stops
# (sleeps: one that is runnable, state R, waits for a CPU that other
# processes hold, not for the GIL). If none ran, it lets the GIL go: one that waited for it runs at once (one
# sleeping on I/O would not). Both: the threads wait for the GIL. The probe
# costs the loader at most 2 ms of GIL per window, and only the first 8
# probes come every window, then every 4th judged window (the others reuse
# its verdict). Thread CPU clocks, not a GIL hand-over time: with two
# threads taking turns, a hand-over comes at any moment.
#
# A serialized window's parallelism is the CPUs the loader threads used,
# counted as at least one (one of them held the GIL throughout; fewer CPUs
# means other processes took the rest); the rest of their busy time went
# waiting for each other. In any other window the parallelism is the busy
# threads. Limitation: a dataset[i] that sleeps on I/O about as long as it
# runs Python also keeps two threads waiting for the GIL in turn, and shows
# a parallelism of 1 where 2 run.
#
# The notice (a GILBoundWarning, raised on the consumer's thread by
# _MapEpoch.before_take, once per stage): 3 probes or more, at least 3/4 of
# all probes serialized (a CPU starved by other processes can fool one probe,
# rarely 3/4 of them), and a parallelism over the serialized windows under
# 0.65 x min(threads, CPUs); or a failed workers="auto" trial whose window
# was serialized. Never where the process may use one CPU only. Called by
# the map stage (_MapStage.measure) on the publisher thread, but the
# notice's hand-over (take_notice); it calls nothing back.



cdef double SERIAL_BUSY = 1.25      # threads busy on average, at least, to judge a window
cdef double SERIAL_FRACTION = 0.65  # warn below this share of min(threads, CPUs)
cdef unsigned GIL_HOLD_US = 2000     # the probe holds the GIL this long at most
cdef unsigned GIL_LET_GO_US = 10000  # then lets it go, until a loader thread ran, at most this
cdef int64_t GIL_RAN_NS = 200 * 1000  # a thread ran (one leaving a short GIL-free step runs less)
cdef double SURE_SHARE = 0.75       # the notice: at least this share of the probes found waiting
cdef int PROBES_SURE = 8            # probes after which ...
cdef int PROBE_EVERY = 4            # ... only every 4th judged window probes
cdef int64_t GAUGE_WINDOW_NS = 50 * 1000 * 1000
cdef bint _THREAD_CLOCKS = hasattr(time, "pthread_getcpuclockid")


cdef double _cpu_s(clocks) except? -1.0:
    """CPU seconds used by the threads whose CPU clocks are ``clocks`` (ids,
    None for a thread without one); without per-thread clocks, the process's."""
    if not _THREAD_CLOCKS:
        return time.process_time()
    cdef double total = 0.0
    for clock in clocks:
        if clock is not None:
            try:
                total += time.clock_gettime(clock)
            except OSError:
                pass   # the thread has ended (worker_init failed): its time is no longer read
    return total


cdef object _this_thread_clock():
    """The calling thread's CPU clock id, or None where there is none."""
    if not _THREAD_CLOCKS:
        return None
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except OSError:
        return None


cdef bint _waiting_for_the_gil(clocks, tids) except -1:
    """True when the loader threads (their CPU clocks: ``clocks``, their
    kernel thread ids: ``tids``) wait for the GIL: while this thread holds
    it, none of them runs (no clock moves GIL_RAN_NS in GIL_HOLD_US; one
    running numpy, a decoder or any code that released the GIL would) and
    none is runnable (a thread that waits for the GIL sleeps; a runnable one
    waits for a CPU that other processes hold, and would run numpy there),
    and once it is let go one of them runs within GIL_LET_GO_US (one waited
    for it, rather than sleeping on I/O)."""
    cdef clockid_t ids[64]
    cdef int64_t start[64]
    cdef int n = 0
    cdef bint ran
    for c in clocks:
        if c is not None and n < 64:
            ids[n] = <clockid_t>c
            n += 1
    if n == 0:
        return False
    _clocks_now(ids, start, n)
    if _ran(ids, start, n, GIL_HOLD_US):    # holding the GIL (this is not a nogil block)
        return False
    for tid in tids:
        if tid is not None and _runnable(<int>tid):   # still holding it: read with no Python I/O
            return False
    with nogil:
        _clocks_now(ids, start, n)
        ran = _ran(ids, start, n, GIL_LET_GO_US)
    return ran


cdef bint _runnable(int tid) noexcept:
    """Whether thread ``tid`` of this process is runnable (state R in
    /proc/self/task/<tid>/stat); False where that cannot be read. Plain C
    calls, so the GIL is not let go meanwhile."""
    cdef char path[64]
    cdef char buf[256]
    cdef ssize_t n
    cdef int fd
    cdef char *paren
    snprintf(path, sizeof(path), b"/proc/self/task/%d/stat", tid)
    fd = c_open(path, O_RDONLY)
    if fd < 0:
        return False
    n = c_read(fd, buf, sizeof(buf) - 1)
    c_close(fd)
    if n <= 0:
        return False
    buf[n] = 0
    paren = strrchr(buf, 41)    # ')': the command name before it may hold anything
    return paren != NULL and paren[1] == 32 and paren[2] == 82   # ") R"


cdef void _clocks_now(clockid_t *ids, int64_t *out, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        out[i] = _clock_ns(ids[i])


cdef bint _ran(clockid_t *ids, int64_t *start, int n, unsigned within_us) noexcept nogil:
    """Whether one of the clocks moved GIL_RAN_NS past ``start`` within
    ``within_us``; the CPU is yielded between looks (a sleep of microseconds
    may last milliseconds)."""
    cdef int64_t deadline = pf_now_ns() + <int64_t>within_us * 1000
    cdef int i
    while True:
        for i in range(n):
            if start[i] >= 0 and _clock_ns(ids[i]) - start[i] >= GIL_RAN_NS:
                return True
        if pf_now_ns() >= deadline:
            return False
        sched_yield()


cdef inline int64_t _clock_ns(clockid_t clock) noexcept nogil:
    cdef timespec ts
    if clock_gettime(clock, &ts) != 0:
        return -1
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


@cython.final
cdef class _Gauge:

    def __cinit__(self, name, remedy=None, bint noticed=False):
        """``remedy``: a drop-in's framework loader, named in the notice;
        ``noticed``: the notice was given already (by a drop-in's earlier loader)."""
        self.name = name
        self.what = "dataset[i]"
        self.remedy = remedy or ("a process-based loader (one whose workers are processes), wrapped in "
                                 "prefetch.Prefetcher to keep the same batch guarantees")
        self.noticed = noticed

    cdef void restart(self, bint mapped):
        """A new epoch (``mapped``: of prefetch.map, whose threads call a
        function): the next batch starts a window."""
        self.t0 = 0
        self.what = "the mapped function" if mapped else "dataset[i]"

    cdef bint due(self, int64_t now):
        """The batch being taken closes a window."""
        return self.t0 == 0 or now - self.t0 >= GAUGE_WINDOW_NS

    cdef int after_batch(self, int64_t now, int64_t busy_ns, clocks, tids, int threads) except -1:
        """Called when due(), when the tuner's window closes and when the
        thread count changed: ends the window at ``now`` (``busy_ns``: the
        threads' total time inside load() so far, ``clocks`` their CPU clocks)
        and starts the next one. A window of another thread count than
        ``threads``, or under 10 ms, is dropped."""
        cdef double wall, busy, cpu, par
        cdef bint serialized = False
        cdef double cpu_now = _cpu_s(clocks)
        if threads != self.threads:
            self.skip = 0   # the first judged window of a new count is probed
        elif self.t0 != 0 and now - self.t0 >= GAUGE_WINDOW_NS // 5:
            wall = (now - self.t0) / 1e9
            busy = (busy_ns - self.busy0) / 1e9 / wall
            cpu = (cpu_now - self.cpu0) / wall
            par = busy
            # Judged where two threads or more were busy. Probed only where
            # they used some CPU (threads sleeping on I/O hold no GIL) but
            # less than one each (else they ran in parallel).
            if threads >= 2 and busy >= SERIAL_BUSY and 0.2 <= cpu < 0.9 * busy:
                if self.skip:
                    self.skip -= 1
                    serialized = self.last_probe
                else:
                    serialized = self._probe(clocks, tids)
                if serialized:
                    par = min(busy, max(cpu, 1.0))
            self.wall_s += wall
            self.busy_s += busy * wall
            self.par_s += par * wall
            self.wait_s += (busy - par) * wall
            self.last_serialized, self.last_threads = serialized, threads
            self.last_busy, self.last_par = busy, par
            if serialized:
                self.ser_wall_s += wall
                self.ser_busy_s += busy * wall
                self.ser_par_s += par * wall
                par = self.ser_par_s / self.ser_wall_s
                # Low in the windows where a probe caught them waiting, and low
                # over all windows so far: a decoder whose Python part makes the
                # threads queue now and then (the image pipeline, about 1.7 at a
                # time overall, 1.2 in the windows caught) is not GIL-bound.
                if (self.probes_ser >= 3 and self.probes_ser >= SURE_SHARE * self.probes
                        and not self.noticed and par < SERIAL_FRACTION * min(threads, usable_cpus())
                        and self.par_s / self.wall_s < SERIAL_FRACTION * min(threads, usable_cpus())):
                    self._make_notice(threads, par, 1.0 - self.ser_par_s / self.ser_busy_s, None)
        self.t0 = now
        self.busy0 = busy_ns
        self.cpu0 = cpu_now
        self.threads = threads
        return 0

    cdef bint _probe(self, clocks, tids) except -1:
        """One probe of the GIL, counted; once PROBES_SURE were made, only every
        PROBE_EVERY-th judged window probes (the others reuse its verdict)."""
        self.last_probe = _waiting_for_the_gil(clocks, tids)
        self.probes += 1
        self.probes_ser += self.last_probe
        if self.probes >= PROBES_SURE:
            self.skip = PROBE_EVERY - 1
        return self.last_probe

    cdef bint trial_failed(self, int tried, int kept, double speedup) except -1:
        """workers="auto" tried ``tried`` threads and goes back to ``kept``: ``speedup`` is the measured rate over the
        rate before. True when the threads took turns on the GIL in that trial:
        its last window was serialized (the notice is made). No more probes
        are made here: the publisher is not taking batches meanwhile, so the
        threads soon wait for room rather than for the GIL."""
        if not (self.last_serialized and self.last_threads == tried):
            return False
        self._make_notice(tried, self.last_par, 1.0 - self.last_par / self.last_busy, (kept, speedup))
        return True

    cdef _make_notice(self, int threads, double par, double wait_share, trial):
        cdef int cpus
        if self.noticed:
            return
        cpus = usable_cpus()
        if cpus < 2:
            return   # one CPU: threads could not run in parallel anyway, nor processes
        self.noticed = True
        if trial is None:
            measured = f"its {threads} threads ran {self.what}"
        else:
            kept, speedup = trial
            measured = (f"{threads} threads loaded at {speedup:.2f} x the speed of {kept}, so it "
                        f"keeps {kept}; they ran {self.what}")
        message = (
            f"loader {self.name!r}: {measured} about {par:.1f} at a time, on a machine where this "
            f"process may use {cpus} CPUs ({wait_share:.0%} of their time inside it went waiting "
            f"for each other): {self.what} holds the GIL (it runs Python code), so threads take "
            f"turns. Run it in processes instead: {self.remedy}; or move the Python work out of "
            f"{self.what} (into numpy, or a library that releases the GIL). stats().load_parallelism "
            f"shows the figure.")
        note = GILBoundWarning(message)
        note.parallelism = par
        note.wait_share = wait_share
        note.threads = threads
        note.cpus = cpus
        note.speedup = None if trial is None else trial[1]
        self.notice = note

    cdef object take_notice(self):
        """The notice, once (consumer thread), or None."""
        note, self.notice = self.notice, None
        return note

    def counts(self):
        """The gauge's fields of Stats."""
        return dict(load_parallelism=self.par_s / self.wall_s if self.wall_s else 0.0,
                    load_wait_share=self.wait_s / self.busy_s if self.busy_s else 0.0)
