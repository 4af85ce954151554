"""The GIL gauge (prefetch/_gauge.pxi, SPEC §9): do the Loader's threads wait
for the GIL (a GILBoundWarning, once per loader), or run in parallel, or wait
for CPUs that other processes or this process's other threads (BLAS's) hold
(no warning: processes would not load faster there)?

Every verdict here is decided from figures the test gives: the gauge's
decision is fed one measured window at a time (as test_tune.py feeds the
tuner), and the Loader runs with a scripted meter in place of the one that
reads the threads' clocks and /proc, so a busy machine cannot change an
outcome. How the real meter fares beside busy processes is measured by
bench/bench_gil_load.py (a table of warnings over runs), not asserted here."""

import os
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import prefetch._core as core
from prefetch import GILBoundWarning, Loader
from prefetch._core import _Gauge, judge
from support import ProbedBeforeFirstBatch, ScriptedMeter, WaitsForProbes

W = 0.05   # a window, seconds
EPOCHS_MAX = 200   # bounds a failure only: the scripted figures make the warning come in a few windows

# One window's figures, per second: threads busy inside dataset[i], the CPUs they ran on,
# the CPUs they waited for (runnable), the CPU the process's other threads used; as
# measured on a 2-CPU machine beside 1 to 3 other busy processes:
GIL_BOUND = (2.0, 0.97, 0.9, 0.05)        # pure Python: one runs; the other waits, often runnable
GIL_BOUND_BUSY = (2.0, 0.4, 1.05, 0.02)   # the same beside more busy processes
CPU_STARVED = (2.0, 0.5, 1.5, 0.0)        # numpy beside busy processes: runnable, never blocked
BLAS = (2.0, 0.55, 0.75, 0.45)            # BLAS's own threads take the CPUs; the callers sleep on them
IO = (2.0, 0.01, 0.05, 0.0)               # sleeping on I/O: no GIL held, no CPU wanted
PARALLEL = (2.0, 1.9, 0.05, 0.02)


def feed(gauge, figures, probe=True, n=1, threads=2):
    """``n`` windows of ``figures``; the verdicts."""
    busy, cpu, runq, others = figures
    return [gauge.window(W, threads, busy, cpu, runq, others, probe) for _ in range(n)]


# -- the decision -------------------------------------------------------------


@pytest.mark.parametrize("figures", [GIL_BOUND, GIL_BOUND_BUSY, CPU_STARVED])
def test_threads_that_ran_on_fewer_cpus_than_they_wanted_are_probed(figures):
    """Waiting for the GIL and waiting for CPUs that other processes hold look
    alike in a window's figures (a thread waiting for the GIL wakes every 5 ms
    and then waits for a CPU too): the probe tells them apart."""
    assert judge(2, *figures)


@pytest.mark.parametrize("figures, why", [
    (BLAS, "the process's other threads (BLAS's) took the CPUs the callers waited on"),
    (IO, "threads sleeping on I/O hold no GIL"),
    (PARALLEL, "they ran in parallel"),
])
def test_windows_that_are_not_gil_waits_are_not_probed(figures, why):
    assert not judge(2, *figures), why


def test_one_thread_or_few_busy_threads_are_not_judged():
    assert not judge(1, *GIL_BOUND)
    assert not judge(2, 1.2, 0.6, 0.2, 0.0)


@pytest.mark.parametrize("unknown", ["cpu", "runq", "others"])
def test_a_figure_the_platform_cannot_read_means_no_verdict(unknown):
    """No per-thread clocks, or no /proc (not Linux): the gauge cannot tell
    CPU waits from GIL waits, so it never judges a window."""
    figures = dict(zip(("busy", "cpu", "runq", "others"), GIL_BOUND))
    figures[unknown] = None
    g = _Gauge("x", cpus=2)
    assert not any(g.window(W, 2, *figures.values(), True) for _ in range(20))
    assert g.take_notice() is None
    assert g.counts() == {"load_parallelism": pytest.approx(2.0), "load_wait_share": 0.0}


def test_gil_bound_windows_give_one_notice_with_what_was_measured():
    g = _Gauge("texts", cpus=2)
    assert feed(g, GIL_BOUND, n=2) == [True, True]
    assert g.take_notice() is None   # 3 probes at least
    feed(g, GIL_BOUND)
    w = g.take_notice()
    assert isinstance(w, GILBoundWarning)
    assert (w.threads, w.cpus, w.speedup) == (2, 2, None)
    assert w.parallelism == pytest.approx(1.0)
    assert w.wait_share == pytest.approx(0.5)
    text = str(w)
    for words in ("loader 'texts'", "its 2 threads ran dataset[i] about 1.0 at a time while waiting on each other",
                  "50%", "none of it counted from waiting for a CPU",
                  "may use 2 CPUs", "holds the GIL", "processes", "prefetch.Prefetcher", "numpy",
                  "stats().load_parallelism"):
        assert words in text, (words, text)
    feed(g, GIL_BOUND, n=20)
    assert g.take_notice() is None   # once per gauge
    assert g.counts()["load_parallelism"] == pytest.approx(1.0)
    assert g.counts()["load_wait_share"] == pytest.approx(0.5)


