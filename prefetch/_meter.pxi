# _meter.pxi (included by _core.pyx): what the gauge (_gauge.pxi) reads of the
# loader threads, and nothing it decides.
#
# Per window: the loader threads' CPU time (each thread's own CPU clock), their
# run-queue delay (Linux /proc/self/task/<tid>/schedstat, 2nd field: time
# runnable but not running, i.e. waiting for a CPU), and the whole process's CPU
# time. Read once per window on the publisher thread, never per sample. The
# probe of the GIL is here too. Where a figure cannot be read (no per-thread
# clocks, no /proc) it is None, and the gauge judges no window.
# `_METER` is a module-level Python name so that a test may put a scripted
# meter in its place (tests/core/test_loader_gil.py).

cdef bint _THREAD_CLOCKS = hasattr(time, "pthread_getcpuclockid")
cdef unsigned GIL_HOLD_US = 2000     # the probe holds the GIL this long, and on while a loader
cdef unsigned GIL_HOLD_MAX_US = 10000  # thread is runnable, up to this
cdef unsigned GIL_LET_GO_US = 10000  # then lets it go, until a loader thread ran, at most this
cdef unsigned GIL_WATCH_US = 2000    # then watches them this long, and on while one is runnable
cdef double GIL_PARALLEL = 1.5       # ... running this many at a time or more: not waiting
cdef int64_t GIL_RAN_NS = 200 * 1000  # a thread ran (one leaving a short GIL-free step runs less)


cdef object _this_thread_clock():
    """The calling thread's CPU clock id, or None where there is none."""
    if not _THREAD_CLOCKS:
        return None
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except OSError:
        return None


class _Meter:
    """Reads the loader threads' figures; a test's scripted meter has the same two methods."""

    def read(self, clocks, tids):
        """(cpu_s, runq_s, process_s) so far: the loader threads' CPU seconds
        (None without per-thread clocks), their seconds runnable but waiting
        for a CPU (None where /proc cannot tell), the process's CPU seconds.
        A thread that ended counts no more (its figures are no longer read)."""
        cdef int64_t runq = 0, one
        # The clock of a thread that has ended (worker_init failed) reads -1: none.
        cpu_s = (sum(max(_clock_ns(<clockid_t>c), 0) for c in clocks if c is not None) / 1e9
                 if _THREAD_CLOCKS else None)
        for tid in tids:
            if tid is not None:
                one = _runq_ns(<int>tid)
                if one == -2:   # no schedstat here: the gauge cannot tell CPU waits from GIL waits
                    return cpu_s, None, time.process_time()
                runq += max(one, 0)
        return cpu_s, runq / 1e9, time.process_time()

    def probe(self, clocks, tids):
        """True when the loader threads wait for the GIL, False when they do
        not, None when it cannot tell (see _waiting_for_the_gil)."""
        cdef int verdict = _waiting_for_the_gil(clocks, tids)
        return None if verdict < 0 else verdict == 1


_METER = _Meter()


cdef int64_t _runq_ns(int tid) noexcept:
    """Thread ``tid``'s run-queue delay so far (ns: time runnable, waiting for
    a CPU; the 2nd field of /proc/self/task/<tid>/schedstat, which the kernel
    adds to when the thread next runs); -1 where the thread has ended, -2
    where this system has no such file."""
    cdef char path[64]
    cdef char buf[128]
    cdef ssize_t n
    cdef int fd
    cdef char *end
    cdef char *p
    cdef long long wait
    snprintf(path, sizeof(path), b"/proc/self/task/%d/schedstat", tid)
    fd = c_open(path, O_RDONLY)
    if fd < 0:
        return -1 if c_access(b"/proc/self/schedstat", 0) == 0 else -2
    n = c_read(fd, buf, sizeof(buf) - 1)
    c_close(fd)
    if n <= 0:
        return -2
    buf[n] = 0
    strtoll(buf, &end, 10)   # 1st field: time on a CPU
    if end == buf:
        return -2
    p = end
    wait = strtoll(p, &end, 10)
    return -2 if end == p else wait


