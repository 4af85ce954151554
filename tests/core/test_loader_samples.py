"""prefetch.Loader and prefetch.map (SPEC §9, issue 22 defects 1, 5, 10, 11): what a
sample may be and do: numpy-integer indices, buffers refilled per thread on every
path, StopIteration from the dataset, one-shot samplers."""
import threading

import numpy as np
import pytest

import prefetch
from prefetch import Loader

# -- defect 1: numpy integers are sample indices --------------------------------


class Augment:
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return prefetch.sample_rng().random(3)


def test_sample_rng_takes_numpy_integer_indices_and_gives_the_int_index_stream():
    """§9 (issue 22 defect 1): sampler indices are any integers (operator.index); the
    stream of np.int64(5) is the one of 5, so a numpy permutation as the sampler works."""
    order = np.random.default_rng(0).permutation(12)          # np.int64 indices
    with Loader(Augment(), batch_size=None, sampler=order, seed=3, workers=2) as loader:
        got = list(loader)
    with Loader(Augment(), batch_size=None, sampler=order.tolist(), seed=3, workers=2) as loader:
        want = list(loader)
    assert len(got) == 12
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    for dtype in (np.int32, np.uint8, np.int64):
        with Loader(Augment(), batch_size=4, sampler=np.arange(12, dtype=dtype), seed=3,
                    workers=2) as loader:
            batches = list(loader)
        np.testing.assert_array_equal(np.concatenate(batches)[order], np.stack(want))


def test_sample_rng_still_refuses_a_bool_or_negative_index():
    def fn(x):
        return prefetch.sample_rng()

    with prefetch.map(fn, [0], workers=1) as results:
        assert isinstance(next(results), np.random.Generator)   # map: the item's position
    for key in (True, np.bool_(True), -1):
        with Loader(Augment(), batch_size=None, sampler=[key], workers=1) as loader:
            with pytest.raises((TypeError, IndexError)):
                list(loader)


# -- defect 5: a buffer refilled per thread, on every path ------------------------

def _refilling_fn():
    """fn(i) -> one np buffer per thread, refilled with i (as many decoders do)."""
    local = threading.local()

    def fn(i):
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = np.empty((4, 4), np.int64)
        buf[...] = i
        return buf
    return fn


class Refilling:
    def __init__(self, n):
        self.n = n
        self.fn = _refilling_fn()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.fn(i)


def _check_items(got, n):
    assert len(got) == n
    wrong = [k for k, g in enumerate(got) if not (g == k).all()]
    assert not wrong, f"{len(wrong)} of {n} items hold another item's values, e.g. {wrong[:5]}"


def test_batch_size_none_copies_a_per_thread_buffer_before_its_thread_loads_again():
    """§9 (issue 22 defect 5): with batch_size=None a dataset refilling one buffer per
    thread still gives every sample its own values, all kept."""
    with Loader(Refilling(200), batch_size=None, workers=2) as loader:
        _check_items(list(loader), 200)
        s = loader.stats()
        assert s.leaves_copied == 200 and s.bytes_copied == 200 * 16 * 8, s


def test_map_copies_a_per_thread_buffer_before_its_thread_calls_fn_again():
    """§9 (issue 22 defect 5): the same for prefetch.map."""
    with prefetch.map(_refilling_fn(), range(200), workers=2) as results:
        _check_items(list(results), 200)


def test_a_collate_result_reused_per_thread_is_copied_before_its_thread_loads_again():
    """§9 (issue 22 defect 5): collate=f runs on the thread that finished the batch; a
    result it refills per thread is copied before that thread loads again."""
    local = threading.local()

    def collate(samples):
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = np.empty(2, np.int64)
        buf[...] = [int(s) for s in samples]
        return buf

    with Loader(list(range(200)), batch_size=2, collate=collate, workers=2) as loader:
        got = list(loader)
    assert [g.tolist() for g in got] == [[k, k + 1] for k in range(0, 200, 2)]


def test_fresh_samples_are_handed_over_not_copied():
    """§3 rule 1 on the loader threads: a sample (or fn result) only the loader holds is
    handed out as it is; one the dataset keeps is copied."""
    with prefetch.map(lambda i: np.full(1000, i), range(20), workers=2) as results:
        got = list(results)
        s = results.stats()
    assert [int(g[0]) for g in got] == list(range(20))
    assert s.leaves_handed_over == 20 and s.leaves_copied == 0 and s.bytes_copied == 0, s
    data = [np.full(1000, i) for i in range(20)]
    with Loader(data, batch_size=None, workers=2) as loader:
        got = list(loader)
        s = loader.stats()
    assert not any(np.shares_memory(g, d) for g, d in zip(got, data))
    assert s.leaves_copied == 20 and s.leaves_handed_over == 0, s


