"""prefetch.Loader and prefetch.map (SPEC §9, issue 16): batches, order, epochs,
collation into pooled rows, reproducible randomness, errors, close and bad input."""
import collections
import dataclasses
import threading

import numpy as np
import pytest

import prefetch
from prefetch import ClosedError, Loader


def arrays(n, shape=(3, 5), dtype=np.float32):
    return [np.full(shape, i, dtype) for i in range(n)]


def expected_batches(data, batch_size, drop_last=False, order=None):
    order = list(range(len(data))) if order is None else order
    out = []
    for s in range(0, len(order), batch_size):
        keys = order[s:s + batch_size]
        if len(keys) < batch_size and drop_last:
            break
        out.append(np.stack([data[k] for k in keys]))
    return out


# -- batches ------------------------------------------------------------------

@pytest.mark.parametrize("workers", [1, 2, 4, "auto"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_are_the_stacked_samples_in_order_for_every_worker_count(workers, drop_last):
    """§9: batches in sampler order, identical for every workers value; (B, *shape), same dtype."""
    data = arrays(23)
    with Loader(data, batch_size=4, workers=workers, drop_last=drop_last) as loader:
        got = list(loader)
        assert len(loader) == len(got) == (5 if drop_last else 6)
    want = expected_batches(data, 4, drop_last)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert type(g) is np.ndarray and g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_nested_samples_keep_their_structure_numbers_become_arrays_other_leaves_lists():
    """§9: same structure as a sample; numbers -> 1-D arrays; other leaves -> lists."""
    Point = collections.namedtuple("Point", "x y")

    @dataclasses.dataclass
    class Rec:
        image: np.ndarray
        label: int

    data = [{"p": Point(np.arange(3) + i, float(i)), "r": Rec(np.eye(2, dtype=np.uint8) * i, i),
             "name": f"s{i}", "flag": i % 2 == 0, "n": np.int16(i), "none": None}
            for i in range(5)]
    with Loader(data, batch_size=5, workers=3) as loader:
        (b,) = list(loader)
    assert type(b["p"]) is Point and type(b["r"]) is Rec
    np.testing.assert_array_equal(b["p"].x, np.stack([np.arange(3) + i for i in range(5)]))
    assert b["p"].y.dtype == np.float64 and b["p"].y.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert b["r"].image.dtype == np.uint8 and b["r"].image.shape == (5, 2, 2)
    assert b["r"].label.dtype == np.int64 and b["r"].label.tolist() == list(range(5))
    assert b["flag"].dtype == np.bool_ and b["flag"].tolist() == [True, False, True, False, True]
    assert b["n"].dtype == np.int16
    assert b["name"] == [f"s{i}" for i in range(5)] and b["none"] == [None] * 5


def test_strided_object_and_empty_arrays_are_stacked():
    data = [(np.arange(12.0).reshape(3, 4).T + i, np.array([str(i), None], dtype=object),
             np.zeros((0, 2)))
            for i in range(6)]
    with Loader(data, batch_size=3, workers=2) as loader:
        got = list(loader)
    for k, (t, o, e) in enumerate(got):
        np.testing.assert_array_equal(t, np.stack([data[3 * k + j][0] for j in range(3)]))
        assert o.dtype == object and o[1, 0] == str(3 * k + 1) and o[1, 1] is None
        assert e.shape == (3, 0, 2)


def test_ordered_false_gives_the_same_batches_in_completion_order():
    data = arrays(40)
    with Loader(data, batch_size=5, workers=4, ordered=False) as loader:
        got = sorted(b[:, 0, 0].tolist() for b in loader)
    assert got == [b[:, 0, 0].tolist() for b in expected_batches(data, 5)]


def test_a_sample_reused_buffer_per_thread_still_gives_distinct_batches():
    """§9: each sample is copied into its row before its thread loads again: a dataset
    that refills one buffer per thread (as many decoders do) is safe."""
    local = threading.local()

    class Refilling:
        def __len__(self):
            return 64

        def __getitem__(self, i):
            buf = getattr(local, "buf", None)
            if buf is None:
                buf = local.buf = np.empty((4, 4), np.int64)
            buf[...] = i
            return buf

    with Loader(Refilling(), batch_size=8, workers=3) as loader:
        got = list(loader)
    for k, b in enumerate(got):
        np.testing.assert_array_equal(b[:, 0, 0], np.arange(8 * k, 8 * k + 8))


def test_batches_share_no_memory_with_the_samples_and_are_never_rewritten():
    """§3 rule 1-2 for loaders: a batch kept while later ones are produced never changes."""
    data = arrays(32, shape=(64, 64))
    with Loader(data, batch_size=4, workers=2, depth=2) as loader:
        kept = list(loader)
        for sample in data:
            sample[...] = -1
    for k, b in enumerate(kept):
        assert not any(np.shares_memory(b, d) for d in data)
        np.testing.assert_array_equal(b[:, 0, 0], np.arange(4 * k, 4 * k + 4))


def test_collate_is_called_with_the_samples_and_its_result_handed_out():
    calls = []

    def collate(samples):
        calls.append(len(samples))
        return {"sum": np.sum(samples, axis=0), "n": len(samples)}

    with Loader(arrays(10), batch_size=4, collate=collate, workers=2) as loader:
        got = list(loader)
    assert sorted(calls) == [2, 4, 4]
    assert [g["n"] for g in got] == [4, 4, 2]
    np.testing.assert_array_equal(got[2]["sum"], np.full((3, 5), 17.0))
    assert loader.stats().leaves_handed_over >= 3   # fresh arrays from collate: no copy


def test_batch_size_none_hands_out_each_sample():
    data = [{"x": np.full(3, i)} for i in range(7)]
    with Loader(data, batch_size=None, workers=3) as loader:
        got = list(loader)
        assert len(loader) == 7
    assert [g["x"][0] for g in got] == list(range(7))
    assert not any(np.shares_memory(g["x"], d["x"]) for g, d in zip(got, data))


def test_batch_sampler_gives_the_batches():
    with Loader(arrays(10), batch_sampler=[[9, 0], [3], [4, 5, 6]], workers=2) as loader:
        got = [b[:, 0, 0].tolist() for b in loader]
        assert len(loader) == 3
    assert got == [[9.0, 0.0], [3.0], [4.0, 5.0, 6.0]]


# -- epochs, threads, randomness ------------------------------------------------

def test_each_loop_is_an_epoch_and_the_threads_persist():
    seen = set()

    class Data:
        def __len__(self):
            return 12

        def __getitem__(self, i):
            seen.add(threading.current_thread())   # the object: an ident may be reused
            return np.full(2, i)

    with Loader(Data(), batch_size=3, workers=2) as loader:
        first = [b.tolist() for b in loader]
        threads_after_first = set(seen)
        second = [b.tolist() for b in loader]
        assert loader.stats().workers == 2
    assert first == second
    # The same two threads in both epochs (one of them may have loaded
    # nothing in the first: a thread can take a small epoch's work alone).
    assert threads_after_first <= seen and len(seen) <= 2


def test_breaking_out_and_looping_again_starts_a_new_epoch():
    with Loader(arrays(20), batch_size=2, workers=2) as loader:
        for b in loader:
            break
        again = [b[:, 0, 0].tolist() for b in loader]
    assert again[0] == [0.0, 1.0] and len(again) == 10


def test_shuffle_depends_on_seed_and_epoch_only():
    def epochs(workers, seed):
        with Loader(arrays(30), batch_size=5, shuffle=True, seed=seed, workers=workers) as loader:
            return [[b[:, 0, 0].tolist() for b in loader] for _ in range(2)]

    one = epochs(1, 7)
    assert one == epochs(3, 7)
    assert one[0] != one[1]                    # a new order per epoch
    assert one != epochs(1, 8)
    flat = sorted(v for batch in one[0] for v in batch)
    assert flat == [float(i) for i in range(30)]


def test_sample_rng_is_reproducible_whatever_thread_runs_the_sample():
    class Augment:
        def __len__(self):
            return 40

        def __getitem__(self, i):
            return prefetch.sample_rng().random(3)

    def run(workers):
        with Loader(Augment(), batch_size=4, seed=11, workers=workers) as loader:
            return [np.concatenate(list(loader)) for _ in range(2)]

    a, b = run(1), run(4)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], a[1])                    # epochs differ
    assert len({tuple(r) for r in a[0]}) == 40               # samples differ


def test_sample_rng_outside_a_loader_thread_raises_stating_the_rule():
    with pytest.raises(RuntimeError, match=r"^sample_rng\(\) can only be called inside dataset\[i\] or map's "
                                           r"function while a prefetch loader thread runs it"):
        prefetch.sample_rng()
    assert prefetch.worker_info() is None


def test_worker_info_and_worker_init_on_each_thread():
    inits = []
    infos = []

    class Data:
        def __len__(self):
            return 16

        def __getitem__(self, i):
            infos.append(prefetch.worker_info())
            return np.zeros(1)

    with Loader(Data(), batch_size=2, workers=3, seed=5, worker_init=inits.append) as loader:
        list(loader)
    assert sorted(inits) == [0, 1, 2]
    assert {i.id for i in infos} <= {0, 1, 2}
    assert all(i.num_workers == 3 and i.seed == 5 and i.epoch == 0 for i in infos)


def test_a_sampler_with_set_epoch_is_told_each_epoch():
    class Sharded:
        def __init__(self):
            self.epochs = []

        def set_epoch(self, e):
            self.epochs.append(e)

        def __iter__(self):
            return iter(range(4))

        def __len__(self):
            return 4

    sampler = Sharded()
    with Loader(arrays(8), batch_size=2, sampler=sampler, workers=2) as loader:
        for _ in range(3):
            assert len(list(loader)) == 2
    assert sampler.epochs == [0, 1, 2]


