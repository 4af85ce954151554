# _tune.pxi (included by _core.pyx): workers="auto" for a map stage.
#
# After each batch the publisher takes, the stage asks its _Tuner how many
# threads to run. The batches are measured in windows (>= 3 batches and
# >= 50 ms). While the publisher waited for the threads and the process leaves
# CPUs idle, a trial doubles the threads; it is kept only when both of its
# first two windows beat the best of the last three windows before it by >= 5 %
# (one window is noisy: a single one let the count ratchet up to 8 threads on
# 2 CPUs, slower than 2, while other loaders ran beside it). A trial past the
# CPUs also needs threads that spend most of their time off a CPU (I/O); threads
# that keep their CPUs busy gain nothing from more of them. A failed trial goes
# back, and no trial goes above it for 50 windows (a GIL-bound dataset, or CPUs
# already full). `reason` says why the count stopped growing
# (stats().tune_reason); a failed trial asks the gauge (_gauge.pxi) whether its
# threads took turns on the GIL. Publisher thread only.

cdef int RECENT = 3   # windows at the current count a trial is measured against


@cython.final
cdef class _Tuner:
    """workers="auto": from one thread up to ``max_threads``, growing while
    that helps and less than ``cpus`` CPUs are busy."""

    def __cinit__(self, int max_threads, double cpus):
        self.max_threads = max_threads
        self.recent = []
        self.ceiling = max_threads
        self.cpus = cpus
        self.reason = ""

    cdef void restart(self):
        """A new epoch: its first batch starts a window."""
        self.t0 = 0

    cdef bint due(self, int64_t now):
        """The batch being taken closes a window (the gauge closes its own first)."""
        return self.t0 != 0 and self.batches + 1 >= 3 and now - self.t0 >= 50 * 1000 * 1000

    cdef int after_batch(self, int threads, uint64_t samples, int64_t wait_ns, _Gauge gauge) except -1:
        """The thread count from now on, given the count ``threads``, the
        samples finished and the publisher's total wait for them so far;
        ``gauge`` judges a failed trial."""
        cdef int64_t now = pf_now_ns(), elapsed
        cdef double rate, waited, busy
        if self.t0 == 0:
            self._new_window(now, samples, wait_ns)
            return threads
        if not self.due(now):
            self.batches += 1
            return threads
        elapsed = now - self.t0
        rate = (samples - self.samples0) / (elapsed / 1e9)
        waited = (wait_ns - self.wait0) / <double>elapsed
        busy = (time.process_time() - self.cpu0) / (elapsed / 1e9)
        self._new_window(now, samples, wait_ns)
        return self.decide(threads, rate, waited, busy, gauge)

    cpdef int decide(self, int threads, double rate, double waited, double busy, _Gauge gauge) except -1:
        """The count after a window at ``threads`` that loaded ``rate``
        samples/s while the publisher waited ``waited`` of the time and the
        process used ``busy`` CPUs; ``gauge`` (or None) judges a failed trial."""
        cdef bint serialized, io_like
        cdef int threads_before
        if self.trial_from:
            self.trial_windows += 1
            self.trial_low = rate if self.trial_windows == 1 else min(self.trial_low, rate)
            if self.trial_low >= 1.05 * self.trial_rate and self.trial_windows < 2:
                return threads   # one window more before it is kept
            threads_before, self.trial_from = self.trial_from, 0
            if self.trial_low < 1.05 * self.trial_rate:
                self.ceiling = threads_before
                self.retry = 50
                serialized = gauge is not None and gauge.trial_failed(threads, threads_before,
                                                                      self.trial_low / self.trial_rate)
                self.reason = "serialized" if serialized else "no gain"
                return threads_before
            self.recent = [rate]   # a new count: its own windows from now on
            self.reason = "growing"
            return threads
        self.recent = self.recent[1 - RECENT:] + [rate]
        if self.retry:
            self.retry -= 1
            if not self.retry:
                self.ceiling = self.max_threads
        # Past the CPUs, more threads help only threads that wait off a CPU
        # (I/O): they must have used under half a CPU each.
        io_like = busy < 0.5 * threads
        if (waited > 0.1 and threads < self.ceiling and busy < self.cpus - 0.25
                and (2 * threads <= self.cpus or io_like)):
            self.trial_from = threads
            self.trial_rate = max(self.recent, default=0.0)
            self.trial_windows = 0
            self.reason = "growing"
            return min(self.ceiling, 2 * threads)
        if waited <= 0.1:
            self.reason = "consumer-bound"
        elif busy >= self.cpus - 0.25 or (threads < self.ceiling and 2 * threads > self.cpus
                                          and not io_like):
            self.reason = "cpus busy"
        elif threads >= self.max_threads:
            self.reason = "thread limit"
        # else: the last trial's reason, until its ceiling is lifted
        return threads

    cdef void _new_window(self, int64_t now, uint64_t samples, int64_t wait_ns) except *:
        self.t0 = now
        self.batches = 0
        self.samples0 = samples
        self.wait0 = wait_ns
        self.cpu0 = time.process_time()
