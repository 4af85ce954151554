"""A Loader is an iterable of epochs, and its publisher is the one core's
(SPEC §9, issue 22 defects 4, 6, 8, 13, 15 and the ordered=False skip):
iter(loader) starts an epoch atomically and returns its iterator, threads
share one epoch, max_bytes bounds collated batches, and a loader refuses
what would hang (a fork, next() from its own thread)."""
import gc
import os
import threading
import time
import weakref

import numpy as np
import pytest

import prefetch
from prefetch import Loader, Prefetcher
from support import run_python


def data(n, shape=(4,)):
    return [np.full(shape, i, np.int64) for i in range(n)]


def rows(batches):
    return [int(v) for b in batches for v in np.asarray(b)[:, 0]]


# -- defect 15: iter(loader) is an epoch iterator ------------------------------

def test_next_then_for_over_one_epoch_iterator_continues_that_epoch():
    """§9: `it = iter(loader); next(it); for b in it` is one epoch: no batch twice."""
    with Loader(data(20), batch_size=4, workers=2) as loader:
        it = iter(loader)
        first = next(it)
        rest = list(it)
    assert rows([first] + rest) == list(range(20))


def test_each_iter_starts_a_new_epoch_with_every_batch():
    with Loader(data(10), batch_size=3, workers=2, shuffle=True, seed=1) as loader:
        a, b = list(loader), list(loader)
    assert sorted(rows(a)) == sorted(rows(b)) == list(range(10))
    assert rows(a) != rows(b)   # epochs 0 and 1: two orders from (seed, epoch)