cdef int _waiting_for_the_gil(clocks, tids) except -2:
    """1 when the loader threads (their CPU clocks: ``clocks``, their kernel
    thread ids: ``tids``) wait for the GIL, 0 when they do not, -1 when it
    cannot tell (a thread still runnable at GIL_HOLD_MAX_US in the first or
    the last look: no CPU for it so long). Three looks, each of which may say
    0: held (while this thread holds the GIL, none of them runs), let go (one
    of them runs within GIL_LET_GO_US), watched (they run about one at a
    time: _one_at_a_time); what each tells and why: docs/loader.md, "Where
    threads lose". Watched rather than looked at again once this thread
    takes the GIL back: where the one running lets the GIL go briefly and
    takes it back (numpy's allocator does), the others wait until it
    blocks, this thread as well, and by then none of them is at work."""
    cdef clockid_t ids[64]
    cdef int64_t start[64]
    cdef int tidv[64]
    cdef int n = 0, i
    cdef int64_t until
    for c, tid in zip(clocks, tids):
        if c is not None and tid is not None and n < 64:
            ids[n] = <clockid_t>c
            tidv[n] = <int>tid
            n += 1
    if n == 0:
        return -1
    _clocks_now(ids, start, n)
    if _ran(ids, start, n, GIL_HOLD_US):    # holding the GIL (this is not a nogil block)
        return 0
    until = pf_now_ns() + <int64_t>(GIL_HOLD_MAX_US - GIL_HOLD_US) * 1000
    while True:   # still holding it: plain C reads, the GIL is kept
        for i in range(n):
            if _runnable(tidv[i]):
                break
        else:
            break   # none of them is runnable
        if _ran(ids, start, n, 500):
            return 0
        if pf_now_ns() >= until:
            return -1
    with nogil:
        _clocks_now(ids, start, n)
        if not _ran(ids, start, n, GIL_LET_GO_US):
            return 0
        return _one_at_a_time(ids, tidv, n)


cdef int _one_at_a_time(clockid_t *ids, int *tidv, int n) noexcept nogil:
    """The last look of _waiting_for_the_gil: 1 where the threads' clocks
    moved under GIL_PARALLEL x the watch together, 0 where more, -1 where
    one of those that barely ran was still runnable at GIL_HOLD_MAX_US."""
    cdef int64_t start[64]
    cdef int64_t t0 = pf_now_ns(), until = t0 + <int64_t>GIL_HOLD_MAX_US * 1000
    cdef int64_t watch = <int64_t>GIL_WATCH_US * 1000, elapsed, moved, total
    cdef timespec pause
    cdef int i
    cdef bint short_of_cpu
    pause.tv_sec = 0
    pause.tv_nsec = 50 * 1000
    _clocks_now(ids, start, n)
    while True:
        nanosleep(&pause, NULL)
        elapsed = pf_now_ns() - t0
        if elapsed < watch:
            continue
        total = 0
        short_of_cpu = False
        for i in range(n):
            moved = _clock_ns(ids[i]) - start[i] if start[i] >= 0 else 0
            total += moved
            # One that ran under half the time and is runnable waits for a CPU, not the GIL.
            short_of_cpu = short_of_cpu or (2 * moved < elapsed and _runnable(tidv[i]))
        if total >= GIL_PARALLEL * elapsed:
            return 0
        if not short_of_cpu:
            return 1
        if pf_now_ns() >= until:
            return -1


cdef bint _runnable(int tid) noexcept nogil:
    """Whether thread ``tid`` of this process is runnable (state R in
    /proc/self/task/<tid>/stat: running, or waiting for a CPU); False where
    that cannot be read."""
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
    ``within_us``; sleeping 50 us between looks: the CPU goes to whoever
    wants it meanwhile (a loader thread woken by the GIL's 5 ms time-out,
    otherwise left waiting for a CPU beside busy processes)."""
    cdef int64_t deadline = pf_now_ns() + <int64_t>within_us * 1000
    cdef timespec pause
    cdef int i
    pause.tv_sec = 0
    pause.tv_nsec = 50 * 1000
    while True:
        for i in range(n):
            if start[i] >= 0 and _clock_ns(ids[i]) - start[i] >= GIL_RAN_NS:
                return True
        if pf_now_ns() >= deadline:
            return False
        nanosleep(&pause, NULL)


cdef inline int64_t _clock_ns(clockid_t clock) noexcept nogil:
    cdef timespec ts
    if clock_gettime(clock, &ts) != 0:
        return -1
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec
