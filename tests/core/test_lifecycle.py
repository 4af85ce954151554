"""close(), with, finalization, interpreter exit and fork (SPEC §2, §4, §5)."""
import gc
import os
import sys
import textwrap
import threading
import warnings
import weakref

import numpy as np
import pytest

from prefetch import ClosedError, Prefetcher
from support import run_python


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_close_twice_and_closed_flag():
    """§2: close() is idempotent; closed is a read-only bool."""
    p = Prefetcher(range(5))
    assert p.closed is False
    p.close()
    p.close()
    assert p.closed is True
    with pytest.raises(AttributeError):
        p.closed = False


def test_with_block_closes_and_stops_worker():
    with Prefetcher(range(1000), depth=2) as p:
        next(p)
        core = p._core
    assert p.closed and core.state == "closed"
    with pytest.raises(ClosedError):
        next(p)


def test_close_from_another_thread_while_producer_waits_for_room():
    p = Prefetcher(range(100), depth=1)
    next(p)
    t = threading.Thread(target=p.close)
    t.start()
    t.join()
    assert p.closed


def test_drop_without_close_releases_threads_without_gc():
    """§5: no reference cycle keeps a dropped prefetcher (or its thread) alive."""
    gc.disable()
    try:
        p = Prefetcher((np.zeros(10) for _ in range(1000)), depth=4)
        next(p)
        ref = weakref.ref(p)
        core_threads = [t for t in threading.enumerate() if t.name == p._core.name]
        with pytest.warns(ResourceWarning, match="unclosed prefetcher"):
            del p
        assert ref() is None
        assert core_threads and not core_threads[0].is_alive()
    finally:
        gc.enable()


def test_drop_without_close_returns_memory():
    """§5: the buffered batches (4 x 64 MiB) are freed when the prefetcher is dropped."""
    big = np.ones(64 << 20, np.uint8)
    base = rss_bytes()
    p = Prefetcher((big for _ in range(10)), depth=4)
    next(p)   # dropped at once: only the ring's batches remain
    while p.stats().fill < 4:   # bounded by the test timeout
        threading.Event().wait(0.01)
    held = rss_bytes() - base
    with pytest.warns(ResourceWarning, match="unclosed prefetcher"):
        del p
    freed = held - (rss_bytes() - base)
    assert held > 200 << 20, held
    assert freed > 200 << 20, (held, freed)


def test_close_frees_unconsumed_batches_but_not_held_ones():
    """§2: close() drops batches produced but not consumed; a held batch stays valid."""
    class Tag:
        pass

    tags = []

    def src():
        for i in range(10):
            t = Tag()
            tags.append(weakref.ref(t))
            yield (np.full(5, i), t)

    p = Prefetcher(src(), depth=3)
    kept = next(p)
    while p.stats().fill < 3:
        threading.Event().wait(0.01)
    p.close()
    gc.collect()
    assert sum(r() is not None for r in tags) == 1   # only the batch we hold
    np.testing.assert_array_equal(kept[0], np.full(5, 0))


def test_interpreter_exit_without_close_is_clean():
    """§2: a prefetcher left open at exit: exit 0, nothing on stderr (uvloop's test_dealloc)."""
    r = run_python(textwrap.dedent("""
        import numpy as np
        from prefetch import Prefetcher
        p = Prefetcher((np.zeros(1000) for _ in range(10**6)), depth=4, workers=2)
        next(p)
        q = Prefetcher(range(3))
        print("ok")
    """))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
    assert r.stderr == ""


@pytest.mark.full
def test_interpreter_exit_with_stuck_source_returns():
    """§4: exit does not hang on a source stuck forever."""
    r = run_python(textwrap.dedent("""
        import threading
        from prefetch import Prefetcher
        def stuck():
            threading.Event().wait()
            yield 1
        p = Prefetcher(stuck())
        print("ok")
    """), timeout=30)
    assert r.returncode == 0, r.stderr
    assert "left as a daemon thread" in r.stderr


