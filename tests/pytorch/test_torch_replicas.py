"""Each worker of prefetch.torch.DataLoader loads from its own copy of a
map-style dataset, as each of torch's worker processes does (issue 23, the
hazard left at stop 30; SPEC §2: a batch's values are the dataset's): what
``dataset[i]`` or ``worker_init_fn`` sets on it (a file opened on first use,
a worker's offset) is that worker's alone, while the objects it refers to are
shared. Each case runs torch's own DataLoader(num_workers=2) (processes) on the
same dataset and expects what it gives."""
import copy
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import ConcatDataset, Dataset, Subset  # noqa: E402
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402

import prefetch.torch  # noqa: E402
from prefetch.torch import DataLoader  # noqa: E402
from support import LazyRecords  # noqa: E402


def _shut(loader):
    """Ends a loader's workers: ours close(); torch's persistent ones their queue threads too."""
    if isinstance(loader, DataLoader):
        loader.close()
    elif loader._iterator is not None:
        loader._iterator._shutdown_workers()


def _worker_id():
    info = prefetch.torch.get_worker_info()   # torch's own in torch's worker processes
    return info.id


class LazyFile(LazyRecords, Dataset):
    pass


@pytest.fixture
def records(tmp_path):
    return LazyRecords.write(tmp_path / "records.bin", 64)


def _checks(loader):
    """(every record right, every sample read through its own worker's handle)."""
    batches = list(loader)
    return (all(bool(right.all()) for right, _ in batches), all(bool(own.all()) for _, own in batches))


def test_a_file_opened_lazily_in_getitem_is_each_workers_own_as_in_torch(records):
    want = _checks(TorchLoader(LazyFile(records, 64), batch_size=4, num_workers=2))
    assert want == (True, True)
    # Keys 0-3 meet in pairs: both threads have read through the handle the
    # dataset holds; one dataset for both would hold one owner.
    meet = threading.Barrier(2, timeout=30)
    with DataLoader(LazyFile(records, 64, meet), batch_size=4, num_workers=2) as loader:
        assert _checks(loader) == want


@pytest.mark.parametrize("wrap", ["Subset", "ConcatDataset", "attribute"])
def test_a_dataset_inside_another_is_each_workers_own_too(records, wrap):
    """A Subset's dataset, a ConcatDataset's datasets, a wrapper's attribute."""
    class Wrapper(Dataset):
        def __init__(self, inner):
            self.parts = {"inner": inner}

        def __len__(self):
            return len(self.parts["inner"])

        def __getitem__(self, i):
            return self.parts["inner"][i]

    def make(meet=None):
        if wrap == "Subset":
            return Subset(LazyFile(records, 64, meet), list(range(64)))
        if wrap == "ConcatDataset":
            return ConcatDataset([LazyFile(records, 64, meet), LazyFile(records, 64)])
        return Wrapper(LazyFile(records, 64, meet))

    want = _checks(TorchLoader(make(), batch_size=4, num_workers=2))
    assert want == (True, True)
    with DataLoader(make(threading.Barrier(2, timeout=30)), batch_size=4, num_workers=2) as loader:
        assert _checks(loader) == want


class Offset(Dataset):
    """``worker_init_fn`` configures ``get_worker_info().dataset`` (torch's idiom)."""

    def __init__(self, meet=None):
        self.offset = 0
        self.meet = meet
        self.data = np.arange(16)   # referred to by each copy, not duplicated

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if self.meet is not None and i < 4:
            self.meet.wait()
        return torch.tensor([self.data[i] + self.offset, 1000 * _worker_id()])


def _set_offset(worker_id):
    info = prefetch.torch.get_worker_info()
    info.dataset.offset = 1000 * worker_id


def test_worker_init_fn_configures_its_own_workers_copy_as_in_torch():
    def offsets(cls, ds):
        rows = torch.cat(list(cls(ds, batch_size=2, num_workers=2, worker_init_fn=_set_offset)))
        return sorted((rows[:, 0] - rows[:, 1]).tolist()), bool((rows[:, 0] >= rows[:, 1]).all())

    theirs = Offset()
    want = offsets(TorchLoader, theirs)
    assert want == (list(range(16)), True)
    ours = Offset(threading.Barrier(2, timeout=30))
    assert offsets(DataLoader, ours) == want
    assert ours.offset == theirs.offset == 0   # the user's dataset is not the workers'