def test_the_notice_names_what_the_threads_ran_and_the_figure_under_busy_processes():
    """Beside busy processes the GIL-bound threads ran on 0.4 CPU: the figure is
    still "about 1.0 at a time" (one held the GIL throughout)."""
    g = _Gauge("x", cpus=2)
    feed(g, GIL_BOUND_BUSY, n=3)
    w = g.take_notice()
    assert w is not None and w.parallelism == pytest.approx(1.0)


@pytest.mark.parametrize("figures", [GIL_BOUND, CPU_STARVED])
def test_a_probe_that_finds_no_gil_wait_gives_no_notice(figures):
    """Threads that do not wait for the GIL (for CPUs other processes hold, or
    I/O mixed with Python): the probe says so, and the window runs at its busy count."""
    g = _Gauge("x", cpus=2)
    assert not any(feed(g, figures, probe=False, n=20))
    assert g.take_notice() is None
    assert g.counts()["load_parallelism"] == pytest.approx(2.0)


def test_a_probe_that_cannot_tell_counts_for_nothing():
    """A probe that found a loader thread without a CPU for 10 ms (beside busy
    processes) cannot tell: the window is not serialized, and the probe is not
    counted among the probes (three that found the threads waiting make the notice)."""
    g = _Gauge("x", cpus=2)
    assert feed(g, GIL_BOUND, probe=None, n=10) == [False] * 10
    assert g.take_notice() is None
    g = _Gauge("x", cpus=2)
    feed(g, GIL_BOUND, probe=None)
    feed(g, GIL_BOUND, n=3)
    assert g.take_notice() is not None


def test_three_quarters_of_the_probes_must_find_the_threads_waiting():
    g = _Gauge("x", cpus=2)
    for verdict in (True, False, True, False, True, False, True, False):
        feed(g, GIL_BOUND, probe=verdict)
    assert g.take_notice() is None


def test_threads_that_queue_on_the_gil_now_and_then_are_not_gil_bound():
    """Serialized windows a third of the time, parallel ones otherwise (the
    image pipeline's decoder with its Python part): over all windows they ran
    about 1.7 at a time, so no notice, though the windows caught show 1.0."""
    g = _Gauge("x", cpus=2)
    for _ in range(10):
        feed(g, GIL_BOUND)
        feed(g, PARALLEL, n=2)
    assert g.take_notice() is None
    assert g.counts()["load_parallelism"] > 1.6


class Answers:
    """A probe that gives these verdicts in turn."""

    def __init__(self, *verdicts):
        self.verdicts = list(verdicts)

    def probe(self, clocks, tids):
        return self.verdicts.pop(0)


def test_a_failed_trial_whose_last_probe_could_not_tell_probes_the_threads_then():
    """The last window of a workers="auto" trial called for a probe that could not
    tell: the threads are probed when the trial fails, and their wait gives the notice."""
    g = _Gauge("x", cpus=2)
    answers = Answers(None, True)
    assert not g.window(W, 2, *GIL_BOUND, answers)
    assert g.trial_failed(2, 1, 1.01) and not answers.verdicts
    w = g.take_notice()
    assert w.speedup == pytest.approx(1.01) and w.parallelism == pytest.approx(1.0)
    g = _Gauge("x", cpus=2)
    g.window(W, 2, *GIL_BOUND, Answers(None, False))
    assert not g.trial_failed(2, 1, 1.01) and g.take_notice() is None
    g = _Gauge("x", cpus=2)
    answers = Answers(True)
    g.window(W, 2, *PARALLEL, answers)
    assert not g.trial_failed(2, 1, 1.01) and answers.verdicts == [True]   # ran in parallel: no probe


def test_one_cpu_gives_figures_but_no_notice():
    """Where the process may use one CPU, threads and processes alike run one at a time."""
    g = _Gauge("x", cpus=1)
    feed(g, GIL_BOUND, n=10)
    assert g.take_notice() is None
    assert g.counts()["load_parallelism"] == pytest.approx(1.0)


def test_a_notice_given_before_is_not_given_again():
    """A drop-in's loader that makes a stage per epoch carries the notice over."""
    g = _Gauge("x", noticed=True, cpus=2)
    feed(g, GIL_BOUND, n=10)
    assert g.take_notice() is None


