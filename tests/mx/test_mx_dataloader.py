"""prefetch.mx.DataLoader against mx.gluon.data.DataLoader (MXNet 1.9.1; issue 17
items 2 and 3, SPEC §9): Gluon's signature, checks, samplers and batches, on
threads; ImageRecordDataset read by several threads (Gluon's own
test_recordimage_dataset_with_data_loader_multiworker, which its thread_pool
fails); the seeds' stories beside Gluon's process loader."""
import gc
import inspect
import io
import multiprocessing
import sys
import threading
import traceback
import warnings

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    mx = pytest.importorskip("mxnet")

from mxnet import gluon  # noqa: E402

import prefetch.mx  # noqa: E402
from prefetch.mx import DataLoader  # noqa: E402
from support import (  # noqa: E402
    RaisingDataset,
    SharedDataset,
    UnpicklableDataset,
    assert_same,
)

GluonLoader = gluon.data.DataLoader


def epochs(loader, n=2):
    return [list(loader) for _ in range(n)]


def test_is_a_gluon_dataloader_with_its_signature():
    """Gluon's, and loading= (keyword only, after Gluon's: no positional call changes)."""
    assert issubclass(DataLoader, GluonLoader) and prefetch.mx.DataLoader is DataLoader
    ours, theirs = inspect.signature(DataLoader), inspect.signature(GluonLoader)
    assert [(p.name, p.default, p.kind) for p in ours.parameters.values()] == \
        [(p.name, p.default, p.kind) for p in theirs.parameters.values()] + \
        [("loading", "auto", inspect.Parameter.KEYWORD_ONLY)]


BAD_ARGUMENTS = [
    dict(batch_size=2, timeout=0), dict(batch_size=2, timeout=-1), dict(),
    dict(batch_size=2, shuffle=True, sampler=gluon.data.SequentialSampler(6)),
    dict(batch_size=2, batch_sampler=[[0]]), dict(shuffle=True, batch_sampler=[[0]]),
    dict(sampler=[0], batch_sampler=[[0]]), dict(last_batch="keep", batch_sampler=[[0]]),
]


