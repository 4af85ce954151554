"""The never-hang matrix (SPEC §2, §4): each case runs in its own interpreter
(its own process group) under a hard timeout, so a hang fails the test instead
of the run.

Rows: a source blocked forever x {close(), del, interpreter exit, SIGINT,
timeout}; a consumer blocked in next() x {close from another thread, SIGINT,
source error, interpreter exit}; os.fork() with live prefetchers in every
state; nested prefetchers; a source whose next() calls back into its own
prefetcher.

Synchronisation is by Events and by watching the consumer's frame (the
consumer is "blocked" once its innermost Python frame is the prelude's next_(),
which only calls next(p)), never by sleeping.
"""
import textwrap

import pytest
from hang import PRELUDE, assert_ok, finish, run_case, sigint_when_ready, spawn

# ---------------------------------------------------------------------------
# A source blocked forever.

def script_line(code, text):
    """The line number of `text` in the script run_case(code) runs (the prelude comes first)."""
    lines = (PRELUDE + textwrap.dedent(code)).splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_stuck_source_close_returns_after_grace_and_warns():
    """§4: close() returns when the source is stuck, leaving a daemon thread, with a warning
    that points at the line calling close(), also at a script's top level (issue 19: a fixed
    stacklevel pointed at sys:1 there)."""
    code = """
        src = Stuck()
        p = Prefetcher(src, depth=2)
        src.entered.wait()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            p.close()
        print(p.closed, [(w.filename, w.lineno) for w in caught if "daemon" in str(w.message)])
    """
    err = assert_ok(run_case(code), f"True [('<string>', {script_line(code, 'p.close()')})]")
    assert err == ""


@pytest.mark.full
def test_stuck_source_del_returns_and_warns():
    """§4/§5: dropping the last reference closes it (finalizer), bounded by the grace period."""
    code = """
        src = Stuck(ready=1)
        p = Prefetcher(src, depth=2)
        first = next(p)
        src.entered.wait()
        del p
        print("dropped", int(first[0]))
    """
    err = assert_ok(run_case(code), "dropped 0")
    # Issue 19: the warning points at the line that created the prefetcher.
    line = script_line(code, "p = Prefetcher(src, depth=2)")
    assert f"<string>:{line}: RuntimeWarning: prefetcher" in err and "left as a daemon thread" in err, err


def test_stuck_source_interpreter_exit_returns():
    """§2/§4: exit with an open prefetcher (2 workers, a batch held) whose source is stuck."""
    assert_ok(run_case("""
        src = Stuck(ready=2)
        p = Prefetcher(src, depth=4, workers=2)
        held = next(p)
        src.entered.wait()
        print("exiting")
    """), "exiting")


def test_stuck_source_sigint_interrupts_blocked_consumer():
    """§4: a real SIGINT reaches a consumer blocked in next() on a stuck source, and
    close() afterwards still returns."""
    proc = spawn("""
        src = Stuck()
        p = Prefetcher(src, depth=2)
        when_blocked(lambda: print("blocked", flush=True))
        try:
            next_(p)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # the grace-period warning
            p.close()
        print("closed")
    """)
    sigint_when_ready(proc)
    assert_ok(finish(proc), "interrupted closed")


def test_stuck_source_timeout_raises_and_stays_usable():
    """§2: with timeout=, a stuck source gives TimeoutError (saying the worker waits in
    next(source)) on every try, and the prefetcher stays usable."""
    assert_ok(run_case("""
        src = Stuck(ready=1, then=[np.full(3, 9)])
        p = Prefetcher(src, depth=2, timeout=0.05)
        print(int(next(p)[0]))
        for _ in range(2):
            try:
                next(p)
            except TimeoutError as e:
                print("timeout", "next(source)" in str(e))
        src.release.set()
        p._timeout = None
        print(int(next(p)[0]))
        p.close()
    """), "0 timeout True timeout True 9")


# ---------------------------------------------------------------------------
# A consumer blocked in next().

def test_blocked_consumer_close_from_another_thread_raises_closed_error():
    """§2/§4: another thread's close() wakes a consumer blocked in next() with ClosedError."""
    assert_ok(run_case("""
        warnings.simplefilter("ignore", RuntimeWarning)   # close() may outlive the grace period
        src = Stuck()
        p = Prefetcher(src, depth=1)
        closer = when_blocked(p.close)
        try:
            next_(p)
        except ClosedError:
            print("closed-error")
        src.release.set()
        closer.join()
        print(p.closed)
    """), "closed-error True")


def test_blocked_consumer_sigint_loses_nothing():
    """§2/§4: a real SIGINT while the consumer waits; the stream then continues where it was."""
    proc = spawn("""
        src = Stuck(ready=1, then=[np.full(3, i) for i in (1, 2, 3)])
        p = Prefetcher(src, depth=2)
        got = [int(next(p)[0])]
        when_blocked(lambda: print("blocked", flush=True))
        try:
            next_(p)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        src.release.set()
        got += [int(b[0]) for b in p]
        print(*got)
        p.close()
    """)
    sigint_when_ready(proc)
    assert_ok(finish(proc), "interrupted 0 1 2 3")


def test_blocked_consumer_sigint_just_before_its_batch_loses_nothing():
    """§4: a SIGINT that comes while the consumer waits, just before the batch
    it waits for is published, is raised before that batch is taken: the
    batch comes with the next next() (issue 23 item 4: it was lost, raised in
    the caller's frame once next() had returned it)."""
    assert_ok(run_case("""
        go = threading.Event()
        def src():
            yield np.full(3, 0)
            go.wait()
            signal.pthread_kill(MAIN, signal.SIGINT)
            yield np.full(3, 1)
            yield np.full(3, 2)
        p = Prefetcher(src(), depth=2)
        got = [int(next(p)[0])]
        when_blocked(go.set)
        try:
            next_(p)
        except KeyboardInterrupt:
            print("interrupted")
        got += [int(b[0]) for b in p]
        print(*got)
        p.close()
    """), "interrupted 0 1 2")


def test_blocked_consumer_gets_source_error():
    """§4: a source error raised while the consumer waits reaches it, with the note."""
    assert_ok(run_case("""
        go = threading.Event()
        def src():
            yield np.zeros(1)
            go.wait()
            raise ValueError("bad shard")
        p = Prefetcher(src(), depth=2)
        next(p)
        when_blocked(go.set)
        try:
            next_(p)
        except ValueError as e:
            print(str(e).replace(" ", "-"), any("batch 2 (counted from 1" in n for n in e.__notes__))
        p.close()
    """), "bad-shard True")


def test_blocked_consumer_thread_at_interpreter_exit():
    """§2/§4: the interpreter exits while a (daemon) consumer thread waits in next()."""
    err = assert_ok(run_case("""
        src = Stuck()
        p = Prefetcher(src, depth=2)
        started = threading.Event()
        def consume():
            started.set()
            try:
                while True:
                    next_(p)
            except ClosedError:   # the exit's close() wakes it; a daemon may also just stop
                pass
        t = threading.Thread(target=consume, daemon=True)
        t.start()
        started.wait()
        while not blocked_in_next(t.ident):
            threading.Event().wait(0.001)
        print("exiting")
    """), "exiting")
    assert "Traceback" not in err.replace("left as a daemon thread", ""), err


# ---------------------------------------------------------------------------
# os.fork() with live prefetchers.

@pytest.mark.fork_with_threads
def test_fork_with_prefetchers_in_every_state():
    """§4: after fork, every inherited prefetcher raises a clear error in the child, can
    be closed and dropped there, and the child exits; the parent's streams continue."""
    assert_ok(run_case("""
        def stream(n, size=1000):
            return (np.full(size, i) for i in range(n))
        ps = {}
        ps["fresh"] = Prefetcher(stream(100))
        ps["room"] = Prefetcher(stream(100), depth=2)          # producer waiting for room
        while ps["room"].stats().fill < 2:
            threading.Event().wait(0.001)
        stuck = Stuck(ready=1, then=[np.full(3, 1)])
        ps["stuck"] = Prefetcher(stuck, depth=2)
        stuck.entered.wait()
        ps["ended"] = Prefetcher(stream(2))
        list(ps["ended"])
        def failing():
            yield np.zeros(1)
            raise OSError("disk")
        ps["failed"] = Prefetcher(failing())
        next(ps["failed"])
        try:
            next(ps["failed"])
        except OSError:
            pass
        ps["closed"] = Prefetcher(stream(10))
        ps["closed"].close()
        ps["big"] = Prefetcher(stream(50, 1 << 22), depth=3, workers=4)
        held = [next(ps["big"]), next(ps["room"])]
        half = Prefetcher.__new__(Prefetcher)
        waiter_src = Stuck(then=[np.full(3, 5)])
        ps["waited"] = Prefetcher(waiter_src, depth=1)
        waited = []
        waiter = threading.Thread(target=lambda: waited.append(int(next_(ps["waited"])[0])))
        waiter.start()
        while not blocked_in_next(waiter.ident):
            threading.Event().wait(0.001)

        pid = os.fork()
        if pid == 0:
            bad = []
            for name, p in ps.items():
                try:
                    next(p)
                    bad.append(name)
                except RuntimeError as e:
                    if "fork" not in str(e):
                        bad.append((name, str(e)))
                p.stats(); repr(p)
                p.close()
            half.close()
            del held, ps
            gc.collect()
            if bad:
                print("child:", bad, file=sys.stderr)
            sys.exit(3 if bad else 0)     # a normal exit: atexit finalizers run in the child
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        stuck.release.set()
        waiter_src.release.set()
        waiter.join()
        print("parent",
              [int(b[0]) for b in ps["room"]] == list(range(1, 100)),
              [int(b[0]) for b in ps["stuck"]] == [0, 1],
              [int(b[0]) for b in ps["big"]] == list(range(1, 50)),
              waited == [5])
        for p in ps.values():
            p.close()
    """), "child 0 parent True True True True")


@pytest.mark.fork_with_threads
@pytest.mark.full
def test_fork_repeatedly_during_large_split_copies():
    """§4: forks landing anywhere in the worker's cycle (mid-copy in helper threads,
    in next(source), waiting for room) never deadlock either process."""
    assert_ok(run_case("""
        n = 40
        p = Prefetcher((np.full(1 << 23, i, np.uint8) for i in range(n)), depth=3, workers=4)
        got, bad = [], []
        for i, batch in enumerate(p):
            got.append(int(batch[0]) == i and int(batch[-1]) == i)
            if i % 2 == 0:
                pid = os.fork()
                if pid == 0:
                    try:
                        next(p)
                        code = 4
                    except RuntimeError:
                        code = 0
                    del batch
                    p.close()
                    if i % 4 == 0:
                        os._exit(code)
                    sys.exit(code)
                _, status = os.waitpid(pid, 0)
                if os.waitstatus_to_exitcode(status) != 0:
                    bad.append((i, status))
        print(len(got), all(got), bad)
    """), "40 True []")


@pytest.mark.fork_with_threads
def test_new_prefetcher_works_in_forked_child():
    """§4: the error tells the child to create a new Prefetcher; that one works."""
    assert_ok(run_case("""
        p = Prefetcher((np.full(10, i) for i in range(100)), depth=4, workers=2)
        next(p)
        pid = os.fork()
        if pid == 0:
            with Prefetcher((np.full(10, i) for i in range(50)), workers=2) as q:
                ok = [int(b[0]) for b in q] == list(range(50))
            os._exit(0 if ok else 5)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), int(next(p)[0]))
        p.close()
    """), "0 1")


# ---------------------------------------------------------------------------
# Nested prefetchers.

