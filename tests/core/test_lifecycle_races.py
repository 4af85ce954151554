"""Lifecycle races (SPEC §2, §4, §5; issue 18, items 1-7): several threads, signal
handlers and forks against one prefetcher's next(), iter() and close(). Each case
runs in its own interpreter under a hard timeout (tests/hang.py), since the
failures they guard against are hangs and crashes.

Synchronisation is by Events, Barriers and by watching a thread's frame (hang.py's
PRELUDE), never by sleeping.
"""
import pytest
from hang import assert_ok, run_case


def test_next_waiting_while_another_thread_starts_the_next_epoch_ends_with_its_epoch():
    """Item 1: the main thread waits in next() (queued behind another consumer) while
    that consumer takes the end of the epoch and starts the next one, which closes and
    drops the old core. The waiting next() keeps its core alive and ends as its epoch
    did, with StopIteration: no ClosedError, no use of a freed core (whose memory a
    prefetcher created meanwhile may reuse: a batch of that one came out), no batch of
    the new epoch. The next loop then gets the new epoch's batch."""
    assert_ok(run_case("""
        class Src:
            # Epoch 0 ends once `release` is set; epoch 1 is one batch [1, 1].
            def __init__(self):
                self.release, self.started = threading.Event(), 0
            def __iter__(self):
                self.started += 1
                return self.epoch(self.started - 1)
            def epoch(self, e):
                if e == 0:
                    self.release.wait()
                    return
                yield np.full(2, e)

        src = Src()
        p = Prefetcher(src, depth=1)
        restarted = threading.Event()
        def holder():
            try:
                next_(p)   # waits holding the consumer lock, gets the end
            except StopIteration:
                pass
            iter(p)        # the epoch ended: start the next one, closing this one
            restarted.set()
        t = threading.Thread(target=holder)
        t.start()
        # The consumer lock (the core's plain Lock) held: the holder waits for a batch.
        lock = next(o for o in gc.get_referents(p._core) if type(o) is type(threading.Lock()))
        while not lock.locked():
            threading.Event().wait(0.001)
        others = []
        def on_usr1(signum, frame):   # runs inside the main thread's waiting next()
            src.release.set()
            restarted.wait()
            # Another prefetcher now: on a freed core's memory, if it was freed.
            others.append(Prefetcher([np.full(2, 9)] * 3, depth=1))
        signal.signal(signal.SIGUSR1, on_usr1)
        when_blocked(lambda: os.kill(os.getpid(), signal.SIGUSR1))
        try:
            print(next_(p))
        except StopIteration:
            print("stop")
        except Exception as e:
            print(repr(e))
        t.join()
        print(*[int(b[0]) for b in p])
        p.close()
        others[0].close()
    """), "stop 1")


def test_threads_looping_over_epochs_share_each_epoch_exactly_once():
    """Item 2: threads that each loop over epochs of one prefetcher over a
    re-iterable source, none calling close(). A loop's iter() joins the running epoch
    or, once it ended, starts the next; a next() that waits while another thread
    starts the next epoch ends with its own epoch (StopIteration), never with
    ClosedError. Every batch of every epoch that was started reaches exactly one
    thread."""
    assert_ok(run_case("""
        class Epochs:
            # Re-iterable: each iter() is the next epoch; batch i of epoch e is [e, i].
            def __init__(self, n):
                self.n, self.started = n, 0
            def __iter__(self):
                e, self.started = self.started, self.started + 1
                return (np.array([e, i]) for i in range(self.n))

        src = Epochs(3)
        p = Prefetcher(src, depth=2)
        got, errors = [], []
        start = threading.Barrier(4)
        def loop():
            start.wait()
            try:
                for _ in range(300):
                    for b in p:
                        got.append((int(b[0]), int(b[1])))
            except BaseException as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=loop) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        p.close()
        print(errors)
        print(src.started >= 300, sorted(got) == [(e, i) for e in range(src.started) for i in range(3)])
    """, timeout=40), "[] True True")