# Gluon's __del__ reads _worker_pool, which its constructor had not set yet.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("kwargs", BAD_ARGUMENTS, ids=repr)
def test_bad_arguments_raise_what_gluon_raises(kwargs):
    with pytest.raises(Exception) as theirs:
        GluonLoader(list(range(6)), **kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        DataLoader(list(range(6)), **kwargs)
    assert str(ours.value) == str(theirs.value) and str(ours.value)


# A new user's mistakes that Gluon's constructor accepts and its iterator
# fails on obscurely (a ZeroDivisionError; "'>=' not supported between
# instances of 'str' and 'int'"): refused at the constructor, naming the
# argument and its value (as MISTAKES in tests/core/test_messages.py).
MISTAKES = [
    (dict(batch_size=0), ValueError, "batch_size must be an int >= 1, got 0"),
    (dict(batch_size="2"), TypeError, "batch_size must be an int >= 1, got '2' (str)"),
    (dict(batch_size=2.0), TypeError, "batch_size must be an int >= 1, got 2.0 (float)"),
    (dict(batch_size=2, num_workers="2"), TypeError, "num_workers must be an int >= 0"),
    (dict(batch_size=2, num_workers=1.5), TypeError, "got 1.5 (float)"),
]


@pytest.mark.parametrize("kwargs, exc, says", MISTAKES, ids=[repr(m[0]) for m in MISTAKES])
def test_a_mistake_gluon_accepts_is_refused_at_the_constructor(kwargs, exc, says):
    before = threading.active_count()
    with pytest.raises(exc) as info:
        DataLoader(list(range(6)), **kwargs)
    assert says in str(info.value) and "None" not in str(info.value), str(info.value)
    assert threading.active_count() == before


class Pairs(gluon.data.Dataset):
    """(NDArray, number) samples; numbers of a dtype per kind."""

    def __len__(self):
        return 11

    def __getitem__(self, i):
        return mx.nd.full((2, 3), i), i * 0.5


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("last_batch", [None, "keep", "discard", "rollover"])
def test_batches_equal_gluons(num_workers, last_batch):
    """Gluon's samplers and default_batchify_fn: tuples become lists, NDArrays
    are stacked, numbers become NDArrays; rollover carries the rest into the
    next epoch."""
    for ds in (Pairs(), gluon.data.ArrayDataset(np.arange(22.0).reshape(11, 2), np.arange(11)),
               gluon.data.SimpleDataset(list(range(11)))):
        ours = epochs(DataLoader(ds, batch_size=4, last_batch=last_batch, num_workers=num_workers), 3)
        theirs = epochs(GluonLoader(ds, batch_size=4, last_batch=last_batch), 3)
        assert_same(ours, theirs)


def test_batch_sampler_batchify_fn_and_len():
    ds = gluon.data.SimpleDataset(list(range(10)))
    batches = gluon.data.BatchSampler(gluon.data.SequentialSampler(10), 3, "discard")
    loader = DataLoader(ds, batch_sampler=batches, batchify_fn=list, num_workers=2)
    assert len(loader) == 3 and list(loader) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_bad_last_batch_raises_gluons_error_at_the_end():
    ds = gluon.data.SimpleDataset(list(range(5)))
    for cls in (GluonLoader, DataLoader):
        got = []
        with pytest.raises(ValueError, match="last_batch must be one of 'keep', 'discard', or 'rollover'"):
            for batch in cls(ds, batch_size=2, last_batch="bad", batchify_fn=list):
                got.append(batch)
        assert got == [[0, 1], [2, 3]]


def test_shuffle_draws_from_numpys_global_generator_like_gluon():
    ds = gluon.data.SimpleDataset(list(range(20)))
    np.random.seed(4)
    theirs = list(GluonLoader(ds, batch_size=5, shuffle=True, batchify_fn=list))
    np.random.seed(4)
    assert list(DataLoader(ds, batch_size=5, shuffle=True, batchify_fn=list, num_workers=2)) == theirs


def test_pin_memory_delivers_on_cpu_pinned():
    ds = gluon.data.ArrayDataset(np.arange(12.0).reshape(6, 2), np.arange(6))
    ours = list(DataLoader(ds, batch_size=4, pin_memory=True, pin_device_id=0, num_workers=2))
    theirs = list(GluonLoader(ds, batch_size=4, pin_memory=True))
    assert all(a.context == mx.cpu_pinned(0) for batch in ours for a in batch)
    assert_same(ours, theirs)


def test_numpy_semantics_of_the_building_thread_are_the_workers():
    ds = gluon.data.SimpleDataset([mx.nd.full((2,), i) for i in range(4)])
    with mx.util.np_shape(True), mx.util.np_array(True):
        ds = gluon.data.SimpleDataset([mx.np.full((2,), i) for i in range(4)])
        ours = list(DataLoader(ds, batch_size=2, num_workers=2))
        theirs = list(GluonLoader(ds, batch_size=2))
    assert type(ours[0]) is type(theirs[0]) is mx.np.ndarray
    assert [b.asnumpy().tolist() for b in ours] == [b.asnumpy().tolist() for b in theirs]


def test_auto_reload_starts_the_next_epoch_and_close_stops_threads():
    ds = gluon.data.SimpleDataset(list(range(6)))
    with DataLoader(ds, batch_size=4, batchify_fn=list, num_workers=2, auto_reload=True) as loader:
        assert loader._iter is not None   # loading began at construction, as Gluon's
        assert list(loader) == [[0, 1, 2, 3], [4, 5]]
        assert loader._iter is not None   # and again after the epoch
        assert list(loader) == [[0, 1, 2, 3], [4, 5]]
    assert loader._loaders and all(each.closed for each in loader._loaders)


def test_timeout_raises_multiprocessings_timeout_error():
    release = threading.Event()

    class Stuck(gluon.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i >= 2:
                release.wait(30)
            return i

    loader = DataLoader(Stuck(), batch_size=2, batchify_fn=list, num_workers=2, timeout=0.2)
    it = iter(loader)
    try:
        assert next(it) == [0, 1]
        with pytest.raises(multiprocessing.TimeoutError, match="Worker timed out after 0.2 seconds") as exc:
            next(it)
        assert isinstance(exc.value.__cause__, TimeoutError)
    finally:
        release.set()
        loader.close()


# -- RecordIO read by several threads ------------------------------------------------

def _make_record(tmp_path, n=24):
    from PIL import Image

    rec, idx = str(tmp_path / "test.rec"), str(tmp_path / "test.idx")
    writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
    rng = np.random.default_rng(0)
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (20 + i, 16 + i, 3), dtype=np.uint8)).save(buf, format="JPEG")
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, float(i), i, 0), buf.getvalue()))
    writer.close()
    return rec


@pytest.mark.parametrize("num_workers", [2, 5])
def test_recordimage_dataset_with_several_threads(tmp_path, num_workers):
    """Gluon's test_recordimage_dataset_with_data_loader_multiworker on threads:
    every label and shape right, every epoch (a shared reader's seek-then-read
    interleaves across threads; each thread reads through its own)."""
    dataset = gluon.data.vision.ImageRecordDataset(_make_record(tmp_path))
    loader = DataLoader(dataset, 1, num_workers=num_workers)
    for _ in range(3):
        n = 0
        for i, (x, y) in enumerate(loader):
            assert x.shape == (1, 20 + i, 16 + i, 3) and y.asscalar() == i
            n += 1
        assert n == 24
    wrapped = dataset.transform_first(lambda x: x.astype("float32") / 255)
    for i, (x, y) in enumerate(DataLoader(wrapped, 1, num_workers=num_workers)):
        assert x.shape == (1, 20 + i, 16 + i, 3) and x.dtype == np.float32 and y.asscalar() == i
    assert dataset._record.read_idx(3)   # the user's own reader is untouched and still reads


