"""prefetch.mx.DataLoader behaves as Gluon's loader where a user meets it
(issue 23 items 11 and 12, SPEC §9): each iteration of the loader is a pass of
its own, as Gluon's (num_workers 0 and > 0 alike); a RecordIO reader anywhere
inside the dataset (a list, a tuple, a dict, a plain wrapper object) is read
by each loader thread through its own, so every record is right, as Gluon's
process loader reads them."""
import threading
import warnings

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    mx = pytest.importorskip("mxnet")

from mxnet import gluon  # noqa: E402

from prefetch.mx import DataLoader  # noqa: E402
from support import LazyRecords  # noqa: E402

GluonLoader = gluon.data.DataLoader
DATA = gluon.data.SimpleDataset(list(range(6)))


# -- item 11: each iteration is a pass of its own ----------------------------------

pytestmark = pytest.mark.full  # the long tier (tests/run.sh --full)


@pytest.fixture
def gluon_loader():
    """Gluon's loader; its thread pool gives its process pool's passes (one
    _MultiWorkerIter each) and is stopped after the test."""
    made = []

    def make(num_workers, **kwargs):
        made.append(GluonLoader(DATA, 2, batchify_fn=list, num_workers=num_workers,
                                thread_pool=num_workers > 0, **kwargs))
        return made[-1]

    yield make
    for loader in made:
        if loader._worker_pool is not None:
            loader._worker_pool.terminate()
            loader._worker_pool.join()


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("auto_reload", [False, True])
def test_zip_of_the_loader_with_itself_pairs_each_batch_with_itself(gluon_loader, num_workers, auto_reload):
    theirs = gluon_loader(num_workers, auto_reload=auto_reload)
    with DataLoader(DATA, 2, batchify_fn=list, num_workers=num_workers, auto_reload=auto_reload) as ours:
        assert list(zip(ours, ours)) == list(zip(theirs, theirs)) == [([0, 1], [0, 1]), ([2, 3], [2, 3]),
                                                                      ([4, 5], [4, 5])]
        assert list(ours) == list(theirs) == [[0, 1], [2, 3], [4, 5]]   # and a pass after them


@pytest.mark.parametrize("num_workers", [0, 2])
def test_interleaved_passes_are_independent_as_gluons(gluon_loader, num_workers):
    def story(loader):
        first = iter(loader)
        got = [next(first)]
        second = iter(loader)
        got += [next(second), next(first), list(second), list(first)]
        return got

    with DataLoader(DATA, 2, batchify_fn=list, num_workers=num_workers) as ours:
        assert story(ours) == story(gluon_loader(num_workers)) == [
            [0, 1], [0, 1], [2, 3], [[2, 3], [4, 5]], [[4, 5]]]


def test_a_pass_left_by_break_frees_its_threads_for_the_next():
    """A `for` left by `break` drops its pass: the next one reuses its threads
    (no loader piles up), and it starts from the first batch as Gluon's does."""
    with DataLoader(DATA, 2, batchify_fn=list, num_workers=2) as ours:
        for _ in range(5):
            for batch in ours:
                assert batch == [0, 1]
                break
        assert list(ours) == [[0, 1], [2, 3], [4, 5]]
        assert len(ours._loaders) == 1


# -- item 12: a RecordIO reader anywhere in the dataset --------------------------------

N_RECORDS = 240


def _write_records(tmp_path):
    rec, idx = str(tmp_path / "data.rec"), str(tmp_path / "data.idx")
    writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
    for i in range(N_RECORDS):
        # Records of different lengths: a read that interleaves with another thread's seek is wrong.
        writer.write_idx(i, b"%d:" % i + bytes([i % 251]) * (50 + 7 * (i % 13)))
    writer.close()
    return rec, idx


class Wrapper:
    """A user's own wrapper (no Gluon Dataset), holding the reader in an attribute."""

    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner[i]


class Raw:
    """A user's dataset over an MXIndexedRecordIO of its own, inside a dict."""

    def __init__(self, idx, rec):
        self.files = {"records": mx.recordio.MXIndexedRecordIO(idx, rec, "r")}

    def __len__(self):
        return N_RECORDS

    def __getitem__(self, i):
        return self.files["records"].read_idx(i)


