"""prefetch.torch.DataLoader against torch.utils.data.DataLoader (issue 17 items 1
and 3, SPEC §9): the same batches, orders, errors for bad arguments and
attributes as torch's, on threads; IterableDataset replicas per worker; the
seeds' stories (an exception in __getitem__, a dataset that cannot be pickled,
multiprocessing and threading primitives) beside torch's own behaviour.

torch's own loader runs with num_workers=0 where only its batches matter (its
batches do not depend on num_workers), and with processes only where the
story is about processes."""
import collections
import gc
import math
import random
import sys
import threading
import traceback
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import BatchSampler, Dataset, IterableDataset, SequentialSampler, TensorDataset  # noqa: E402
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402

import prefetch.torch  # noqa: E402
from prefetch.torch import DataLoader, get_worker_info  # noqa: E402
from support import (  # noqa: E402
    RaisingDataset,
    SharedDataset,
    Sized,
    UnpicklableDataset,
    a_generator,
    assert_refused_and_usable,
    assert_same,
    free_the_frames,
)

Point = collections.namedtuple("Point", "x y")


class Mixed(Dataset):
    """Every kind of leaf default_collate treats differently."""

    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"t": torch.full((2, 3), float(i)), "a": np.arange(4, dtype=np.int16) + i,
                "i": i, "f": i / 2, "b": i % 2 == 0, "s": f"s{i}", "np_f": np.float32(i),
                "pair": (torch.tensor([i, -i]), i * 10), "p": Point(i, [i, i + 1])}


def assert_all_same(ours, theirs):
    assert len(ours) == len(theirs)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        assert_same(a, b, f"batch {k}")


# -- what torch's constructor gives ------------------------------------------------

def test_is_a_torch_dataloader_and_generic():
    assert issubclass(DataLoader, TorchLoader)
    alias = DataLoader[int]
    loader = alias(list(range(5)), batch_size=2)
    assert isinstance(loader, DataLoader)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]