def test_steady_state_reuses_pooled_blocks_across_epochs():
    """§5/§9: epochs share one pool; once warm, batches come from reused blocks."""
    with Loader(arrays(64, shape=(32, 32)), batch_size=8, workers=2, depth=2) as loader:
        for _ in range(5):
            for b in loader:
                pass
            del b
        stats = loader.stats()
    # 40 batches, one block each; alive at once at most: 2 open in the window, 2 in the
    # ring, the one being taken and the one the loop holds (+2 for the order blocks return in).
    # The window holds the next epoch's first batches too (opened before it starts, issue
    # 24 item 3): up to 2 more batches.
    assert stats.blocks_allocated <= 8
    assert 40 <= stats.blocks_allocated + stats.blocks_reused <= 42


# -- errors -----------------------------------------------------------------------

class Failing:
    def __init__(self, bad, exc):
        self.bad = bad
        self.exc = exc

    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == self.bad:
            raise self.exc
        return np.full(2, i)


@pytest.mark.parametrize("workers", [1, 3])
def test_a_dataset_error_reaches_the_consumer_after_the_batches_before_it(workers):
    """§9/§4: the same exception object, after the earlier batches, with a note naming
    the sample index, the batch and the thread; the epoch ends there."""
    exc = KeyError("missing")
    data = Failing(9, exc)
    got = []
    with Loader(data, batch_size=4, workers=workers) as loader:
        with pytest.raises(KeyError) as info:
            for b in loader:
                got.append(b[:, 0].tolist())
        assert info.value is exc
        note = " ".join(info.value.__notes__)
        assert "sample 9, row 2 of batch 3 (counted from 1)" in note and "-w" in note
        assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]
        with pytest.raises(StopIteration):
            next(loader)
        with pytest.raises(KeyError):   # a new epoch starts, and fails at the same sample
            list(loader)