def test_a_failed_trial_of_serialized_threads_notices_with_its_speedup():
    """workers="auto" tried 2 threads, found them 1.02 x as fast as 1, and goes back:
    its last window was serialized, so the notice says so with the speedup."""
    g = _Gauge("x", cpus=2)
    feed(g, PARALLEL)
    assert not g.trial_failed(2, 1, 1.02)   # its last window ran in parallel
    feed(g, GIL_BOUND)
    assert g.trial_failed(2, 1, 1.02)
    w = g.take_notice()
    assert w.speedup == pytest.approx(1.02) and w.threads == 2
    assert "2 threads loaded at 1.02 x the speed of 1, so it keeps 1" in str(w)


# -- the Loader with a scripted meter -------------------------------------------


class Sleeps:
    """dataset[i] waits 2 ms without the GIL: two threads are inside it about all
    the time, whatever the CPUs do (the meter says what they did there); an
    epoch lasts 160 ms or more, longer than the gauge's 50 ms window."""

    def __len__(self):
        return 160

    def __getitem__(self, i):
        time.sleep(0.002)
        return np.full(2, i)


@pytest.fixture
def two_cpus(monkeypatch):
    """The process may use 2 CPUs, whatever this machine has."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)


def scripted(monkeypatch, *args, **kw):
    meter = ScriptedMeter(*args, **kw)
    monkeypatch.setattr(core, "_METER", meter)
    return meter


def epochs_until_warned(loader, caught, extra=0, epochs_max=EPOCHS_MAX):
    """Epochs until a GILBoundWarning is caught, then ``extra`` more; each epoch checked whole and in order."""
    n = len(loader.dataset)
    epochs = 0
    while epochs < epochs_max and not any(issubclass(w.category, GILBoundWarning) for w in caught):
        assert sum((b[:, 0].tolist() for b in loader), []) == list(range(n))
        epochs += 1
    for _ in range(extra):
        assert sum((b[:, 0].tolist() for b in loader), []) == list(range(n))
    return [w for w in caught if issubclass(w.category, GILBoundWarning)]


def loaded_until_warned(dataset, extra=0, epochs_max=EPOCHS_MAX):
    """(the GILBoundWarnings, the stats) of a Loader(workers=2) over ``dataset``
    run by epochs_until_warned."""
    with Loader(dataset, batch_size=4, workers=2) as loader:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            notes = epochs_until_warned(loader, caught, extra, epochs_max)
        return notes, loader.stats()


def test_a_loader_whose_threads_wait_for_the_gil_warns_once_at_the_users_line(monkeypatch, two_cpus):
    meter = scripted(monkeypatch, GIL_BOUND)
    notes, stats = loaded_until_warned(Sleeps(), extra=3)
    assert len(notes) == 1, [str(w.message) for w in notes]
    assert notes[0].filename == __file__   # the user's line, not prefetch's
    w = notes[0].message
    assert w.threads == 2 and w.cpus == 2 and w.parallelism == pytest.approx(1.0, rel=1e-3)
    assert meter.probes >= 3
    assert stats.load_parallelism < stats.workers and stats.load_wait_share > 0
    assert stats.tune_reason == ""   # a fixed thread count


class Tokenises:
    """dataset[i] runs about a millisecond of Python and never blocks."""

    def __len__(self):
        return 160

    def __getitem__(self, i):
        total = 0
        for k in range(20000):
            total += k
        return np.full(2, i)


@pytest.fixture
def gil_handed_over_only_when_let_go():
    """CPython hands the GIL to a waiting thread only when its holder lets it
    go (blocks), never on the switch interval's time-out: the order in which
    threads run is set by where they block, not by the machine's load."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_threads_that_take_turns_per_batch_are_judged_as_waiting(monkeypatch, two_cpus,
                                                                 gil_handed_over_only_when_let_go):
    """A thread woken from its wait for work that waits for the GIL until the
    running one blocks (CPython's hand-over, restarted by every brief release
    of the GIL such as numpy's allocator's, does that on any machine; here the
    switch interval does it) is at work: the threads take turns per batch,
    never inside dataset[i] together, and are still judged waiting on each
    other, so the warning comes. Counting only the time inside dataset[i], the
    gauge saw one busy thread and judged no window (the pure-Python dataset
    of bench/bench_gil_load.py warned in 0 of 10 loaders on a quiet machine)."""
    meter = scripted(monkeypatch, GIL_BOUND)
    notes, stats = loaded_until_warned(Tokenises(), epochs_max=30)
    assert len(notes) == 1, f"no warning in 30 epochs: {stats}"
    assert meter.probes >= 3
    # The woken threads' wait for the GIL is not idle time: counted as idle,
    # the share is 0.0. Counted as work it is about 0.49 on a quiet machine,
    # and 0.23 was seen on CPython 3.15 beside a whole CI run's load.
    assert stats.load_wait_share > 0.1