class PlainDataset:
    """A user's own dataset class (not Gluon's): its attributes stay in the instance."""

    def __init__(self):
        self.rows, self.scale = list(range(8)), 2

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return np.float32(self.rows[i] * self.scale)


def _has_own_dict(obj):
    """Whether ``obj``'s attributes have been moved into a dict of its own
    (CPython 3.11+ keeps them in the instance until ``obj.__dict__`` is read;
    gc sees that dict once it exists). Always so before 3.11."""
    return any(type(r) is dict for r in gc.get_referents(obj))


def test_looking_for_readers_leaves_the_datasets_attributes_in_place():
    """The search for RecordIO readers in a dataset does not read its
    ``__dict__``: on CPython 3.11 that moves the attributes into a dict, and
    dataset[i]'s attribute reads were 12-19 % slower after it, in the
    loader's threads and in worker processes forked later (SPEC §9)."""
    dataset = PlainDataset()
    before = _has_own_dict(dataset)
    loader = DataLoader(dataset, batch_size=4, num_workers=2)
    assert [b.asnumpy().tolist() for b in loader] == [[0, 2, 4, 6], [8, 10, 12, 14]]
    loader.close()
    assert _has_own_dict(dataset) == before
    assert before == (sys.version_info < (3, 11))


# -- the seeds' stories ------------------------------------------------------------

class Raising(RaisingDataset, gluon.data.Dataset):
    pass


def test_dataset_error_is_the_original_with_its_frames_and_a_note():
    """Gluon's process loader raises a copy chained to a RemoteTraceback (the
    dataset's frames as text); ours raises the dataset's own exception."""
    theirs = GluonLoader(Raising(), batch_size=2, batchify_fn=list, num_workers=2)
    with pytest.raises(KeyError) as exc:
        list(theirs)
    assert type(exc.value.__cause__).__name__ == "RemoteTraceback"
    assert "__getitem__" not in [f.name for f in traceback.extract_tb(exc.value.__traceback__)]
    del theirs, exc

    got = []
    with pytest.raises(KeyError) as exc:
        for batch in DataLoader(Raising(), batch_size=2, batchify_fn=list, num_workers=2):
            got.append(batch)
    assert got == [[0, 1], [2, 3], [4, 5]] and exc.value.args == ("no sample 6",)
    assert "__getitem__" in [f.name for f in traceback.extract_tb(exc.value.__traceback__)]
    assert any("sample 6" in note for note in exc.value.__notes__)


class Unpicklable(UnpicklableDataset, gluon.data.Dataset):
    pass


def test_unpicklable_dataset_loads(tmp_path):
    path = tmp_path / "bytes"
    path.write_bytes(bytes(range(8)))
    ds = Unpicklable(path)
    try:
        batches = list(DataLoader(ds, batch_size=4, num_workers=2))
        assert [b.asnumpy().tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    finally:
        ds.file.close()


class Shared(SharedDataset, gluon.data.Dataset):
    pass


def test_multiprocessing_and_threading_primitives_work():
    ds = Shared()
    batches = list(DataLoader(ds, batch_size=3, batchify_fn=list, num_workers=4))
    assert [s for b in batches for s in b] == list(range(20))
    assert ds.count.value == 20 and ds.most == 1


@pytest.mark.parametrize("samples", [
    [np.full((2, 3), i, np.float32) for i in range(10)],
    [(np.full((2,), i, np.float16), i, float(i) / 3) for i in range(10)],
    [((np.arange(3) + i, i), np.int8(i)) for i in range(10)],   # int8: no DLPack wrap, Gluon's way
    [[i, i + 1] for i in range(10)],
    [mx.nd.array([i, i]) for i in range(10)],
    [(np.bool_(i % 2), np.uint8(i)) for i in range(10)],
], ids=["arrays", "tuples", "nested-int8", "lists", "ndarrays", "bool-uint8"])
def test_the_default_batchify_gives_gluons_batches(samples):
    """The drop-in stacks numeric samples with numpy and wraps them as NDArrays
    without a copy (one copy per batch fewer than Gluon's batchify in a thread,
    then the Loader's): the batches are Gluon's, types, dtypes and values."""
    ours = list(DataLoader(samples, batch_size=4, num_workers=2))
    theirs = list(mx.gluon.data.DataLoader(samples, batch_size=4))
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs):
        assert_same(a, b)


def test_stats_are_the_loaders_counters_of_the_pass_begun_last():
    """Issue 35 item 3: the GIL warning points at stats().load_parallelism: the
    Gluon drop-in has stats(), a prefetch.Stats of the pass begun last."""
    from prefetch import Stats

    loader = DataLoader(gluon.data.ArrayDataset(np.arange(12, dtype=np.float32)), batch_size=3,
                        num_workers=2)
    assert loader.stats() == Stats()
    assert len(list(loader)) == 4
    stats = loader.stats()
    assert stats.consumed == 4 and stats.samples == 12 and stats.workers == 2
    loader.close()