def test_nested_prefetchers_yield_the_stream_in_order():
    """§2/§3: a Prefetcher over a Prefetcher over a Prefetcher is still the source's stream."""
    assert_ok(run_case("""
        src = ((np.full(100, i), {"i": i}) for i in range(2000))
        p = Prefetcher(Prefetcher(Prefetcher(src, depth=2), depth=3, workers=2), depth=1)
        ok = all(int(a[0]) == i == d["i"] for i, (a, d) in enumerate(p))
        print(ok, p.stats().consumed)
        p.close()
    """), "True 2000")


def test_nested_error_reaches_the_outer_consumer_as_the_same_object():
    """§4: an error two levels down arrives as the same object, noted at each level."""
    assert_ok(run_case("""
        exc = LookupError("missing key")
        def src():
            yield np.zeros(1)
            raise exc
        p = Prefetcher(Prefetcher(src(), name="inner"), name="outer")
        next(p)
        try:
            next(p)
        except LookupError as e:
            print(e is exc, sum("prefetch worker" in n for n in e.__notes__))
        p.close()
    """), "True 2")


def test_nested_early_break_and_drop_releases_every_thread():
    """§5: dropping the outer prefetcher mid-stream ends the inner ones too."""
    assert_ok(run_case("""
        src = (np.zeros(1000) for _ in range(10**6))
        p = Prefetcher(Prefetcher(Prefetcher(src), workers=2), depth=2)
        for i, _ in enumerate(p):
            if i == 100:
                break
        del p
        gc.collect()
        print(threading.active_count())
    """), "1")


@pytest.mark.full
def test_nested_stuck_source_close_and_exit_return():
    """§4: the innermost source stuck forever: closing the outer one returns, and so does exit."""
    assert_ok(run_case("""
        warnings.simplefilter("ignore", RuntimeWarning)
        src = Stuck(ready=1)
        p = Prefetcher(Prefetcher(src, name="inner"), name="outer")
        next(p)
        src.entered.wait()
        p.close()
        print(p.closed)
    """), "True")


# ---------------------------------------------------------------------------
# A source that calls back into its own prefetcher.

def test_source_calling_stats_and_repr_of_its_prefetcher():
    """§2: stats() and repr() from inside next(source) work and the stream is intact."""
    assert_ok(run_case("""
        box = []
        def src():
            for i in range(50):
                s = box[0].stats() if box else None
                repr(box[0]) if box else None
                yield np.full(2, i)
        p = Prefetcher(src(), depth=3)
        box.append(p)
        print([int(b[0]) for b in p] == list(range(50)))
        box.clear()
        p.close()
    """), "True")


def test_source_closing_its_own_prefetcher():
    """§2: close() from the worker thread (inside next(source)) returns without joining
    itself; the consumer gets ClosedError after the batches before it, and nothing hangs."""
    assert_ok(run_case("""
        box = []
        def src():
            for i in range(3):
                yield np.full(2, i)
            box[0].close()
            yield np.full(2, 3)
        p = Prefetcher(src(), depth=1)
        box.append(p)
        got = []
        try:
            for b in p:
                got.append(int(b[0]))
        except ClosedError:
            got.append("closed")
        print(*got)
        box.clear()
    """), "0 1 2 closed")


def test_source_calling_next_on_its_own_prefetcher_raises_not_hangs():
    """§4: next(p) from inside p's own source can never be answered (only that thread
    could produce the batch); it must raise a clear error, delivered to the consumer,
    instead of deadlocking the worker and the consumer with it."""
    assert_ok(run_case("""
        box = []
        def src():
            yield np.zeros(1)
            yield next(box[0])
        p = Prefetcher(src(), depth=1)
        box.append(p)
        next(p)
        try:
            next(p)
        except RuntimeError as e:
            print("error", any("batch 2 (counted from 1" in n for n in e.__notes__))
        box.clear()
        p.close()
    """, timeout=20), "error True")