def test_next_on_an_epoch_whose_publisher_has_not_started_yet_waits_for_it():
    """Item 2: iter() starting the next epoch makes its core current before that
    core's publisher thread has started (Thread.start() waits for the new thread
    and lets other threads run meanwhile). Another thread joining that epoch and
    waiting in next() met a thread that was not alive and raised "the publisher
    thread is not running (it died or never started)" (seen in CI under load, in
    the looping-threads case below). A thread that has not started yet is not
    dead: the next() waits for its batch. Here the new thread's start is held back
    until the other consumer has had its answer, or for 2 s."""
    assert_ok(run_case("""
        class Epochs:
            def __init__(self):
                self.started = 0
            def __iter__(self):
                self.started += 1
                return iter([np.full(2, self.started - 1)])

        installed, answered = threading.Event(), threading.Event()
        armed = []
        class HeldBackStart(threading.Thread):
            def start(self):
                if armed and self.name.startswith("prefetch"):
                    armed.clear()
                    installed.set()
                    answered.wait(2.0)   # fault injection: a thread slow to start
                super().start()
        threading.Thread = HeldBackStart

        p = Prefetcher(Epochs(), depth=1)
        print(*[int(b[0]) for b in p])
        out = []
        def joiner():
            installed.wait()
            try:
                out.append([int(b[0]) for b in p])   # joins the epoch being started
            except Exception as e:
                out.append(repr(e))
            answered.set()
        t = threading.Thread(target=joiner)
        t.start()
        armed.append(True)
        got = [int(b[0]) for b in p]   # starts epoch 1: its thread is held back
        t.join()
        # One of the two loops took the epoch's one batch, the other none.
        print(sorted(got + out[0]) if isinstance(out[0], list) else out)
        p.close()
    """, timeout=30), "0\n[1]")


def test_interrupted_close_is_finished_by_the_next_close():
    """Item 3: Ctrl-C during close()'s join (a slow source) leaves the prefetcher
    closed but not torn down; the next close() drops the queued batches, closes the
    pool and runs the adapters' close hooks, which a bare `closed` flag skipped."""
    assert_ok(run_case("""
        from prefetch import register_leaf
        from prefetch._core import _live_counts

        class Leaf:
            pass
        hooks = []
        register_leaf(Leaf, lambda leaf, plan: Leaf(), close=lambda: hooks.append("hook"))
        src = Stuck(ready=2)
        p = Prefetcher(((Leaf(), a) for a in src), depth=2)
        next(p)   # batches go through the pool: one waits in the ring, the worker in the source
        src.entered.wait()
        def interrupt():
            while not in_join():
                threading.Event().wait(0.001)
            signal.pthread_kill(MAIN, signal.SIGINT)
        threading.Thread(target=interrupt).start()
        try:
            p.close()
        except KeyboardInterrupt:
            print("interrupted", p.closed, hooks, flush=True)
        src.release.set()
        p.close()
        counts = _live_counts()
        print(p.closed, hooks, counts["pools"], counts["blocks"])
    """), "interrupted True [] True ['hook'] 0 0")


def test_close_from_a_signal_handler_inside_close_finishes_the_teardown_once():
    """Items 3 and 4: SIGTERM's handler calls close() while the same thread's close()
    joins the worker (a `with` block exiting over a slow source). The inner close()
    does the teardown itself instead of waiting for the outer one (which would never
    come back); the outer one then returns; the close hooks run once."""
    assert_ok(run_case("""
        from prefetch import register_leaf

        warnings.simplefilter("error", RuntimeWarning)
        class Leaf:
            pass
        hooks = []
        register_leaf(Leaf, lambda leaf, plan: Leaf(), close=lambda: hooks.append("hook"))
        src = Stuck(ready=1)
        p = Prefetcher(((Leaf(), a) for a in src), depth=1)
        next(p)
        src.entered.wait()
        def on_term(signum, frame):
            src.release.set()
            p.close()
            print("inner", hooks, flush=True)
        signal.signal(signal.SIGTERM, on_term)
        def terminate():
            while not in_join():
                threading.Event().wait(0.001)
            os.kill(os.getpid(), signal.SIGTERM)
        threading.Thread(target=terminate).start()
        with p:
            pass
        print("outer", hooks)
    """), "inner ['hook'] outer ['hook']")