@pytest.mark.fork_with_threads
def test_fork_child_gets_clear_error_and_parent_continues():
    """§4: after os.fork() the child's inherited prefetcher raises; neither process hangs."""
    r = run_python(textwrap.dedent("""
        import os, sys
        import numpy as np
        from prefetch import Prefetcher
        p = Prefetcher((np.full(100, i) for i in range(1000)), depth=4, workers=2)
        first = next(p)
        pid = os.fork()
        if pid == 0:
            try:
                next(p)
            except RuntimeError as e:
                ok = "fork" in str(e)
            else:
                ok = False
            del first          # returns a block in the child: must not touch the parent's lock
            p.close()
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert next(p)[0] == 1
        p.close()
        print("ok")
    """))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


@pytest.mark.fork_with_threads
def test_fork_child_exiting_normally_does_not_hang():
    """§4: the child's own interpreter exit (finalizers included) with inherited prefetchers."""
    r = run_python(textwrap.dedent("""
        import os
        import numpy as np
        from prefetch import Prefetcher
        ps = [Prefetcher((np.zeros(10) for _ in range(10**6)), depth=2) for _ in range(3)]
        next(ps[0])
        pid = os.fork()
        if pid == 0:
            import sys
            sys.exit(0)   # runs atexit: the finalizers close the inherited cores
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"


def test_interpreter_exit_with_a_loader_stuck_in_the_dataset_warns_at_the_line_that_made_it():
    """§4: the warning about a loader thread left inside dataset[i] at exit
    points at the user's line that created the loader (with nothing of the
    user's on the stack, it pointed into prefetch), with the grace rounded."""
    r = run_python(textwrap.dedent("""
        import threading
        import prefetch
        inside = threading.Event()
        class Stuck:
            def __len__(self):
                return 4
            def __getitem__(self, i):
                inside.set()
                threading.Event().wait()
        loader = prefetch.Loader(Stuck(), workers=1)
        it = iter(loader)
        assert inside.wait(30)
        print("ok")
    """), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "still inside the dataset after 2.0 s; it is left as a daemon thread" in r.stderr, r.stderr
    assert "<string>:11: RuntimeWarning" in r.stderr and "prefetch/" not in r.stderr, r.stderr


def test_unclosed_running_prefetcher_warns_at_the_line_that_created_it():
    """§2: a prefetcher dropped mid-stream without close() warns, as an unclosed
    file does, pointing at the line that created it; a finished one does not."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        p = Prefetcher((np.zeros(3) for _ in range(100)), depth=2)
        next(p)
        del p
        done = Prefetcher([1, 2])
        assert list(done) == [1, 2]
        del done
    resource = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert len(resource) == 1, [str(w.message) for w in caught]
    assert resource[0].filename == __file__ and resource[0].lineno == line


def test_second_loop_over_a_reiterable_source_is_a_new_epoch():
    """§2: a re-iterable source (list, DataLoader) gives a new epoch per loop."""
    data = [np.full(2, i) for i in range(3)]
    with Prefetcher(data, depth=2) as p:
        epochs = [[int(b[0]) for b in p] for _ in range(3)]
        assert len(p) == 3
    assert epochs == [[0, 1, 2]] * 3


def test_second_loop_over_a_one_shot_iterator_raises_instead_of_yielding_nothing():
    """§2: looping again over an ended one-shot stream must not silently do nothing."""
    with Prefetcher(iter([1, 2])) as p:
        assert list(p) == [1, 2]
        with pytest.raises(RuntimeError, match="one-shot iterator"):
            iter(p)
        with pytest.raises(StopIteration):
            next(p)   # the iterator protocol itself is unchanged


def test_prefetcher_cannot_be_pickled_with_a_clear_message():
    import pickle
    with Prefetcher([1]) as p:
        with pytest.raises(TypeError, match="cannot pickle"):
            pickle.dumps(p)