def test_attributes_as_torch_sets_them():
    ds = Mixed()

    def init(worker_id):
        pass

    g = torch.Generator()
    kwargs = dict(batch_size=3, shuffle=True, num_workers=2, worker_init_fn=init, generator=g, timeout=5,
                  drop_last=True, prefetch_factor=3, persistent_workers=True, in_order=False)
    ours, theirs = DataLoader(ds, **kwargs), TorchLoader(ds, **kwargs)
    for name in ("dataset", "batch_size", "num_workers", "drop_last", "timeout", "worker_init_fn",
                 "generator", "pin_memory", "prefetch_factor", "persistent_workers", "in_order",
                 "multiprocessing_context", "pin_memory_device", "collate_fn"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert type(ours.sampler) is type(theirs.sampler) and ours.sampler.generator is g
    assert type(ours.batch_sampler) is BatchSampler and ours.batch_sampler.batch_size == 3
    assert ours.batch_sampler.drop_last and len(ours) == len(theirs) == 3
    with pytest.raises(ValueError, match="batch_size attribute should not be set after DataLoader"):
        ours.batch_size = 4
    ours.close()


@pytest.mark.parametrize("batch_size,drop_last,n", [(1, False, 10), (3, False, 10), (3, True, 10),
                                                    (4, True, 3), (None, False, 7)])
def test_len(batch_size, drop_last, n):
    loader = DataLoader(list(range(n)), batch_size=batch_size, drop_last=drop_last, num_workers=2)
    expected = n if batch_size is None else (n // batch_size if drop_last else math.ceil(n / batch_size))
    assert len(loader) == expected == len(list(loader))
    assert len(iter(loader)) == expected


class Counting(IterableDataset):
    """range(start, end), sharded by worker when ``shard`` (torch's documented pattern)."""

    def __init__(self, start, end, shard=True):
        self.start, self.end, self.shard = start, end, shard

    def __iter__(self):
        info = get_worker_info()
        if info is None or not self.shard:
            return iter(range(self.start, self.end))
        per = math.ceil((self.end - self.start) / info.num_workers)
        lo = self.start + info.id * per
        return iter(range(lo, min(lo + per, self.end)))

    def __len__(self):
        return self.end - self.start


BAD_ARGUMENTS = [
    dict(num_workers=-1), dict(timeout=-1), dict(batch_size=None, drop_last=True),
    dict(prefetch_factor=2), dict(num_workers=1, prefetch_factor=-1), dict(persistent_workers=True),
    dict(multiprocessing_context="fork"), dict(num_workers=1, multiprocessing_context="bad"),
    dict(num_workers=1, multiprocessing_context=object()),
    dict(batch_size=11, sampler=[0, 1], shuffle=True), dict(sampler=[0, 1], shuffle=3),
    dict(batch_size=11, batch_sampler=[[0]]), dict(shuffle=True, batch_sampler=[[0]]),
    dict(drop_last=True, batch_sampler=[[0]]), dict(drop_last=3, batch_sampler=[[0]]),
    dict(sampler=[0], batch_sampler=[[0]]),
]
ITERABLE_BAD_ARGUMENTS = [dict(shuffle=True), dict(shuffle=3), dict(sampler=[0]), dict(batch_sampler=[[0]])]


@pytest.mark.parametrize("kwargs", BAD_ARGUMENTS + [dict(kw, iterable=True) for kw in ITERABLE_BAD_ARGUMENTS],
                         ids=repr)
def test_bad_arguments_raise_what_torch_raises(kwargs):
    """torch's test_dataloader checks these exception types and messages."""
    kwargs = dict(kwargs)
    ds = Counting(0, 4) if kwargs.pop("iterable", False) else list(range(4))
    with pytest.raises(Exception) as theirs:
        TorchLoader(ds, **kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        DataLoader(ds, **kwargs)
    assert str(ours.value) == str(theirs.value) and str(ours.value)


# -- batches and orders -------------------------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 1, 3])
@pytest.mark.parametrize("batch_size,drop_last", [(1, False), (4, False), (4, True), (None, False)])
def test_batches_equal_torchs(num_workers, batch_size, drop_last):
    """default_collate's semantics: tensors and numpy arrays stacked into tensors,
    numbers into tensors of torch's dtypes, strings into lists, tuples into lists,
    namedtuples and dicts kept; batch_size=None: default_convert per sample."""
    ds = Mixed(10)
    ours = list(DataLoader(ds, batch_size=batch_size, drop_last=drop_last, num_workers=num_workers))
    theirs = list(TorchLoader(ds, batch_size=batch_size, drop_last=drop_last))
    assert_all_same(ours, theirs)


def test_custom_collate_fn_and_batch_sampler():
    ds = Mixed(9)
    sampler = BatchSampler(SequentialSampler(range(9)), 4, drop_last=False)

    def collate(samples):
        return [s["i"] for s in samples]

    assert list(DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=2)) == \
        [[0, 1, 2, 3], [4, 5, 6, 7], [8]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_generator_gives_torchs_shuffle(num_workers):
    """The same generator seed gives the order torch gives, epoch after epoch."""
    ds = TensorDataset(torch.arange(50))

    def epochs(cls, g):
        loader = cls(ds, batch_size=7, shuffle=True, generator=g, **(
            dict(num_workers=num_workers) if cls is DataLoader else {}))
        return [[b[0].tolist() for b in loader] for _ in range(3)]

    ours = epochs(DataLoader, torch.Generator().manual_seed(12))
    theirs = epochs(TorchLoader, torch.Generator().manual_seed(12))
    assert ours == theirs
    assert ours[0] != ours[1]   # reshuffled per epoch
    torch.manual_seed(3)        # without a generator: torch's global one, drawn the same way
    ours = epochs(DataLoader, None)
    torch.manual_seed(3)
    assert ours == epochs(TorchLoader, None)


def test_unordered_gives_every_batch():
    loader = DataLoader(list(range(40)), batch_size=4, num_workers=3, in_order=False)
    batches = [b.tolist() for b in loader]
    assert sorted(batches) == [list(range(k, k + 4)) for k in range(0, 40, 4)]


def test_concurrent_iterators_are_independent():
    loader = DataLoader(list(range(12)), batch_size=5, num_workers=2)
    pairs = list(zip(loader, loader))
    assert [(a.tolist(), b.tolist()) for a, b in pairs] == [(list(range(k, min(k + 5, 12))),) * 2
                                                            for k in (0, 5, 10)]


def test_set_epoch_of_a_batch_sampler_is_left_to_the_user():
    """torch's DataLoader never calls set_epoch; the user does."""

    class EpochBatches:
        def __init__(self):
            self.epoch = None

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __iter__(self):
            return iter([[self.epoch, self.epoch]])

        def __len__(self):
            return 1

    sampler = EpochBatches()
    loader = DataLoader(list(range(10)), batch_sampler=sampler, num_workers=2)
    for epoch in (5, 6):
        sampler.set_epoch(epoch)
        assert [b.tolist() for b in loader] == [[epoch, epoch]]


# -- workers: info, init, seeds, persistence -----------------------------------------

class WhoLoads(Dataset):
    """Item i: what get_worker_info() says on the thread loading it."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        info = get_worker_info()
        if info is None:
            return None
        return (info.id, info.num_workers, info.seed, info.dataset is self, info.worker_method,
                threading.current_thread())


def _samples(batches):
    return [s for batch in batches for s in batch]


def test_worker_info_and_worker_init_fn_per_thread():
    inits = []
    ds = WhoLoads()

    def init(worker_id):
        info = get_worker_info()
        inits.append((worker_id, info.id, threading.current_thread()))

    g = torch.Generator().manual_seed(5)
    loader = DataLoader(ds, batch_size=3, num_workers=3, worker_init_fn=init, generator=g,
                        collate_fn=list)
    samples = _samples(loader)
    base_seed = torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(5)).item()
    assert sorted(w for w, _, _ in inits) == [0, 1, 2] and all(w == i for w, i, _ in inits)
    thread_of = {t: w for w, _, t in inits}
    for wid, n, seed, same, method, thread in samples:
        assert thread_of[thread] == wid and n == 3 and seed == base_seed + wid
        assert same and method == "thread"
    assert get_worker_info() is None


def test_no_worker_info_nor_init_with_zero_workers():
    """torch loads in the main process then: get_worker_info() is None and
    worker_init_fn is never called."""
    inits = []
    loader = DataLoader(WhoLoads(), batch_size=4, worker_init_fn=inits.append, collate_fn=list)
    assert _samples(loader) == [None] * 12 and inits == []


def test_worker_rng_is_per_thread_and_seeded_with_the_workers_seed():
    """The process-wide generators are shared by threads: each thread gets its
    own, seeded with torch's per-worker seed."""
    draws = {}

    def init(worker_id):
        info = get_worker_info()
        rng = info.rng
        # Each made once, on first read (a new one per read would draw the same numbers again).
        assert rng.numpy_generator is rng.numpy_generator and rng.torch_generator is rng.torch_generator
        draws[worker_id] = (info.seed, torch.randint(0, 1 << 30, (3,), generator=rng.torch_generator),
                            rng.random_generator.random(), rng.numpy_generator.integers(1 << 30, size=3))

    list(DataLoader(list(range(4)), num_workers=2, worker_init_fn=init))
    assert sorted(draws) == [0, 1] and draws[0][0] + 1 == draws[1][0]
    base_seed = draws[0][0]
    for worker_id, (seed, t, r, n) in draws.items():
        assert torch.equal(t, torch.randint(0, 1 << 30, (3,), generator=torch.Generator().manual_seed(seed)))
        assert r == random.Random(seed).random()
        assert n.tolist() == np.random.default_rng([worker_id, base_seed]).integers(1 << 30, size=3).tolist()


class BothAnswers(Dataset):
    """Item i: torch's get_worker_info() and prefetch's worker_info() on the thread loading it."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return get_worker_info(), prefetch.worker_info()


class BothAnswersStream(IterableDataset):
    def __iter__(self):
        ours, own = get_worker_info(), prefetch.worker_info()
        for i in range(ours.id, 12, ours.num_workers):
            yield ours, own, get_worker_info(), prefetch.worker_info()


def _torchs_answer_is_prefetchs(ours, own):
    """torch's WorkerInfo of a drop-in thread is prefetch's own, in torch's
    words: the loader's seed is torch's base_seed, each worker's seed its own."""
    assert own is not None and ours is not None
    assert (ours.id, ours.num_workers, ours.seed) == (own.id, own.num_workers, own.seed + own.id)
    assert ours.worker_method == "thread"


def test_torchs_worker_info_in_a_thread_is_read_from_prefetchs():
    """SPEC §9: one worker query: torch's get_worker_info() in a drop-in thread
    answers what prefetch.worker_info() says there (a map-style thread's
    dataset is its own copy, which prefetch's query does not hold)."""
    ds = BothAnswers()
    g = torch.Generator().manual_seed(3)
    samples = [s for batch in DataLoader(ds, batch_size=3, num_workers=3, generator=g, collate_fn=list)
               for s in batch]
    assert {own.id for _, own in samples} <= {0, 1, 2}   # a thread may start after the others loaded all
    base_seed = torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(3)).item()
    for ours, own in samples:
        _torchs_answer_is_prefetchs(ours, own)
        assert own.seed == base_seed and own.dataset is None and ours.dataset is not ds
        assert type(ours.dataset) is BothAnswers
    copies = {own.id: ours.dataset for ours, own in samples}
    assert all(ours.dataset is copies[own.id] for ours, own in samples)
    assert len({id(copy) for copy in copies.values()}) == len(copies)   # a copy per thread


def test_torchs_worker_info_of_a_stream_is_prefetchs_with_its_dataset():
    """A stream's worker: torch's dataset is prefetch's worker_info().dataset
    (the copy that worker iterates), at its first read and at every sample."""
    ds = BothAnswersStream()
    rows = list(DataLoader(ds, batch_size=None, num_workers=2, collate_fn=lambda x: x))
    assert len(rows) == 12 and {own.id for _, own, _, _ in rows} == {0, 1}
    for first, first_own, ours, own in rows:
        for torchs, prefetchs in ((first, first_own), (ours, own)):
            _torchs_answer_is_prefetchs(torchs, prefetchs)
            assert torchs.dataset is prefetchs.dataset and type(torchs.dataset) is BothAnswersStream
            assert torchs.dataset is not ds


def test_torchs_worker_info_is_none_in_prefetchs_own_loader_threads():
    """Outside a drop-in, torch's answer is torch's own: a prefetch.Loader's
    thread is no torch worker, though prefetch's query answers there."""
    got = list(prefetch.Loader(BothAnswers(), batch_size=4, workers=2, collate=list))
    assert all(ours is None and own is not None for batch in got for ours, own in batch)


def test_persistent_workers_keep_threads_and_init_once():
    inits = []
    with DataLoader(WhoLoads(), batch_size=4, num_workers=2, persistent_workers=True,
                    worker_init_fn=inits.append, collate_fn=list) as loader:
        first = iter(loader)
        threads1 = {s[5] for s in _samples(first)}
        # Every loader thread alive after epoch 1 (one of the two may have loaded
        # nothing of a 12-sample epoch: they start one after the other).
        alive = {t for t in threading.enumerate() if t.name.startswith("torch-DataLoader-w")}
        assert threads1 <= alive and len(alive) == 2
        assert iter(loader) is first   # torch's persistent iterator, reset
        threads2 = {s[5] for s in _samples(loader)}
        assert threads2 <= alive and sorted(inits) == [0, 1]


# -- IterableDataset ---------------------------------------------------------------

@pytest.mark.parametrize("batch_size,drop_last", [(3, False), (3, True), (None, False)])
def test_iterable_dataset_sharded_like_torchs_workers(batch_size, drop_last):
    """Each worker iterates its own replica, batches formed per worker and
    interleaved round-robin, uneven shards included: torch's processes give
    the same batches in the same order."""
    ds = Counting(0, 17)
    kwargs = dict(batch_size=batch_size, drop_last=drop_last, num_workers=2)
    ours = list(DataLoader(ds, **kwargs))
    theirs = list(TorchLoader(ds, **kwargs))
    assert_all_same(ours, theirs)


def test_iterable_dataset_ignoring_worker_info_is_duplicated_as_in_torch():
    """Documented: every replica yields the whole data set, as with torch."""
    ds = Counting(0, 7, shard=False)
    ours = list(DataLoader(ds, batch_size=2, num_workers=2))
    theirs = list(TorchLoader(ds, batch_size=2, num_workers=2))
    assert_all_same(ours, theirs)
    assert sorted(_samples(t.tolist() for t in ours)) == sorted(list(range(7)) * 2)


def test_iterable_dataset_replicas_configured_by_worker_init_fn():
    """torch's documented pattern: worker_init_fn narrows get_worker_info().dataset,
    each worker's own copy."""
    def init(worker_id):
        info = get_worker_info()
        per = math.ceil((info.dataset.end - info.dataset.start) / info.num_workers)
        info.dataset.start += worker_id * per
        info.dataset.end = min(info.dataset.start + per, info.dataset.end)

    ds = Counting(0, 10, shard=False)
    batches = list(DataLoader(ds, batch_size=2, num_workers=2, worker_init_fn=init))
    assert sorted(_samples(b.tolist() for b in batches)) == list(range(10))
    assert (ds.start, ds.end) == (0, 10)   # the user's object is untouched


def test_iterable_dataset_zero_workers_and_length_warning():
    ds = Counting(0, 5)
    loader = DataLoader(ds, batch_size=2)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]
    loader = DataLoader(Counting(0, 6, shard=False), batch_size=1, num_workers=2)
    assert len(loader) == 6   # torch's estimate
    with pytest.warns(UserWarning, match=r"Length of IterableDataset .* was reported to be 6"):
        assert len(list(loader)) == 12


def test_iterable_dataset_persistent_replicas_restart_each_epoch():
    inits = []
    loader = DataLoader(Counting(0, 8), batch_size=3, num_workers=2, persistent_workers=True,
                        worker_init_fn=inits.append)
    for _ in range(2):
        assert sorted(_samples(b.tolist() for b in loader)) == list(range(8))
    assert sorted(inits) == [0, 1]
    loader.close()


# -- errors, timeout, pinning -----------------------------------------------------

class Raising(RaisingDataset, Dataset):
    pass


def test_dataset_error_is_the_original_with_its_frames_and_a_note():
    """Seed story: torch's worker process re-raises a new exception whose
    message carries the worker's traceback as text; ours raises the dataset's
    own exception, with its frames, and a note naming the sample."""
    with pytest.raises(KeyError) as theirs:
        list(TorchLoader(Raising(), batch_size=2, num_workers=2))
    assert "Caught KeyError in DataLoader worker process" in str(theirs.value)
    assert "__getitem__" not in [f.name for f in traceback.extract_tb(theirs.value.__traceback__)]
    free_the_frames(theirs)

    loader = DataLoader(Raising(), batch_size=2, num_workers=2)
    got = []
    with pytest.raises(KeyError) as ours:
        for batch in loader:
            got.append(batch.tolist())
    assert got == [[0, 1], [2, 3], [4, 5]]
    assert ours.value.args == ("no sample 6",)
    assert "__getitem__" in [f.name for f in traceback.extract_tb(ours.value.__traceback__)]
    assert any("sample 6" in note for note in ours.value.__notes__)


def test_collate_fn_and_worker_init_fn_errors_reach_the_consumer_with_a_note():
    def collate(samples):
        raise ZeroDivisionError("collate")

    with pytest.raises(ZeroDivisionError, match="collate") as exc:
        list(DataLoader(list(range(6)), batch_size=2, num_workers=2, collate_fn=collate))
    assert any("collate" in note for note in exc.value.__notes__)

    def init(worker_id):
        raise OSError(f"init {worker_id}")

    with pytest.raises(OSError, match="init") as exc:
        list(DataLoader(list(range(6)), batch_size=2, num_workers=2, worker_init_fn=init))
    assert any("worker_init" in note for note in exc.value.__notes__)


def test_timeout_raises_torchs_runtime_error():
    release = threading.Event()

    class Stuck(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i >= 2:
                release.wait(30)
            return i

    it = iter(DataLoader(Stuck(), batch_size=2, num_workers=2, timeout=0.2))
    try:
        assert next(it).tolist() == [0, 1]
        with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 0\.2 seconds$") as exc:
            next(it)
        assert isinstance(exc.value.__cause__, TimeoutError)
    finally:
        release.set()
    del it, exc
    gc.collect()


def test_pin_memory_without_accelerator_warns_as_torch_does():
    assert not torch.accelerator.is_available()   # this machine; pinned batches: gpu_check
    ds = TensorDataset(torch.arange(6.0))
    with pytest.warns(UserWarning, match="'pin_memory' argument is set as true but no accelerator"):
        batches = list(DataLoader(ds, batch_size=4, pin_memory=True, num_workers=2))
    assert [b[0].tolist() for b in batches] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]
    assert not batches[0][0].is_pinned()


class _FakePinning:
    """A stand-in accelerator for a machine without one: pin_memory() returns
    a copy marked with the thread that made it, and a marked tensor itself
    (as torch returns an already pinned tensor)."""

    def __init__(self, monkeypatch):
        self.threads = []
        monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
        monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("cpu"))
        fake = self

        def pin_memory(tensor, *args):
            if getattr(tensor, "pinned_on", None):
                return tensor
            out = tensor.clone()
            out.pinned_on = threading.current_thread().name
            fake.threads.append(out.pinned_on)
            return out
        monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)