def test_second_close_from_another_thread_waits_for_the_teardown():
    """Item 4: two threads call close() while the worker is stuck in next(source).
    Neither returns before the teardown is done or the stuck worker was warned about:
    the second waits for the first instead of returning at once."""
    assert_ok(run_case("""
        warned = []
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *args, **kwargs: warned.append(str(message))
        src = Stuck()
        p = Prefetcher(src, depth=1)
        src.entered.wait()
        worker = next(t for t in threading.enumerate() if t.name == p._core.name)
        start = threading.Barrier(2)
        done = []
        def close():
            start.wait()
            p.close()
            done.append(not worker.is_alive() or any("still waiting in next(source)" in w for w in warned))
        closers = [threading.Thread(target=close) for _ in range(2)]
        for t in closers:
            t.start()
        for t in closers:
            t.join()
        src.release.set()
        worker.join()
        print(*done, len(warned))
    """), "True True 1")


def test_source_closing_its_prefetcher_during_another_close_does_not_wait_for_it():
    """Item 4, the one exception: the worker's own close() (a source closing its
    prefetcher) while another thread's close() joins that worker returns at once;
    waiting for the teardown would only spend the joiner's grace period and end in
    a false 'worker is stuck' warning."""
    assert_ok(run_case("""
        warnings.simplefilter("error", RuntimeWarning)
        box, go, inside = [], threading.Event(), threading.Event()
        def src():
            yield np.zeros(1)
            inside.set()
            go.wait()
            box[0].close()
            yield np.ones(1)
        p = Prefetcher(src(), depth=1)
        box.append(p)
        next(p)
        # The worker is in the source before close() starts: else close() may close the
        # ring first, the worker leaves without entering the source, the join ends before
        # release() sees it, and release() (not a daemon) keeps the process from exiting.
        inside.wait()
        def release():
            while not in_join():
                threading.Event().wait(0.001)
            go.set()
        threading.Thread(target=release).start()
        p.close()
        print(p.closed)
        box.clear()
    """), "True")


def test_close_from_a_signal_handler_wakes_the_waiting_next_with_closed_error():
    """Item 5: SIGTERM's handler calls close() (preemption) while the main thread waits
    in next(); the worker leaves the source and exits within close()'s join. The
    waiting next() raises ClosedError, not 'the worker is not running'."""
    assert_ok(run_case("""
        src = Stuck(then=[np.zeros(3)])
        p = Prefetcher(src, depth=1)
        def on_term(signum, frame):
            src.release.set()
            p.close()
            print("closed", flush=True)
        signal.signal(signal.SIGTERM, on_term)
        when_blocked(lambda: os.kill(os.getpid(), signal.SIGTERM))
        try:
            next_(p)
        except ClosedError:
            print("closed-error")
        except RuntimeError as e:
            print("runtime-error", e)
    """), "closed closed-error")


def test_next_from_a_signal_handler_inside_next_raises_instead_of_hanging():
    """Item 6: a signal handler calls next(p) while the same thread waits in next(p)
    (holding the consumer lock): a clear RuntimeError in the handler, never a hang; the
    outer next() then gets its batch."""
    assert_ok(run_case("""
        src = Stuck(then=[np.full(3, 7)])
        p = Prefetcher(src, depth=1)
        def on_usr1(signum, frame):
            try:
                next(p)
            except RuntimeError as e:
                print("reentry", "already waits in next()" in str(e), flush=True)
            src.release.set()
        signal.signal(signal.SIGUSR1, on_usr1)
        when_blocked(lambda: os.kill(os.getpid(), signal.SIGUSR1))
        print(int(next_(p)[0]))
        p.close()
    """, timeout=20), "reentry True 7")


@pytest.mark.fork_with_threads
def test_fork_inside_the_source_with_copy_helpers_child_exits():
    """Item 7: the source forks (workers=2: the copy helpers exist in the parent
    only); the child, on the worker's stack, leaves by sys.exit(), by the generator
    ending or by yielding, and must exit instead of hanging in the teardown of the
    parent's ring and copy helpers. The parent's stream goes on."""
    assert_ok(run_case("""
        warnings.simplefilter("ignore", DeprecationWarning)   # fork() in a threaded process
        def src(how):
            yield np.zeros(1 << 16)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                if how == "exit":
                    sys.exit(3)
                if how == "yield":
                    yield np.zeros(1 << 16)
                return
            _, status = os.waitpid(pid, 0)
            yield np.full(4, os.waitstatus_to_exitcode(status))
        for how in ("exit", "end", "yield"):
            with Prefetcher(src(how), workers=2) as p:
                print(how, *[int(b[0]) for b in p][1:])
    """, timeout=30), "exit 0 end 0 yield 0")