@pytest.mark.parametrize("figures", [BLAS, IO])
def test_a_loader_whose_threads_wait_for_blas_or_sleep_is_never_probed(monkeypatch, two_cpus, figures):
    """Figures of threads waiting for CPUs that BLAS's threads hold, or sleeping
    on I/O: no probe of the GIL is made, no warning comes, and the threads
    count as running in parallel (no wait share)."""
    meter = scripted(monkeypatch, figures)
    with Loader(Sleeps(), batch_size=4, workers=2) as loader:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(6):
                assert sum((b[:, 0].tolist() for b in loader), []) == list(range(160))
        stats = loader.stats()
    assert not [str(w.message) for w in caught if issubclass(w.category, GILBoundWarning)]
    assert meter.probes == 0
    assert stats.load_wait_share == 0.0 and stats.load_parallelism > 0


def test_a_loader_whose_probes_find_threads_wanting_cpus_does_not_warn(monkeypatch, two_cpus):
    """Threads starved of CPUs by other processes: the windows are probed, the
    probe finds them running or runnable, and no warning comes."""
    meter = scripted(monkeypatch, CPU_STARVED, probe=False)
    with Loader(Sleeps(), batch_size=4, workers=2) as loader:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(6):
                assert sum((b[:, 0].tolist() for b in loader), []) == list(range(160))
        stats = loader.stats()
    assert not [str(w.message) for w in caught if issubclass(w.category, GILBoundWarning)]
    assert meter.probes > 0 and stats.load_wait_share == 0.0


def test_without_run_queue_figures_no_probe_and_no_warning(monkeypatch, two_cpus):
    """A platform without /proc: the gauge cannot tell, so it does not warn; figures still come."""
    meter = scripted(monkeypatch, GIL_BOUND, runq_known=False)
    with Loader(Sleeps(), batch_size=4, workers=2) as loader:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(6):
                assert len(list(loader)) == 40
        stats = loader.stats()
    assert not [w for w in caught if issubclass(w.category, GILBoundWarning)]
    assert meter.probes == 0 and stats.load_parallelism > 0


def test_one_cpu_loader_gives_no_warning(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    scripted(monkeypatch, GIL_BOUND)
    with Loader(Sleeps(), batch_size=4, workers=2) as loader:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(6):
                assert len(list(loader)) == 40
    assert not [w for w in caught if issubclass(w.category, GILBoundWarning)]


def test_windows_end_while_the_consumer_waits_so_the_verdict_needs_no_batch(monkeypatch, two_cpus):
    """A dataset[i] slower than the gauge's windows (or threads that finish their
    batches in bursts, as GIL-bound ones do) is judged while the consumer waits
    for its first batch: the warning comes before the second batch, and a
    drop-in can hand its loading over early (SPEC §9)."""
    meter = ProbedBeforeFirstBatch(GIL_BOUND)
    monkeypatch.setattr(core, "_METER", meter)
    with Loader(WaitsForProbes(meter), batch_size=4, workers=2) as loader:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            it = iter(loader)
            first = next(it)
            second = next(it)
            notes = [w for w in caught if issubclass(w.category, GILBoundWarning)]
    assert first[:, 0].tolist() == [0, 1, 2, 3] and second[:, 0].tolist() == [4, 5, 6, 7]
    assert len(notes) == 1 and notes[0].message.parallelism == pytest.approx(1.0, rel=1e-3)


def test_the_warning_as_an_error_loses_no_batch(monkeypatch, two_cpus):
    """The warning is raised before a batch is taken, so under an "error" filter
    the loop that catches it goes on with every batch."""
    scripted(monkeypatch, GIL_BOUND)
    got = []
    raised = 0
    with Loader(Sleeps(), batch_size=4, workers=2) as loader:
        with warnings.catch_warnings():
            warnings.simplefilter("error", GILBoundWarning)
            for _ in range(EPOCHS_MAX):
                it = iter(loader)
                epoch = []
                while True:
                    try:
                        epoch.append(next(it)[:, 0].tolist())
                    except GILBoundWarning:
                        raised += 1
                        continue
                    except StopIteration:
                        break
                got.append(sum(epoch, []))
                if raised:
                    break
    assert raised == 1
    assert all(e == list(range(160)) for e in got)


def test_the_real_meter_reads_this_process(two_cpus):
    """The meter reads this thread's figures here (Linux CI): CPU time and a
    run-queue figure, both numbers that never go back."""
    me = [time.pthread_getcpuclockid(threading.get_ident())] if hasattr(time, "pthread_getcpuclockid") else []
    tid = [threading.get_native_id()]
    a = core._METER.read(me, tid)
    sum(range(100_000))
    b = core._METER.read(me, tid)
    assert b[2] >= a[2]
    if me:
        assert b[0] >= a[0]
    if os.path.exists("/proc/self/schedstat"):
        assert a[1] is not None and b[1] >= a[1]
    else:
        assert a[1] is None