def test_each_worker_s_copy_refers_to_the_dataset_s_objects():
    """The copies are shallow: an array the dataset holds is the same array."""
    ds = Offset()
    seen = []

    def init(worker_id):
        mine = prefetch.torch.get_worker_info().dataset
        seen.append((mine is not ds, mine.data is ds.data))

    list(DataLoader(ds, batch_size=2, num_workers=2, worker_init_fn=init))
    assert seen == [(True, True), (True, True)]


class Scaled(Dataset):
    def __init__(self):
        self.scale = 1

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return i * self.scale


@pytest.mark.parametrize("persistent", [False, True])
def test_a_change_between_epochs_reaches_the_workers_as_in_torch(persistent):
    """Without persistent workers each epoch's workers copy the dataset as it
    is then; persistent ones keep the copy they made (torch's hold theirs)."""
    def epochs(cls):
        ds = Scaled()
        loader = cls(ds, batch_size=4, num_workers=2, persistent_workers=persistent)
        got = [torch.cat(list(loader)).tolist()]
        ds.scale = 10
        got.append(torch.cat(list(loader)).tolist())
        _shut(loader)
        return got

    assert epochs(DataLoader) == epochs(TorchLoader)


def test_num_workers_0_loads_from_the_dataset_itself_as_in_torch():
    class Counting(Dataset):
        def __init__(self):
            self.loads = 0

        def __len__(self):
            return 6

        def __getitem__(self, i):
            self.loads += 1
            return i

    theirs, ours = Counting(), Counting()
    list(TorchLoader(theirs, batch_size=2, num_workers=0))
    with DataLoader(ours, batch_size=2, num_workers=0) as loader:
        list(loader)
    assert ours.loads == theirs.loads == 6


class Delegating(Dataset):
    """A wrapper whose __getattr__ reads an attribute of its own: a bare copy
    (no fields yet) recurses, so it cannot be copied and is shared."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner[i] * 2


def test_a_dataset_that_cannot_be_copied_is_shared_and_loads_as_in_torch():
    with pytest.raises(RecursionError):
        copy.copy(Delegating(list(range(10))))
    want = [b.tolist() for b in TorchLoader(Delegating(list(range(10))), batch_size=3, num_workers=0)]
    with DataLoader(Delegating(list(range(10))), batch_size=3, num_workers=2) as loader:
        assert [b.tolist() for b in loader] == want


def test_a_dataset_whose_copy_is_itself_is_left_as_it_is():
    """A ``__copy__`` returning self says the dataset is shared: nothing in it is replaced."""
    class Own(Dataset):
        def __init__(self):
            self.parts = [Scaled()]

        def __copy__(self):
            return self

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return self.parts[0][i]

    ds = Own()
    part = ds.parts[0]
    with DataLoader(ds, batch_size=2, num_workers=2) as loader:
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    assert ds.parts[0] is part


def test_long_containers_are_searched_only_when_they_hold_datasets():
    """A Subset's long index list is kept as it is (not walked, not copied); a
    ConcatDataset of many datasets has each copied."""
    from prefetch._replica import replica
    from prefetch.torch._worker import DATASETS

    indices = list(range(100_000))
    sub = replica(Subset(Scaled(), indices), DATASETS)
    assert sub.indices is indices
    parts = [Scaled() for _ in range(300)]
    whole = ConcatDataset(parts)
    concat = replica(whole, DATASETS)
    assert len(concat.datasets) == 300
    assert not any(a is b for a, b in zip(concat.datasets, parts))
    assert concat.cumulative_sizes is whole.cumulative_sizes


# -- an IterableDataset: worker w is one thread, as worker process w is one process --------

class Rows(torch.utils.data.IterableDataset):
    """Worker w's share of an SQLite table, read through a connection opened
    in ``__iter__``: SQLite refuses a connection used by another thread than
    the one that opened it."""

    def __init__(self, path):
        self.path = path

    def __iter__(self):
        import sqlite3
        info = prefetch.torch.get_worker_info()
        conn = sqlite3.connect(self.path)
        try:
            rows = conn.execute("select i from t where i % ? = ? order by i", (info.num_workers, info.id))
            for (i,) in rows:
                yield i
        finally:
            conn.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_an_iterable_dataset_s_iterator_runs_on_one_thread_as_in_torch(tmp_path, persistent):
    """issue 23 deliverable 2: each worker's replica is iterated by one thread
    (its generator, and an SQLite connection it opened, are never used by
    another); the batches come in torch's order, epoch after epoch."""
    import sqlite3
    path = str(tmp_path / "rows.db")
    with sqlite3.connect(path) as conn:
        conn.execute("create table t(i int)")
        conn.executemany("insert into t values (?)", [(i,) for i in range(90)])
    conn.close()

    def epochs(cls):
        loader = cls(Rows(path), batch_size=4, num_workers=2, persistent_workers=persistent)
        got = [[b.tolist() for b in loader] for _epoch in range(3)]
        _shut(loader)
        return got

    theirs = epochs(TorchLoader)
    assert sorted(sum(theirs[0], [])) == list(range(90))
    assert epochs(DataLoader) == theirs