class _Pair(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return np.full((2,), i, np.float32), {"label": i}


class _PairStream(torch.utils.data.IterableDataset):
    def __iter__(self):
        from prefetch.torch import get_worker_info
        info = get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        return (_Pair()[i] for i in range(w, 6, n))


@pytest.mark.parametrize("iterable", [False, True])
def test_pin_memory_pins_each_tensor_once_off_the_consumer_s_thread(monkeypatch, iterable):
    """With an accelerator, the batches (a map-style dataset's, an
    IterableDataset's) are pinned on the loader's publisher thread (torch
    pins on a thread of its own), every tensor of every batch, once; the
    consumer gets them pinned."""
    fake = _FakePinning(monkeypatch)
    data = _PairStream() if iterable else _Pair()
    with DataLoader(data, batch_size=2 if iterable else 4, pin_memory=True, num_workers=2) as loader:
        batches = list(loader)
    consumer = threading.current_thread().name
    leaves = [t for x, y in batches for t in (x, y["label"])]
    want = [[0, 2], [1, 3], [4], [5]] if iterable else [[0, 1, 2, 3], [4, 5]]
    assert [b[0][:, 0].tolist() for b in batches] == want
    assert all(getattr(t, "pinned_on", None) for t in leaves)
    assert len(fake.threads) == len(leaves) and consumer not in fake.threads


# -- datasets a process loader cannot take -----------------------------------------

class Unpicklable(UnpicklableDataset, Dataset):
    pass


def test_unpicklable_dataset_loads_here_and_fails_torchs_spawned_workers(tmp_path):
    path = tmp_path / "bytes"
    path.write_bytes(bytes(range(8)))
    ds = Unpicklable(path)
    try:
        assert [b.tolist() for b in DataLoader(ds, batch_size=4, num_workers=2)] == [[0, 1, 2, 3],
                                                                                    [4, 5, 6, 7]]
        with pytest.warns(UserWarning, match="Got pickle error"), \
                pytest.raises((TypeError, AttributeError), match="pickle"):
            list(TorchLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn"))
    finally:
        ds.file.close()


class Shared(SharedDataset, Dataset):
    pass


def test_multiprocessing_and_threading_primitives_work():
    ds = Shared()
    batches = list(DataLoader(ds, batch_size=3, num_workers=4))
    assert _samples(b.tolist() for b in batches) == list(range(20))
    assert ds.count.value == 20 and ds.most == 1


def test_threads_stop_when_an_iteration_is_abandoned():
    """The conftest fixture checks that no thread outlives the test."""
    it = iter(DataLoader(list(range(100)), batch_size=2, num_workers=3))
    assert next(it).tolist() == [0, 1]
    del it
    gc.collect()


def test_importing_prefetch_torch_exports():
    assert prefetch.torch.DataLoader is DataLoader and prefetch.torch.get_worker_info is get_worker_info


@pytest.mark.parametrize("num_workers", [0, 2])
def test_epoch_goes_on_after_a_batch_error_as_in_torch(num_workers):
    """torch's test_error(_workers): every batch raises, next() goes on to the
    next batch, and the iteration ends after len(loader) errors."""
    class AllFail(Dataset):
        def __len__(self):
            return 41

        def __getitem__(self, i):
            raise NotImplementedError(f"sample {i}")

    for cls in (TorchLoader, DataLoader):
        loader = cls(AllFail(), batch_size=2, shuffle=True, num_workers=num_workers)
        it, errors = iter(loader), 0
        while True:
            try:
                next(it)
            except NotImplementedError:
                errors += 1
            except StopIteration:
                break
        assert errors == 21, cls


def test_batches_after_an_error_are_torchs():
    ours, theirs = [], []
    for cls, got in ((TorchLoader, theirs), (DataLoader, ours)):
        it = iter(cls(Raising(), batch_size=3, **({"num_workers": 2} if cls is DataLoader else {})))
        while True:
            try:
                got.append(next(it).tolist())
            except KeyError:
                got.append("error")
            except StopIteration:
                break
    assert ours == theirs == [[0, 1, 2], [3, 4, 5], "error", [9]]


# -- close() during an epoch (issue 32) -------------------------------------------

@pytest.mark.timeout(30)
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("iterable", [False, True])
def test_close_during_an_epoch_stops_it_and_next_raises_closed(persistent, iterable):
    """§9 Drop-ins: close() stops a running epoch, persistent workers or not,
    and its next() then raises ClosedError, never a silent end. Before: with
    persistent workers the loop ended (StopIteration, as if the epoch were
    complete); without them close() did nothing to the running epoch."""
    from prefetch import ClosedError

    class Counted(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            return iter(range(info.id, 40, info.num_workers))

    ds = Counted() if iterable else TensorDataset(torch.arange(40))
    loader = DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=persistent)
    it = iter(loader)
    next(it)
    loader.close()
    with pytest.raises(ClosedError):
        next(it)
    with pytest.raises(ClosedError):
        next(it)   # and stays so
    with pytest.raises(ClosedError):
        iter(loader)   # a closed DataLoader starts no epoch


# -- stats() (issue 35 item 3) ------------------------------------------------------

@pytest.mark.parametrize("iterable", [False, True])
def test_stats_are_the_loaders_counters_of_the_epoch_begun_last(iterable):
    """The GIL warning points at stats().load_parallelism: the drop-in has
    stats(), a prefetch.Stats of the epoch begun last (zero before any)."""
    from prefetch import Stats

    class Counted(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            return iter(range(info.id, 12, info.num_workers))

    ds = Counted() if iterable else TensorDataset(torch.arange(12))
    loader = DataLoader(ds, batch_size=2, num_workers=2)
    assert loader.stats() == Stats()
    got = list(loader)
    stats = loader.stats()
    assert isinstance(stats, Stats)
    # An IterableDataset's workers hand over their ends too: more than the batches.
    assert (stats.consumed >= 6 if iterable else stats.consumed == 6) and len(got) == 6 and stats.workers == 2
    assert stats.samples >= (6 if iterable else 12) and stats.load_s > 0
    loader.close()



# -- a new user's mistakes at the constructor (as MISTAKES in tests/core/test_messages.py) --

class SizedAs(Sized, Dataset):
    """A map-style dataset whose ``__len__`` returns ``n`` as given; counts its loads."""


# (what the user wrote, the call on a SizedAs() dataset, exception, what the message must say)
MISTAKES = [
    ("DataLoader(generator)", lambda ds: DataLoader(a_generator()), TypeError,
     ["dataset must have __getitem__ and __len__", "(generator)", "torch.utils.data.IterableDataset"]),
    ("__len__ returns -1", lambda ds: DataLoader(SizedAs(-1)), ValueError,
     ["len(dataset) must be an int >= 0", "SizedAs.__len__ returned -1"]),
    ("__len__ returns 10.0", lambda ds: DataLoader(SizedAs(10.0)), TypeError,
     ["SizedAs.__len__ returned 10.0 (float)"]),
    ("DataLoader(ds, batch_size='4')", lambda ds: DataLoader(ds, batch_size="4"), ValueError,
     ["batch_size should be a positive integer value, but got batch_size='4'"]),
    ("DataLoader(ds, num_workers='2')", lambda ds: DataLoader(ds, num_workers="2"), TypeError,
     ["num_workers must be an int >= 0", "got '2' (str)"]),
    ("DataLoader(ds, loading='processes')", lambda ds: DataLoader(ds, loading="processes"), ValueError,
     ["loading='processes'", "needs num_workers >= 1, got num_workers=0"]),
]


@pytest.mark.parametrize("call, exc, says", [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_a_constructor_mistake_is_refused_there_naming_it_and_the_fix(call, exc, says):
    """At the constructor, not at iter() through the drop-in's frames; before
    a thread starts or a sample loads; the dataset stays usable."""
    assert_refused_and_usable(call, exc, says, SizedAs(), lambda ds: DataLoader(ds, batch_size=2, num_workers=2))


@pytest.mark.timeout(60)
def test_dropping_an_iterator_after_a_timeout_does_not_wait_for_dataset_and_warns_at_the_users_line():
    """torch's iterators have no close(): dropping one after its timeout
    waited out the 2 s grace on the dropping line, then warned at whatever
    line ran. The drop returns at once (no warning yet: the grace runs on a
    thread of its own); a thread still inside dataset[i] past it is warned
    about at the line that made the iterator."""
    inside, release = threading.Event(), threading.Event()

    class Stuck(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            inside.set()
            release.wait(30)
            return i

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            line = sys._getframe().f_lineno + 1
            it = iter(DataLoader(Stuck(), batch_size=2, timeout=0.2))
            with pytest.raises(RuntimeError, match="timed out"):
                next(it)
            assert inside.is_set()
            del it
            gc.collect()
            at_drop = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
            for t in [t for t in threading.enumerate() if t.name == "prefetch-close"]:
                t.join(30)   # the grace, spent on the closing thread
        finally:
            release.set()
    assert at_drop == []
    stuck = [w for w in caught if "still inside the dataset after 2.0 s" in str(w.message)]
    assert len(stuck) == 1, [str(w.message) for w in caught]
    assert (stuck[0].filename, stuck[0].lineno) == (__file__, line)
