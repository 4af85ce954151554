"""workers="auto"'s decisions (prefetch/_tune.pxi, SPEC §9; issue 25: the default
Loader grew to 8 threads on 2 CPUs while other loaders ran beside it, loaded
slower than workers=2 and took its 16-thread trial for a GIL-bound dataset).
The tuner is fed one window's figures at a time (samples/s, the share of time the
consumer side waited, CPUs the process used), so each decision is exact here,
whatever else the machine runs; bench/bench_loader_scaling.py runs it on real
threads (workers="auto" within 10 % of the best fixed count)."""
from prefetch._core import _Tuner


def feed(tuner, threads, windows):
    """The count after each of ``windows`` (rate, waited, busy), starting at ``threads``."""
    counts = []
    for rate, waited, busy in windows:
        threads = tuner.decide(threads, rate, waited, busy, None)
        counts.append(threads)
    return counts


def test_threads_that_keep_their_cpus_busy_do_not_grow_past_the_cpus():
    """One thread leaves a CPU idle: two are tried and kept; two threads that
    each use most of a CPU are not doubled past the 2 CPUs, though 0.3 of a CPU
    is idle (their trial could only lose, or win by noise)."""
    t = _Tuner(64, 2.0)
    counts = feed(t, 1, [(10, 0.5, 0.95), (19, 0.3, 1.7), (19, 0.3, 1.7)] + [(19, 0.3, 1.7)] * 20)
    assert counts[:3] == [2, 2, 2]
    assert set(counts[3:]) == {2}
    assert t.reason == "cpus busy"


def test_a_trial_is_kept_only_when_two_windows_beat_the_count_before():
    """A trial whose first window is 6 % faster by chance and whose second is
    not goes back; one faster in both windows is kept."""
    t = _Tuner(64, 2.0)
    assert feed(t, 1, [(10, 0.5, 0.5), (10.6, 0.5, 0.6), (9.9, 0.5, 0.6)]) == [2, 2, 1]
    assert t.reason == "no gain"
    t = _Tuner(64, 2.0)
    assert feed(t, 1, [(10, 0.5, 0.5), (18, 0.5, 0.9), (19, 0.5, 0.9)]) == [2, 2, 2]
    assert t.reason == "growing"


def test_a_trial_is_measured_against_the_best_recent_window():
    """After a failed trial the count waits (50 windows), then tries again
    against the best of its last three windows, not a slow last one."""
    t = _Tuner(64, 2.0)
    assert feed(t, 1, [(10, 0.5, 0.5), (9, 0.5, 0.6)]) == [2, 1]       # tried 2: slower, back to 1
    assert t.reason == "no gain"
    # The 50th window after it lifts the ceiling; the last three are 12, 10, 8.
    counts = feed(t, 1, [(10, 0.5, 0.5)] * 47 + [(12, 0.5, 0.5), (10, 0.5, 0.5), (8, 0.5, 0.5)])
    assert counts == [1] * 49 + [2]
    assert feed(t, 2, [(12.4, 0.5, 0.9)]) == [1]   # 55 % over the last window, not 5 % over 12


def test_io_like_threads_grow_past_the_cpus():
    """Threads that wait off a CPU (each uses well under half of one) are doubled
    past the CPUs while the consumer waits and each doubling pays."""
    t = _Tuner(64, 2.0)
    threads, seen = 1, []
    for _ in range(5):
        threads = feed(t, threads, [(100 * threads, 0.8, 0.05 * threads)])[-1]
        seen.append(threads)
        threads = feed(t, threads, [(100 * threads, 0.8, 0.05 * threads)] * 2)[-1]
    assert seen == [2, 4, 8, 16, 32]


def test_a_consumer_that_does_not_wait_stops_the_growth():
    t = _Tuner(64, 2.0)
    assert feed(t, 1, [(10, 0.05, 0.5)] * 3) == [1, 1, 1]
    assert t.reason == "consumer-bound"
