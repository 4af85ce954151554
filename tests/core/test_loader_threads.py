"""The lifecycle of a Loader's threads (SPEC §4, §9; issue 22 defects 3, 7
and 14): a thread whose worker_init failed is replaced in the next epoch,
close() from a signal handler that lands while an epoch starts its threads
returns, and a child forked inside dataset[i] ends when it leaves it.
Signal and fork cases run in a fresh interpreter with a hard timeout, so a
hang fails the test instead of the suite."""
import collections
import textwrap
import threading

import numpy as np
import pytest

import prefetch
from prefetch import Loader
from prefetch._core import MAP_SINGLE, _MapStage, _Pool, _StageHooks, assembly
from prefetch._options import Options
from support import run_python


def arrays(n, shape=(3, 5), dtype=np.float32):
    return [np.full(shape, i, dtype) for i in range(n)]


def check_batches(got, data, batch_size):
    want = [np.stack(data[s:s + batch_size]) for s in range(0, len(data), batch_size)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


# -- defect 3: a thread whose worker_init failed ------------------------------

@pytest.mark.parametrize("workers", [1, 2, "auto"])
def test_worker_init_failure_fails_its_epoch_and_the_next_epoch_starts_a_replacement(workers):
    """§4, §9 (issue 22 defect 3): epoch 0 raises worker_init's error (the same
    object, with its note); the next epoch starts a new thread in the dead
    one's place, which runs worker_init again, and delivers every batch. The
    dead thread used to stay counted: with workers=1 or "auto" no thread was
    left and the next epoch hung (here: a TimeoutError after `timeout`)."""
    calls = []
    boom = ValueError("worker_init failed")

    def init(wid):
        calls.append(wid)
        if len(calls) == 1:
            raise boom

    data = arrays(10)
    with Loader(data, batch_size=2, workers=workers, worker_init=init, timeout=10) as loader:
        with pytest.raises(ValueError) as info:
            list(loader)
        assert info.value is boom
        assert any("worker_init(" in note for note in boom.__notes__), boom.__notes__
        del info
        check_batches(list(loader), data, 2)
        check_batches(list(loader), data, 2)   # and the epoch after: no further worker_init
    failed = calls[0]
    # The failed thread's number ran worker_init twice (itself, its
    # replacement); every other thread once.
    counts = collections.Counter(calls)
    assert counts[failed] == 2, calls
    assert all(n == 1 for wid, n in counts.items() if wid != failed), calls
    if workers != "auto":
        assert sorted(counts) == list(range(workers)), calls


# -- defect 7: close() from a signal handler while an epoch starts threads -----

SIGNAL_IN_START = """
import signal, threading
import numpy as np
import prefetch

real_start = threading.Thread.start
state = dict(starts=0, raised=False, closed=False)

def start(self):
    # The signal lands in the main thread inside Thread.start(), while the
    # loader's stage starts its threads (the loader's thread number {which}).
    if self.name.startswith("sig-w") and threading.current_thread() is threading.main_thread():
        state["starts"] += 1
        if state["starts"] == {which} + 1 and not state["raised"]:
            state["raised"] = True
            signal.raise_signal(signal.{sig})
    return real_start(self)

threading.Thread.start = start
loader = prefetch.Loader([np.full(3, i) for i in range(40)], batch_size=4, workers=4, name="sig",
                         timeout=20)

def handler(signum, frame):
    loader.close()
    state["closed"] = True

signal.signal(signal.{sig}, handler)
got = []
try:
    for b in loader:
        got.append(b)
except prefetch.ClosedError:
    pass
assert state["raised"] and state["closed"], state
assert loader.closed
alive = [t.name for t in threading.enumerate() if t.name.startswith("sig-w") and t.is_alive()]
print("ok", len(got), alive)
"""


@pytest.mark.parametrize("which", [0, 2])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGALRM"])
def test_close_from_a_signal_handler_while_an_epoch_starts_threads_returns(which, sig):
    """§4, §9 (issue 22 defect 7): the stage held its condition lock across
    Thread.start(), in which the main thread runs signal handlers; a handler
    calling close() then waited for that lock forever. Now close() returns,
    the loop ends, and no loader thread is left running."""
    r = run_python(textwrap.dedent(SIGNAL_IN_START).replace("{which}", str(which)).replace("{sig}", sig),
                   timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok "), r.stdout
    assert r.stdout.strip().endswith("[]"), r.stdout   # no loader thread outlives close()


def test_no_thread_starts_unjoined_when_close_runs_on_another_thread_while_threads_start():
    """§9 (commit e720740's guarantee, kept without holding the lock across
    Thread.start()): close() from another thread while the stage starts an
    epoch's threads returns only once every thread it started has ended,
    whichever of them gets there first; the epoch start then raises
    ClosedError, or comes first and its threads are among those joined."""
    pool = _Pool()
    stage = _MapStage(lambda x: x, assembly(MAP_SINGLE, None, pool, None, "race"), Options(name="race"), None, 1,
                      (), None, _StageHooks())
    real_start = threading.Thread.start
    closer = threading.Thread(target=stage.close, name="closer")
    seen = []

    def start(self):
        if self.name.startswith("race-w") and not seen:
            seen.append(self.name)
            real_start(closer)   # close() runs on another thread from here on
        real_start(self)

    threading.Thread.start = start
    try:
        try:
            stage.start_epoch(iter([[0], [1]]), 0, -1, 4, 1)
        except prefetch.ClosedError:
            pass
    finally:
        threading.Thread.start = real_start
    closer.join(20)
    assert not closer.is_alive()
    assert seen
    try:
        # close() has returned: every thread the stage started has ended.
        assert not [t.name for t in threading.enumerate() if t.name.startswith("race-w") and t.is_alive()]
        with pytest.raises(prefetch.ClosedError):
            stage.start_epoch(iter([[0]]), 1, -1, 4, 1)
    finally:
        pool.close()


# -- defect 14: a child forked inside dataset[i] -------------------------------

FORK_IN_DATASET = """
import os, time
import numpy as np
import prefetch

children = []

class Data:
    def __len__(self):
        return 24

    def __getitem__(self, i):
        if i == 3 and not children:
            pid = os.fork()
            if pid == 0:
                return np.full(3, i)   # the child does nothing else: it leaves dataset[i]
            children.append(pid)
        return np.full(3, i)

with prefetch.Loader(Data(), batch_size=4, workers={workers}, timeout=20) as loader:
    got = list(loader)
assert len(got) == 6, len(got)
for k, b in enumerate(got):
    assert (b == np.arange(4 * k, 4 * k + 4)[:, None]).all(), (k, b)
assert len(children) == 1
deadline = time.monotonic() + 15
while True:
    pid, status = os.waitpid(children[0], os.WNOHANG)
    if pid:
        break
    if time.monotonic() > deadline:
        os.kill(children[0], 9)
        os.waitpid(children[0], 0)
        raise SystemExit("the child forked inside dataset[i] did not exit")
    time.sleep(0.01)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
print("ok")
"""


@pytest.mark.fork_with_threads
@pytest.mark.parametrize("workers", [1, 3])
def test_child_forked_inside_dataset_getitem_exits_when_it_leaves_it(workers):
    """README (forking inside the source), §4 (issue 22 defect 14): a child
    forked inside dataset[i] runs on the loader thread's stack; when
    dataset[i] returns there it leaves without touching the parent's state,
    so the child (whose only thread it is) exits with status 0. It used to go
    back to claiming rows and wait forever. The parent's batches are intact."""
    r = run_python(FORK_IN_DATASET.replace("{workers}", str(workers)), timeout=40)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok", r.stdout


SIGNAL_WHILE_HOLDING_THE_STAGE_LOCK = """
import signal, threading
import numpy as np
import prefetch

real = threading.Condition.notify_all
state = dict(raised=False, closed=False, arm=False)

def notify_all(self):
    # The first notify on the main thread once armed: the stage's, with its lock held.
    if state["arm"] and not state["raised"] and threading.get_ident() == threading.main_thread().ident:
        state["raised"] = True
        signal.raise_signal(signal.SIGTERM)
    return real(self)

threading.Condition.notify_all = notify_all
loader = prefetch.Loader([np.full(3, i) for i in range(40)], batch_size=4, workers=4, timeout=20)

def handler(signum, frame):
    loader.close()
    state["closed"] = True

signal.signal(signal.SIGTERM, handler)
state["arm"] = True
try:
    for b in loader:
        pass
except prefetch.ClosedError:
    pass
print("ok", state["raised"], state["closed"],
      [t.name for t in threading.enumerate() if t.name.startswith("loader-") and t.is_alive()])
"""


def test_close_from_a_signal_handler_while_the_stage_lock_is_held_returns():
    """§4, §9 (issue 22 defect 7, the rest of it): a SIGTERM handler calling close()
    while the main thread holds the stage's condition lock (inside notify_all, as
    start_epoch does) deadlocked; now close() returns and no loader thread is left."""
    r = run_python(SIGNAL_WHILE_HOLDING_THE_STAGE_LOCK, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:3] == ["ok", "True", "True"], r.stdout
    assert r.stdout.strip().endswith("[]"), r.stdout
