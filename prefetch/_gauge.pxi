# _gauge.pxi (included by _core.pyx): do a map stage's threads run in parallel,
# and where they do not, do they wait for the GIL (processes would help) or for
# CPUs (taken by other processes, or by this process's other threads: they would not)?
#
# The publisher measures windows (>= 50 ms, ended at a batch taken or while it
# waits for one) through the meter (_meter.pxi): per second, the threads at
# work on average (`busy`: inside load(key), or woken for it and waiting to run,
# _threads.pxi), the CPUs they ran on (`cpu`), the CPUs they waited for while runnable (`runq`),
# and the CPU the process's other threads used (`others`: a library's own
# threads such as BLAS's, the training step). judge() says from those figures
# whether a window is worth a probe (the thresholds below); the probe's
# verdict (_meter.pxi) decides it. Both are fed figures by tests (window()).
# The notice is a GILBoundWarning, raised on the consumer's thread by
# _MapEpoch.before_take, once per stage. Each rule, and why it is so:
# docs/loader.md, "Where threads lose". Publisher thread, but the notice's
# hand-over (take_notice); it calls nothing back.

cdef double SERIAL_BUSY = 1.25      # threads busy on average, at least, to judge a window
cdef double WANTED_CPU = 0.5        # ... that wanted CPUs (ran or waited for one), at least
cdef double RAN_SHARE = 0.9         # ... that ran on fewer CPUs than this share of the busy ones
cdef double OTHERS_SHARE = 0.5      # ... while the process's other threads used under this x their CPU
cdef double SERIAL_FRACTION = 0.65  # warn below this share of min(threads, CPUs)
cdef double SURE_SHARE = 0.75       # the notice: at least this share of the probes found waiting
cdef int PROBES_SURE = 8            # probes after which ...
cdef int PROBE_EVERY = 4            # ... only every 4th judged window probes
cdef int64_t GAUGE_WINDOW_NS = 50 * 1000 * 1000