_mine = threading.local()


def _remember_worker(worker_id):
    _mine.worker = worker_id


class ThreadState(torch.utils.data.IterableDataset):
    """Yields, for each item, (the worker, the worker worker_init_fn set in
    this thread's thread-local state)."""

    def __iter__(self):
        info = prefetch.torch.get_worker_info()
        for _ in range(3):
            yield info.id, getattr(_mine, "worker", -1)


@pytest.mark.parametrize("persistent", [False, True])
def test_thread_state_worker_init_fn_sets_is_its_worker_s_in_every_epoch_as_in_torch(persistent):
    """What worker_init_fn sets for its thread (a thread-local, a device) holds
    for every batch that worker makes: with persistent workers, in every epoch."""
    def epochs(cls):
        loader = cls(ThreadState(), batch_size=None, num_workers=2, persistent_workers=persistent,
                     worker_init_fn=_remember_worker)
        got = [[tuple(int(v) for v in b) for b in loader] for _epoch in range(3)]
        _shut(loader)
        return got

    theirs = epochs(TorchLoader)
    assert all(w == mine for epoch in theirs for w, mine in epoch) and len(theirs[0]) == 6
    assert epochs(DataLoader) == theirs


class Endless(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10**9))


def test_a_worker_waiting_for_room_returns_when_its_loader_closes_by_itself():
    """A worker holding prefetch_factor batches not taken waits for room; when
    the loader closes without the DataLoader telling the workers (its own
    finalizer), the waiting threads still end (the fixture checks none is left)."""
    loader = DataLoader(Endless(), batch_size=2, num_workers=2, prefetch_factor=1, persistent_workers=True)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    before = set(threading.enumerate())
    it._source.close()   # as the loader's finalizer would, the epoch not ended first
    assert it._source.closed
    left = [t.name for t in before if t.is_alive() and t.name.startswith("torch-DataLoader")]
    assert not left
    loader.close()


class Uneven(torch.utils.data.IterableDataset):
    """Worker w yields 3 + 4 * w items (w * 100 + j): the workers end at different times."""

    def __iter__(self):
        info = prefetch.torch.get_worker_info()
        w = 0 if info is None else info.id
        return iter(range(w * 100, w * 100 + 3 + 4 * w))


@pytest.mark.parametrize("num_workers,batch_size,drop_last,prefetch_factor", [
    (1, 2, False, 2), (2, 2, False, 1), (3, None, False, 2), (3, 2, True, 3), (4, 3, False, 1)])
def test_uneven_workers_come_in_torch_s_order_epoch_after_epoch(num_workers, batch_size, drop_last,
                                                                prefetch_factor):
    """in_order: one batch of each worker still running in turn; a worker that
    has ended loses its turn; persistent workers give every epoch the same."""
    def epochs(cls):
        loader = cls(Uneven(), batch_size=batch_size, drop_last=drop_last, num_workers=num_workers,
                     prefetch_factor=prefetch_factor, persistent_workers=True)
        got = [[b.tolist() if isinstance(b, torch.Tensor) else b for b in loader] for _epoch in range(2)]
        _shut(loader)
        return got

    theirs = epochs(TorchLoader)
    assert epochs(DataLoader) == theirs