@pytest.mark.parametrize("shortcut", [False, True])
def test_threads_calling_next_share_one_epoch_each_sample_once(shortcut):
    """§9: threads calling next() on one epoch iterator share that epoch; with
    next(loader) on a fresh loader the first epoch starts once, however many
    threads ask at the same moment (no sample twice, none lost)."""
    n, nthreads = 40, 4
    with Loader(data(n), batch_size=2, workers=2) as loader:
        source = loader if shortcut else iter(loader)
        start = threading.Barrier(nthreads)
        got = [[] for _ in range(nthreads)]
        errors = []

        def consume(k):
            start.wait(timeout=10)
            try:
                while True:
                    got[k].append(next(source))
            except StopIteration:
                pass
            except BaseException as exc:   # a second epoch's start would close this one
                errors.append(exc)

        threads = [threading.Thread(target=consume, args=(k,)) for k in range(nthreads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert sorted(rows([b for g in got for b in g])) == list(range(n))


def test_an_epoch_iterator_replaced_by_a_newer_epoch_ends_not_closed():
    """§9 (issue 32): iter(loader) again ends the epoch before it; next() on
    the replaced iterator meets the end of its epoch (StopIteration), not
    ClosedError: the loader was never closed. Before: ClosedError."""
    with Loader(data(12), batch_size=3, workers=2) as loader:
        old = iter(loader)
        assert rows([next(old)]) == [0, 1, 2]
        new = iter(loader)
        with pytest.raises(StopIteration):
            next(old)
        assert rows(list(new)) == list(range(12))
        assert not loader.closed


@pytest.mark.timeout(30)
def test_a_thread_waiting_in_next_while_another_starts_an_epoch_is_not_told_closed():
    """§9 (issue 32): a thread waiting in next(loader) while another thread
    starts an epoch gets the end of the epoch it waited on (or a batch of the
    new one, had it not begun waiting yet), never ClosedError."""
    entered, release = threading.Event(), threading.Event()

    class Slow:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            entered.set()
            if not release.wait(20):
                raise TimeoutError("the test never released the dataset")
            return np.full(2, i)

    outcome = []
    with Loader(Slow(), batch_size=2, workers=1) as loader:
        def waiter():
            try:
                outcome.append(next(loader))
            except BaseException as exc:
                outcome.append(exc)

        t = threading.Thread(target=waiter)
        t.start()
        assert entered.wait(10)
        new = iter(loader)   # replaces the epoch the waiter waits on
        release.set()
        t.join(20)
        assert not t.is_alive()
        got = list(new)
    assert len(outcome) == 1
    assert isinstance(outcome[0], (StopIteration, np.ndarray)), repr(outcome[0])
    assert rows(got) == list(range(8))


def test_an_epoch_iterator_keeps_its_loader_alive():
    """`for b in Loader(...)` holds only the epoch iterator: the loader must not
    be collected (and closed) under the loop."""
    total = []
    for b in Loader(data(12), batch_size=4, workers=2):
        total.extend(np.asarray(b)[:, 0].tolist())
    assert total == list(range(12))


# -- defect 13: a Loader is a re-iterable source with a length ----------------

def test_a_prefetcher_over_a_loader_has_its_length_and_batches():
    with Loader(data(10), batch_size=4, workers=2) as loader:
        with Prefetcher(loader, depth=2) as p:
            assert len(p) == len(loader) == 3
            assert rows(list(p)) == list(range(10))
            assert rows(list(p)) == list(range(10))   # a second epoch over the loader


# -- defect 8: dataset[i] calling next() on its own loader ---------------------

@pytest.mark.timeout(30)
def test_next_on_the_loader_from_inside_its_dataset_is_an_error_not_a_hang():
    class Reentrant:
        loader = None

        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i == 2:
                next(self.loader)
            return np.zeros(2)

    ds = Reentrant()
    with Loader(ds, batch_size=1, workers=2) as loader:
        ds.loader = loader
        it = iter(loader)
        next(it)
        next(it)
        with pytest.raises(RuntimeError, match="its own threads") as info:
            next(it)
    assert any("sample 2" in note for note in info.value.__notes__)


# -- defect 6: a loader inherited through fork ---------------------------------

@pytest.mark.fork_with_threads
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_new_epoch_in_a_forked_child_raises_and_never_hangs():
    code = """
import os, sys, time, warnings
import numpy as np
from prefetch import Loader
warnings.simplefilter("ignore", DeprecationWarning)   # fork with threads (3.12+)
loader = Loader([np.zeros(2)] * 8, batch_size=2, workers=2)
assert len(list(loader)) == 4
pid = os.fork()
if pid == 0:
    try:
        for b in loader:
            os._exit(3)
    except RuntimeError as e:
        os._exit(0 if "os.fork()" in str(e) else 4)
    os._exit(5)
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.01)
else:
    os.kill(pid, 9)
    sys.exit("the child hung")
assert os.waitstatus_to_exitcode(status) == 0, status
assert len(list(loader)) == 4   # the parent's loader is unaffected
loader.close()
print("ok")
"""
    r = run_python(code, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


# -- defect 4: max_bytes counts collated batches -------------------------------

@pytest.mark.timeout(30)
def test_max_bytes_bounds_collated_batches_held_ahead():
    """§9: with the default collate, max_bytes of one batch keeps the loader from
    loading batches far ahead (before: 8 batches of 1 MiB behind a 1 MiB cap).
    A bounded wait for a sample that must not be loaded: the overrun shows
    within milliseconds when the cap is ignored."""
    sample = 128 * 1024
    overrun = threading.Event()

    class Big:
        def __len__(self):
            return 64

        def __getitem__(self, i):
            if i >= 3 * 8:   # a fourth batch: more than the cap allows ahead
                overrun.set()
            return np.full(sample, i % 256, np.uint8)

    with Loader(Big(), batch_size=8, workers=2, depth=8, max_bytes=8 * sample) as loader:
        it = iter(loader)
        assert not overrun.wait(1.0), "batches loaded far past max_bytes"
        got = list(it)
    assert [int(b[0, 0]) for b in got] == [(8 * k) % 256 for k in range(8)]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", ["batch_size=None", "collate=f"])
@pytest.mark.full
def test_max_bytes_bounds_batches_held_ahead_in_every_batching_mode(mode):
    """§9 (issue 32): max_bytes bounds what is held ahead without the default
    collate too, counted from the batches' real sizes. Before: a batch was
    counted at an estimate that only the default collate ever replaced (0
    for a batch handed over uncopied), so 5 to 8 batches were loaded under
    a cap of 2.5. A bounded wait for a sample that must not be loaded, as
    above."""
    sample = 256 * 1024
    overrun = threading.Event()
    per_batch = 1 if mode == "batch_size=None" else 2

    class Big:
        def __len__(self):
            return 64

        def __getitem__(self, i):
            if i >= 3 * per_batch:   # a fourth batch: the cap holds 2.5 batches ahead
                overrun.set()
            return np.full(sample, i % 256, np.uint8)

    if mode == "batch_size=None":
        loader = Loader(Big(), batch_size=None, workers=2, depth=8, max_bytes=5 * sample // 2)
    else:
        loader = Loader(Big(), batch_size=2, workers=2, depth=8, max_bytes=5 * sample,
                        collate=lambda samples: np.stack(samples))
    with loader:
        it = iter(loader)
        assert not overrun.wait(1.0), "batches loaded far past max_bytes"
        got = [int(np.asarray(b).reshape(-1)[0]) for b in it]
    assert got == [(per_batch * k) % 256 for k in range(64 // per_batch)]


# -- ordered=False never hands out a batch whose rows were skipped -------------

class _NotedKeyError(KeyError):
    """Sets ``noted`` when the loader adds its note: the failure is recorded."""

    noted = None

    @property
    def __notes__(self):
        try:
            return self._notes
        except AttributeError:
            raise AttributeError("__notes__") from None

    @__notes__.setter
    def __notes__(self, value):
        self._notes = value
        type(self).noted.set()


@pytest.mark.timeout(60)
def test_unordered_a_batch_after_a_failed_one_is_never_handed_out():
    """A batch opened after the failing one has its remaining rows skipped
    (never loaded): with ordered=False it was handed out with uninitialised
    rows. Now the next batch waits for the failed one, whose error comes."""
    row0_free, four, noted = threading.Event(), threading.Event(), threading.Event()
    _NotedKeyError.noted = noted

    class D:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i == 0:
                row0_free.wait(20)
            elif i == 3:
                four.wait(20)
                raise _NotedKeyError("boom")
            elif i == 4:
                four.set()
                noted.wait(20)   # until the failure of row 3 is recorded
            return np.full(2, i)

    with Loader(D(), batch_size=4, workers=3, ordered=False, timeout=2.0) as loader:
        it = iter(loader)
        with pytest.raises(TimeoutError):
            next(it)   # batch 0 waits for row 0; batch 1 (rows skipped) must not come
        row0_free.set()
        with pytest.raises(KeyError, match="boom"):
            next(it)


# -- one name, one meaning (issue 22 item 3) -----------------------------------

def test_a_prefetchers_workers_show_the_same_in_repr_and_stats():
    with Prefetcher([np.zeros(4)] * 3, workers=3) as p:
        list(p)
        assert p.stats().workers == 3 and "workers=3" in repr(p)
    with Loader(data(8), batch_size=2, workers=2) as loader:
        list(loader)
        assert loader.stats().workers == 2 and "workers=2" in repr(loader)


def test_adapter_close_hooks_run_once_over_several_epochs():
    """A leaf adapter's close hook returns what the copies hold (an engine sync):
    once, when the prefetcher closes, not once per epoch (it ran 3 times over 3)."""
    from prefetch import register_leaf

    class Leaf:
        pass

    hooks = []
    register_leaf(Leaf, lambda leaf, plan: Leaf(), close=lambda: hooks.append("hook"))
    with Prefetcher([(Leaf(), np.zeros(2))] * 2) as p:
        for _ in range(3):
            assert len(list(p)) == 2
        assert hooks == []
    assert hooks == ["hook"]


# -- issue 24 item 3: the next epoch starts before this one ends ---------------

class Tag:
    """An object leaf: the batch keeps it in a list, so a weak reference to it
    tells whether the batch that holds it is still held."""


class Watched:
    """Each sample is its index and a draw from its sample_rng(), with a Tag;
    records (epoch, index) of every load and a weak reference to its Tag.
    Loads of epoch ``gated`` past its first batch (``free``) wait for ``gate``."""

    def __init__(self, n, gated=-1, free=()):
        self.n = n
        self.cv = threading.Condition()
        self.loads = []
        self.tags = []
        self.gated, self.free, self.gate = gated, set(free), threading.Event()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        epoch = prefetch.worker_info().epoch
        if epoch == self.gated and i not in self.free:
            self.gate.wait(20)
        tag = Tag()
        with self.cv:
            self.loads.append((epoch, i))
            self.tags.append((epoch, weakref.ref(tag)))
            self.cv.notify_all()
        return np.array([i, prefetch.sample_rng().integers(1 << 40)], np.int64), tag

    def wait_loaded(self, epoch, keys):
        """True once every index of ``keys`` was loaded for ``epoch``."""
        with self.cv:
            return self.cv.wait_for(lambda: {(epoch, k) for k in keys} <= set(self.loads), 10)

    def alive(self, epoch):
        gc.collect()
        return sum(r() is not None for e, r in self.tags if e == epoch)


def values(batches):
    return [tuple(r) for b in batches for r in np.asarray(b[0]).reshape(-1, 2).tolist()]


def fresh(n, epoch, **kwargs):
    """Epoch ``epoch`` of a new loader: nothing opened before it started."""
    with Loader(Watched(n), epoch=epoch, **kwargs) as loader:
        return values(list(loader))


def first_batch(n, epoch, batch_size, **kwargs):
    return [i for i, _ in fresh(n, epoch, batch_size=batch_size, **kwargs)[:batch_size]]


def wait_freed(ds, epoch):
    """Until no Tag of ``epoch`` is held (a loader thread may be returning one)."""
    deadline = time.monotonic() + 10
    while ds.alive(epoch) and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    return ds.alive(epoch)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_next_epochs_first_batch_is_loaded_before_iter_starts_it(workers):
    """Issue 24 item 3: once epoch 1's last batch is taken, epoch 2's first batch
    is loaded before iter(loader) starts epoch 2; epoch 2 then hands out exactly
    what a new loader's epoch 2 does, and no sample of it is loaded twice."""
    kwargs = dict(batch_size=4, shuffle=True, seed=3, workers=workers)
    ds = Watched(24)
    with Loader(ds, **kwargs) as loader:
        epoch0 = values(list(loader))
        epoch1 = values(list(loader))
        assert ds.wait_loaded(2, first_batch(24, 2, **kwargs)), "epoch 2's first batch was not loaded ahead"
        epoch2 = values(list(loader))
    assert [epoch0, epoch1, epoch2] == [fresh(24, e, **kwargs) for e in range(3)]
    epoch2_loads = [i for e, i in ds.loads if e == 2]
    assert sorted(epoch2_loads) == list(range(24)), "a sample of epoch 2 was loaded twice"


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size, drop_last", [(3, False), (3, True), (None, False)])
@pytest.mark.parametrize("workers", [1, 2])
def test_epochs_opened_early_hand_out_what_new_loaders_hand_out(shuffle, batch_size, drop_last, workers):
    """Issue 24 item 3: the same batches, order and sample_rng() streams as
    epochs nothing was opened ahead for; every sample loaded once per epoch."""
    kwargs = dict(batch_size=batch_size, drop_last=drop_last, shuffle=shuffle, seed=9, workers=workers)
    ds = Watched(10)
    with Loader(ds, **kwargs) as loader:
        got = [values(list(loader)) for _ in range(4)]
    assert got == [fresh(10, e, **kwargs) for e in range(4)]
    for e in range(4):
        loaded = sorted(i for ep, i in ds.loads if ep == e)
        assert loaded == sorted(i for i, _ in got[e]) or (drop_last and len(loaded) == 10)


def test_unordered_epochs_opened_early_lose_and_repeat_nothing():
    kwargs = dict(batch_size=3, shuffle=True, seed=2, workers=2, ordered=False)
    with Loader(Watched(20), **kwargs) as loader:
        got = [sorted(values(list(loader))) for _ in range(4)]
    assert got == [sorted(fresh(20, e, **kwargs)) for e in range(4)]


@pytest.mark.parametrize("epoch", [2, 5])
def test_set_epoch_between_epochs_keeps_the_same_epoch_and_drops_another(epoch):
    """Issue 24 item 3: set_epoch(2) where epoch 2 was opened ahead keeps it (no
    sample loaded twice); set_epoch(5) drops it at once (its batches freed
    before iter()) and epoch 5 is what a new loader's is."""
    kwargs = dict(batch_size=4, shuffle=True, seed=3, workers=2)
    first = first_batch(24, 2, **kwargs)
    ds = Watched(24, gated=2, free=first)
    with Loader(ds, **kwargs) as loader:
        list(loader)
        list(loader)
        assert ds.wait_loaded(2, first)
        loader.set_epoch(epoch)
        if epoch != 2:
            assert wait_freed(ds, 2) == 0, "the batches opened for epoch 2 outlived set_epoch(5)"
        ds.gate.set()
        got = values(list(loader))
    assert got == fresh(24, epoch, **kwargs)
    if epoch == 2:
        assert sorted(i for e, i in ds.loads if e == 2) == list(range(24))


@pytest.mark.parametrize("workers", [1, 2])
def test_load_state_dict_between_epochs_drops_the_epoch_opened_early(workers):
    """Issue 24 items 1 and 3: a state of epoch 1 taken mid-way and loaded once
    epoch 2 was opened ahead: epoch 2's batches are freed at once and the rest
    of epoch 1 comes again, values and order."""
    kwargs = dict(batch_size=4, shuffle=True, seed=3, workers=workers)
    first = first_batch(24, 2, **kwargs)
    ds = Watched(24, gated=2, free=first)
    with Loader(ds, **kwargs) as loader:
        list(loader)
        it = iter(loader)
        head = [next(it), next(it)]
        state = loader.state_dict()
        rest = values(list(it))
        del head
        assert ds.wait_loaded(2, first)
        loader.load_state_dict(state)
        assert wait_freed(ds, 2) == 0, "the batches opened for epoch 2 outlived load_state_dict"
        ds.gate.set()
        resumed = values(list(loader))
        following = values(list(loader))
    assert resumed == rest
    assert following == fresh(24, 2, **kwargs)


def test_close_after_a_break_frees_the_epoch_opened_early():
    """Issue 24 item 3: a loop left by break once epoch 2 was opened ahead, then
    close(): nothing of either epoch is held."""
    kwargs = dict(batch_size=4, shuffle=True, seed=3, workers=2, depth=2)
    first = first_batch(24, 2, **kwargs)
    ds = Watched(24)
    loader = Loader(ds, **kwargs)
    list(loader)
    for k, b in enumerate(loader):
        if k == 3:   # batches 4 and 5 fit the ring: every batch of epoch 1 opens
            break
    del b
    assert ds.wait_loaded(2, first)
    loader.close()
    assert ds.alive(1) == ds.alive(2) == 0


def test_each_epochs_copy_counters_count_its_own_batches():
    """Issue 24 item 3: an epoch's stats() count the copies of its own batches,
    not those of the next epoch's first batches, made before it started."""
    data = [np.full(1000, i) for i in range(20)]
    with Loader(data, batch_size=None, workers=2) as loader:
        counts = []
        for _ in range(4):
            assert len(list(loader)) == 20
            s = loader.stats()
            counts.append((s.leaves_copied, s.bytes_copied))
    assert counts == [(20, 20 * 8000)] * 4