def test_keyboard_interrupt_in_the_dataset_reaches_the_consumer():
    with Loader(Failing(0, KeyboardInterrupt()), batch_size=2, workers=2) as loader:
        with pytest.raises(KeyboardInterrupt):
            list(loader)


def test_samples_that_differ_name_the_path():
    data = [{"x": np.zeros((2, 3))}, {"x": np.zeros((2, 4))}]
    with Loader(data, batch_size=2, workers=1) as loader:
        with pytest.raises(ValueError, match=r"sample\['x'\] has shape \(2, 4\)") as info:
            list(loader)
    assert "sample 1" in " ".join(info.value.__notes__)
    data = [(np.zeros(2), 1), (np.zeros(2), 1, 2)]
    with Loader(data, batch_size=2, workers=1) as loader:
        with pytest.raises(ValueError, match="structure differs"):
            list(loader)
    data = [np.zeros(2, np.float32), np.zeros(2, np.float64)]
    with Loader(data, batch_size=2, workers=1) as loader:
        with pytest.raises(ValueError, match="dtype float64"):
            list(loader)
    data = [1, 2.5]
    with Loader(data, batch_size=2, workers=1) as loader:
        with pytest.raises(ValueError, match="is a float where"):
            list(loader)


def test_an_index_out_of_range_is_an_error_naming_it():
    with Loader(arrays(4), batch_size=2, sampler=[0, 1, 7, 2], workers=2) as loader:
        with pytest.raises(IndexError, match="index 7, out of range for a dataset of length 4"):
            list(loader)


def test_a_failing_collate_reaches_the_consumer_with_a_note():
    def collate(samples):
        raise RuntimeError("collate broke")

    with Loader(arrays(4), batch_size=2, collate=collate, workers=2) as loader:
        with pytest.raises(RuntimeError, match="collate broke") as info:
            next(loader)
    assert "collate" in " ".join(info.value.__notes__)


def test_timeout_names_what_is_loading_and_the_stream_continues():
    release = threading.Event()

    class Slow:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i == 2:
                release.wait(30)
            return np.full(1, i)

    with Loader(Slow(), batch_size=2, workers=1, timeout=0.2) as loader:
        try:
            assert next(loader).ravel().tolist() == [0, 1]
            with pytest.raises(TimeoutError, match=r"inside load\(2\)"):
                next(loader)
        finally:
            release.set()
        assert next(loader).ravel().tolist() == [2, 3]


def test_close_while_a_sample_hangs_returns_and_frees_everything():
    entered, release = threading.Event(), threading.Event()

    class Hang:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            entered.set()
            release.wait(30)
            return np.zeros(1)

    loader = Loader(Hang(), batch_size=1, workers=2)
    it = iter(loader)
    try:
        assert entered.wait(10)
        # The grace given, as people read it (not the 0.0999... s left of it).
        with pytest.warns(RuntimeWarning, match=r"still inside the dataset after 0\.1 s; it is left"):
            loader._stage.close(0.1)   # the grace close() gives, shortened
    finally:
        release.set()
    loader.close()
    assert loader.closed
    with pytest.raises(ClosedError):
        next(it)


def test_next_after_close_raises_closed_error():
    loader = Loader(arrays(4), batch_size=2)
    loader.close()
    with pytest.raises(ClosedError):
        next(loader)
    with pytest.raises(ClosedError):
        iter(loader)


class _Stream:
    """An iterable dataset: a new iterator each time."""

    def __iter__(self):
        return iter(range(4))