def test_the_loader_threads_copies_reuse_pooled_blocks_across_epochs():
    """§5/§9: the copies the loader threads make come from the loader's pool, and once
    warm from reused blocks (the pool keeps enough free blocks for them)."""
    with Loader(Refilling(60), batch_size=None, workers=2, depth=2) as loader:
        for _ in range(5):
            for b in loader:
                pass
            del b
        s = loader.stats()
    assert s.blocks_allocated <= 12, s
    # One block per sample; the window (3) may hold the next epoch's first ones too (issue 24 item 3).
    assert 300 <= s.blocks_allocated + s.blocks_reused <= 303, s


def test_a_leaf_adapters_close_hook_runs_once_when_the_loader_closes():
    """§3 register_leaf(close=): a leaf the loader threads copied has its adapter's
    close hook run once by close(), after every epoch, not per epoch."""
    class Box:
        def __init__(self, v):
            self.v = v

    hooks = []
    prefetch.register_leaf(Box, lambda box, plan: Box(plan.array(box.v)),
                           close=lambda: hooks.append("closed"))
    with prefetch.map(lambda i: Box(np.full(3, i)), range(10), workers=2) as results:
        for _ in range(2):
            got = list(results)
            assert [int(g.v[0]) for g in got] == list(range(10))
        assert hooks == []
    assert hooks == ["closed"]


def test_device_delivery_still_gets_each_sample_of_batch_size_none():
    """§2 device= with the loader's own copies: every sample's array reaches the delivery."""
    log = []

    class Dev:
        pass

    class Delivery:
        def __init__(self, device):
            pass

        def deliver(self, leaf):
            log.append(int(leaf[0, 0]))
            return ("on-device", leaf.copy())

        def ready(self):
            pass

        def close(self):
            pass

    prefetch.register_device(Dev, Delivery)
    with Loader(Refilling(40), batch_size=None, workers=2, device=Dev()) as loader:
        got = list(loader)
    assert [g[0] for g in got] == ["on-device"] * 40
    assert [int(g[1][0, 0]) for g in got] == list(range(40)) == log


# -- defect 10: StopIteration from a sample is an error ---------------------------

class StopsAt:
    def __init__(self, n, bad):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise StopIteration("from the dataset")
        return np.full(2, i)


@pytest.mark.parametrize("batch_size", [2, None])
def test_stop_iteration_in_the_dataset_is_an_error_naming_the_sample(batch_size):
    """§9 (issue 22 defect 10): never a silent end of the loop; a RuntimeError (as PEP
    479 makes it for generators) caused by the StopIteration, with the usual note."""
    got = []
    with Loader(StopsAt(10, 5), batch_size=batch_size, workers=2) as loader:
        with pytest.raises(RuntimeError, match="StopIteration") as info:
            for b in loader:
                got.append(b)
    assert len(got) == (2 if batch_size else 5)
    assert isinstance(info.value.__cause__, StopIteration)
    assert str(info.value.__cause__) == "from the dataset"
    note = " ".join(info.value.__notes__)
    assert "sample 5" in note and "-w" in note and "batch" in note


def test_stop_iteration_in_a_map_function_is_an_error_naming_the_item():
    def fn(x):
        if x == 3:
            raise StopIteration
        return x

    with prefetch.map(fn, range(6), workers=2) as results:
        got = []
        with pytest.raises(RuntimeError, match="StopIteration") as info:
            for r in results:
                got.append(r)
    assert got == [0, 1, 2]
    assert isinstance(info.value.__cause__, StopIteration)
    assert "sample 3" in " ".join(info.value.__notes__)


def test_stop_iteration_in_collate_is_an_error():
    def collate(samples):
        if samples[0] == 4:
            raise StopIteration
        return np.array(samples)

    with Loader(list(range(10)), batch_size=2, collate=collate, workers=2) as loader:
        with pytest.raises(RuntimeError, match="StopIteration") as info:
            list(loader)
    assert isinstance(info.value.__cause__, StopIteration)
    assert "batch 3" in " ".join(info.value.__notes__)


# -- defect 11: a one-shot sampler's second epoch raises --------------------------

@pytest.mark.parametrize("kind", ["sampler", "batch_sampler"])
def test_a_one_shot_sampler_refuses_a_second_epoch(kind):
    """§9 (issue 22 defect 11): a generator as the sampler gives one epoch; the second
    raises RuntimeError saying why, never a silently empty epoch."""
    if kind == "sampler":
        loader = Loader(list(range(6)), batch_size=2, sampler=(i for i in range(6)), workers=2)
    else:
        loader = Loader(list(range(6)), batch_sampler=iter([[0, 1], [2, 3], [4, 5]]), workers=2)
    with loader:
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
        with pytest.raises(RuntimeError, match="one-shot") as info:
            for b in loader:
                pass
        assert kind in str(info.value)


def test_a_re_iterable_sampler_gives_every_epoch():
    with Loader(list(range(6)), batch_size=3, sampler=np.arange(6)[::-1], workers=2) as loader:
        for _ in range(3):
            assert [b.tolist() for b in loader] == [[5, 4, 3], [2, 1, 0]]