@cython.final
cdef class _Gauge:

    def __cinit__(self, name, remedy=None, bint noticed=False, cpus=None):
        """``remedy``: a drop-in's framework loader, named in the notice;
        ``noticed``: the notice was given already (by a drop-in's earlier
        loader); ``cpus``: the CPUs the process may use (None: usable_cpus())."""
        self.name = name
        self.what = "dataset[i]"
        self.remedy = remedy or ("a process-based loader (one whose workers are processes), wrapped in "
                                 "prefetch.Prefetcher to keep the same batch guarantees")
        self.noticed = noticed
        self.cpus = usable_cpus() if cpus is None else cpus

    cdef void restart(self, str what):
        """A new epoch, whose threads run ``what`` ("dataset[i]", "the mapped
        function", "the stream's next()"): the next batch starts a window."""
        self.t0 = 0
        self.what = what

    cdef bint due(self, int64_t now, _LoaderThreads waiting=None):
        """A window ends at the batch being taken, or while the publisher waits for one
        (threads that hold the GIL finish batches in bursts) where a probe finds two of
        the ``waiting`` crew's threads at work; the first one begins."""
        return self.t0 == 0 or now - self.t0 >= GAUGE_WINDOW_NS and (
            waiting is None or len(waiting.clocks_and_tids(True)[0]) >= 2)

    cdef int end_window(self, int64_t now, _LoaderThreads crew, int threads) except -1:
        """Called when due(), when the tuner's window closes and when the
        thread count changed: ends the window at ``now`` (the ``crew``'s time
        at work so far, its threads' figures, and those of its threads at work
        now, which a probe looks at) and starts the next one. A window of
        another thread count than ``threads``, or under 10 ms, is dropped."""
        cdef double wall
        cdef int64_t busy_ns = crew.at_work_ns(now)
        meter = _METER
        cpu_s, runq_s, proc_s = meter.read(*crew.clocks_and_tids(False))
        if threads == self.threads and self.t0 != 0 and now - self.t0 >= GAUGE_WINDOW_NS // 5:
            wall = (now - self.t0) / 1e9
            cpu = runq = others = None
            if cpu_s is not None and self.cpu0 is not None:
                cpu = (cpu_s - self.cpu0) / wall
                others = max(0.0, (proc_s - self.proc0) / wall - cpu)
                if runq_s is not None and self.runq0 is not None:
                    runq = (runq_s - self.runq0) / wall
            self.window(wall, threads, (busy_ns - self.busy0) / 1e9 / wall, cpu, runq, others, meter,
                        crew.clocks_and_tids(True))
        elif threads != self.threads:
            self.skip = 0   # the first judged window of a new count is probed
        self.t0 = now
        self.busy0 = busy_ns
        self.cpu0, self.runq0, self.proc0 = cpu_s, runq_s, proc_s
        self.threads = threads
        return 0

    cpdef bint window(self, double wall, int threads, double busy, cpu, runq, others, probe,
                      tuple at_work=None) except -1:
        """One window's figures (per second of ``wall``; ``cpu``/``runq``/``others``
        None where unknown), judged: True where it was serialized. ``probe``: a meter,
        whose probe() looks at the threads ``at_work``, or (tests) the verdict it gives."""
        cdef double par = busy
        cdef double limit
        cdef bint serialized = False
        cdef bint judged = judge(threads, busy, cpu, runq, others), decided = False
        if at_work is None:
            at_work = ([None] * 2, [None] * 2)
        if judged:
            if self.skip:
                decided = True
                self.skip -= 1
                serialized = self.last_probe
            else:
                verdict = self._probe(probe, at_work)
                if verdict is not None:
                    decided = True
                    self.last_probe = serialized = verdict
                    if self.probes >= PROBES_SURE:
                        self.skip = PROBE_EVERY - 1
            if serialized:
                par = min(busy, max(<double>cpu, 1.0))
        self.wall_s += wall
        self.busy_s += busy * wall
        self.par_s += par * wall
        self.wait_s += (busy - par) * wall
        self.last_serialized, self.last_threads = serialized, threads
        self.last_busy, self.last_par = busy, par
        self.last_open = judged and not decided
        self.last_cpu = cpu if judged else 0.0
        self.at_work, self.probe = at_work, probe
        if serialized:
            self.ser_wall_s += wall
            self.ser_busy_s += busy * wall
            self.ser_par_s += par * wall
            par = self.ser_par_s / self.ser_wall_s
            limit = SERIAL_FRACTION * min(threads, self.cpus)
            # Low in the windows where a probe caught them waiting, and low
            # over all windows so far: a decoder whose Python part makes the
            # threads queue now and then (the image pipeline, about 1.7 at a
            # time overall, 1.2 in the windows caught) is not GIL-bound.
            if (self.probes_ser >= 3 and self.probes_ser >= SURE_SHARE * self.probes
                    and par < limit and self.par_s / self.wall_s < limit):
                self._make_notice(threads, par, 1.0 - self.ser_par_s / self.ser_busy_s, None)
        return serialized

    cdef object _probe(self, probe, tuple at_work):
        """``probe``'s verdict on the threads ``at_work``, counted; None where it could not tell."""
        if len(at_work[0]) < 2:
            return None   # a probe looks at threads waiting on each other
        verdict = probe.probe(*at_work) if hasattr(probe, "probe") else probe
        if verdict is not None:   # None: it could not tell (a thread found no CPU for long)
            self.probes += 1
            self.probes_ser += verdict
        return verdict

    cpdef bint trial_failed(self, int tried, int kept, double speedup) except -1:
        """workers="auto" tried ``tried`` threads and goes back to ``kept``: ``speedup`` is the measured rate over the
        rate before. True when the threads took turns on the GIL in that trial:
        its last window was serialized (the notice is made). Where that window
        called for a probe that could not tell (fewer than two threads at
        work then, or one without a CPU for long), the threads are probed now,
        while the trial's threads still work (the batch just taken closed it):
        else the next trial, 50 windows on, would be the first to tell."""
        if self.last_threads != tried:
            return False
        if self.last_open and self._probe(self.probe, self.at_work):
            self.last_serialized = True
            self.last_par = min(self.last_busy, max(self.last_cpu, 1.0))
        if not self.last_serialized:
            return False
        self._make_notice(tried, self.last_par, 1.0 - self.last_par / self.last_busy, (kept, speedup))
        return True

    cdef _make_notice(self, int threads, double par, double wait_share, trial):
        if self.noticed or self.cpus < 2:
            return   # one CPU: threads could not run in parallel anyway, nor processes
        self.noticed = True
        if trial is None:
            measured = f"its {threads} threads ran {self.what}"
        else:
            kept, speedup = trial
            measured = (f"{threads} threads loaded at {speedup:.2f} x the speed of {kept}, so it "
                        f"keeps {kept}; they ran {self.what}")
        message = (
            f"loader {self.name!r}: {measured} about {par:.1f} at a time while waiting on each other "
            f"({wait_share:.0%} of their time at work went to that wait, none of it counted from "
            f"waiting for a CPU), on a machine where this process may use {self.cpus} CPUs: "
            f"{self.what} holds the GIL (it runs "
            f"Python code), so threads take turns. Run it in processes instead: {self.remedy}; or "
            f"move the Python work out of {self.what} (into numpy, or a library that releases the "
            f"GIL). stats().load_parallelism shows the figure.")
        note = GILBoundWarning(message)
        note.parallelism = par
        note.wait_share = wait_share
        note.threads = threads
        note.cpus = self.cpus
        note.speedup = None if trial is None else trial[1]
        self.notice = note

    cpdef object take_notice(self):
        """The notice, once (consumer thread), or None."""
        note, self.notice = self.notice, None
        return note

    def counts(self):
        """The gauge's fields of Stats."""
        return dict(load_parallelism=self.par_s / self.wall_s if self.wall_s else 0.0,
                    load_wait_share=self.wait_s / self.busy_s if self.busy_s else 0.0)


cpdef bint judge(int threads, double busy, cpu, runq, others):
    """Whether a window's figures (per second: ``busy`` threads inside load,
    the ``cpu`` they ran on, the ``runq`` CPUs they waited for, the CPU the
    process's ``others`` threads used; None: unknown) call for a probe of the
    GIL: two threads or more busy, wanting CPUs, running on fewer than they
    were busy, not beside other threads of this process that keep CPUs busy.
    Unknown figures: never (the gauge cannot tell)."""
    if cpu is None or runq is None or others is None:
        return False
    if threads < 2 or busy < SERIAL_BUSY or cpu + runq < WANTED_CPU:
        return False
    return cpu < RAN_SHARE * busy and others < OTHERS_SHARE * cpu