# -- bad input ----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(dataset=42), TypeError, "dataset must have __getitem__ and __len__"),
    (dict(dataset=iter([1, 2])), TypeError, "for an iterator or generator, prefetch.map"),
    (dict(dataset=_Stream(), shuffle=True), ValueError, "iterable dataset gives its samples in its own order"),
    (dict(batch_size=0), ValueError, "batch_size must be an int >= 1"),
    (dict(batch_size=2.5), TypeError, "batch_size must be an int"),
    (dict(workers=0), ValueError, "workers must be an int >= 1"),
    (dict(workers="many"), ValueError, "workers must be an int >= 1 or 'auto', got 'many'"),
    (dict(workers=1.5), TypeError, "workers must be"),
    (dict(sampler=3), TypeError, "sampler must be an iterable of indices, got 3"),
    (dict(sampler=[0], shuffle=True), ValueError, "excludes shuffle"),
    (dict(batch_sampler=[[0]], batch_size=2), ValueError, "batch_sampler gives the batches itself"),
    (dict(collate=3), TypeError, "collate must be callable"),
    (dict(shuffle="yes"), TypeError, "shuffle must be a bool"),
    (dict(seed=-1), ValueError, "seed must be an int >= 0"),
    (dict(depth=0), ValueError, "depth must be an int >= 1"),
    (dict(timeout=-1), ValueError, "timeout must be"),
])
def test_bad_arguments_fail_at_construction_naming_them(kwargs, exc, match):
    kwargs.setdefault("dataset", arrays(4))
    with pytest.raises(exc, match=match):
        Loader(**kwargs)


# -- map ------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [1, 4])
def test_map_gives_results_in_order(workers):
    with prefetch.map(lambda x: np.full(2, x * x), range(30), workers=workers) as results:
        got = [r[0] for r in results]
    assert got == [x * x for x in range(30)]


def test_map_error_is_the_same_object_after_the_earlier_results():
    exc = ZeroDivisionError("x")

    def fn(x):
        if x == 5:
            raise exc
        return x

    with prefetch.map(fn, range(10), workers=3) as results:
        got = []
        with pytest.raises(ZeroDivisionError) as info:
            for r in results:
                got.append(r)
    assert info.value is exc and got == [0, 1, 2, 3, 4]


def test_map_over_a_one_shot_iterator_refuses_a_second_epoch():
    with prefetch.map(str, iter(range(3)), workers=2) as results:
        assert list(results) == ["0", "1", "2"]
        with pytest.raises(RuntimeError, match="one-shot"):
            iter(results)


def test_auto_workers_start_nothing_before_the_first_epoch_and_show_the_count_in_use():
    """§9: stats().workers is the thread count in use (how workers="auto" decides it is
    tests/core/test_tune.py's, fed windows; bench/bench_loader_scaling.py runs it)."""
    with Loader(np.arange(16), batch_size=4, workers="auto") as loader:
        assert loader.stats().workers == 0
        assert [b.tolist() for b in loader] == [list(range(s, s + 4)) for s in range(0, 16, 4)]
        assert loader.stats().workers >= 1


def test_device_delivers_each_collated_batch_and_is_opened_and_closed_once():
    """§9/§2 device=: every array leaf of a batch goes to the device's delivery, in the
    background; over three epochs the delivery is opened once and closed once."""
    log = []

    class Dev:
        pass

    class Delivery:
        def __init__(self, device):
            log.append("open")

        def deliver(self, leaf):
            return ("on-device", leaf.copy())

        def ready(self):
            log.append("ready")

        def close(self):
            log.append("close")

    prefetch.register_device(Dev, Delivery)
    data = [(np.full(3, i), i) for i in range(8)]
    with Loader(data, batch_size=4, workers=2, device=Dev()) as loader:
        for _ in range(3):
            got = list(loader)
            assert [g[0][0] for g in got] == ["on-device"] * 2
            np.testing.assert_array_equal(got[1][0][1][:, 0], [4, 5, 6, 7])
            np.testing.assert_array_equal(got[1][1][1], [4, 5, 6, 7])
    assert log.count("open") == 1 and log.count("close") == 1 and log[-1] == "close"
    assert log.count("ready") == 6