class Parts(gluon.data.Dataset):
    """A Gluon dataset holding its parts in a tuple."""

    def __init__(self, *parts):
        self.parts = parts

    def __len__(self):
        return len(self.parts[0])

    def __getitem__(self, i):
        return tuple(part[i] for part in self.parts)


def _datasets(rec, idx):
    labels = np.arange(N_RECORDS, dtype=np.float32)
    records = gluon.data.RecordFileDataset
    return {
        "ArrayDataset (a list)": gluon.data.ArrayDataset(records(rec), labels),
        "tuple": Parts(records(rec), labels).transform(lambda r, y: (r[:4], y)),
        "dict": Raw(idx, rec),
        "plain wrapper": Wrapper(Wrapper(records(rec))),
    }


@pytest.mark.parametrize("kind", ["ArrayDataset (a list)", "tuple", "dict", "plain wrapper"])
def test_every_record_is_right_with_a_reader_inside_any_container(tmp_path, kind):
    """Gluon's own loader (one process: the answer of its worker processes,
    each with its own reader) gives the reference."""
    rec, idx = _write_records(tmp_path)
    dataset = _datasets(rec, idx)[kind]
    theirs = list(GluonLoader(dataset, 8, batchify_fn=list))
    assert len(theirs) == N_RECORDS // 8
    with DataLoader(dataset, 8, batchify_fn=list, num_workers=4) as ours:
        for _ in range(2):
            assert list(ours) == theirs


class Tracked(mx.recordio.MXIndexedRecordIO):
    """A reader that notes which threads read through it."""

    readers = {}

    def read_idx(self, idx):
        Tracked.readers.setdefault(id(self), set()).add(threading.get_ident())
        return super().read_idx(idx)


class Gathered(Raw):
    """Raw whose first four samples wait for each other: four threads read at once."""

    def __init__(self, idx, rec):
        self.files = {"records": Tracked(idx, rec, "r")}
        self.together = threading.Barrier(4)

    def __getitem__(self, i):
        if i < 4:
            self.together.wait(20)
        return super().__getitem__(i)


def test_each_thread_reads_through_a_reader_of_its_own(tmp_path):
    rec, idx = _write_records(tmp_path)
    dataset = Gathered(idx, rec)
    Tracked.readers.clear()
    with DataLoader(dataset, 8, batchify_fn=list, num_workers=4) as ours:
        batches = list(ours)
    assert [r for b in batches for r in b] == [Raw(idx, rec)[i] for i in range(N_RECORDS)]
    assert len(Tracked.readers) == 4 and all(len(t) == 1 for t in Tracked.readers.values())
    assert id(dataset.files["records"]) not in Tracked.readers   # the user's own is untouched


# -- a dataset that opens its file on first use: each thread's own, as each worker process's --

class LazyFile(LazyRecords, gluon.data.Dataset):
    pass


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_file_opened_on_first_use_is_each_thread_s_own_as_in_gluon_s_processes(tmp_path, wrapped):
    """Gluon's worker processes each hold a copy of the dataset; the drop-in's
    threads each hold a shallow one (and of each Gluon dataset inside it)."""
    path = LazyRecords.write(tmp_path / "records.bin", 48)

    def make(meet=None):
        lazy = LazyFile(path, 48, meet)
        return gluon.data.ArrayDataset(lazy, np.arange(48)) if wrapped else lazy

    def checks(loader):
        rows = [row[0] if wrapped else row for batch in loader for row in batch]   # ArrayDataset: (sample, label)
        return all(r[0] for r in rows), all(r[1] for r in rows), len(rows)

    theirs = GluonLoader(make(), 4, batchify_fn=list, num_workers=2)
    try:
        want = checks(theirs)
    finally:
        theirs._worker_pool.terminate()
    assert want == (True, True, 48)
    with DataLoader(make(threading.Barrier(2, timeout=30)), 4, batchify_fn=list, num_workers=2) as ours:
        assert checks(ours) == want


def test_num_workers_0_loads_from_the_dataset_itself_as_gluon(tmp_path):
    """Gluon's num_workers=0 loads in the main process from the dataset itself."""
    path = LazyRecords.write(tmp_path / "records.bin", 8)
    theirs, ours = LazyFile(path, 8), LazyFile(path, 8)
    list(GluonLoader(theirs, 4, batchify_fn=list))
    with DataLoader(ours, 4, batchify_fn=list) as loader:
        list(loader)
    assert theirs.f is not None and ours.f is not None
