"""Wrapping torch.utils.data.DataLoader (SPEC §2, §4, §5, issue 12): values,
errors raised in the consumer with the note, close() stopping the loader's
workers; the conftest fixture checks no thread outlives a test, and each test
checks no worker process does."""
import gc
import multiprocessing
import warnings

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Dataset  # noqa: E402

from prefetch import ClosedError, Prefetcher  # noqa: E402
from support import free_the_frames  # noqa: E402

# On a machine without an accelerator, DataLoader warns that pin_memory does nothing.
pytestmark = pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning")

LOADERS = [(0, False), (0, True), (2, False), (2, True)]
IDS = [f"workers{w}-pin{p}" for w, p in LOADERS]


class Squares(Dataset):
    """Item i: a (4, 3) float tensor of i*i and the label i; raises at ``fail_at``."""

    def __init__(self, n, fail_at=None):
        self.n = n
        self.fail_at = fail_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.fail_at:
            raise KeyError(f"bad item {i}")
        return {"x": torch.full((4, 3), float(i * i)), "y": i}


def loader(dataset, workers, pin, batch_size=4):
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers, pin_memory=pin)


@pytest.fixture(autouse=True)
def no_worker_processes():
    yield
    # An exception kept by a test (pytest.raises) holds the loader iterator
    # through its traceback's frames, in a cycle with the test's frame.
    gc.collect()
    for child in multiprocessing.active_children():
        child.join(5)   # the loader's shutdown already joined them; this only bounds a failure
    assert not multiprocessing.active_children()


def check_batch(b, k, batch_size=4):
    ids = list(range(k * batch_size, (k + 1) * batch_size))
    assert b["y"].tolist() == ids
    assert type(b["x"]) is torch.Tensor and b["x"].shape == (batch_size, 4, 3)
    assert b["x"][:, 0, 0].tolist() == [float(i * i) for i in ids]


@pytest.mark.parametrize("workers, pin", LOADERS, ids=IDS)
def test_values_and_length(workers, pin):
    dl = loader(Squares(24), workers, pin)
    with Prefetcher(dl, depth=2) as p:
        assert len(p) == 6
        got = list(p)
    assert len(got) == 6
    for k, b in enumerate(got):
        check_batch(b, k)
    # Every kept batch has storage of its own (§3 rule 1, 3).
    assert len({b["x"].data_ptr() for b in got}) == 6


@pytest.mark.parametrize("workers, pin", LOADERS[:3], ids=IDS[:3])
def test_dataset_error_reaches_consumer_with_note(workers, pin):
    """§4: the batches before it, then the loader's exception with our note; then the end."""
    dl = loader(Squares(24, fail_at=9), workers, pin)   # item 9 is in batch 2
    with Prefetcher(dl, depth=2) as p:
        check_batch(next(p), 0)
        check_batch(next(p), 1)
        with pytest.raises(KeyError, match="bad item 9") as info:
            next(p)
        assert any("prefetch worker" in n and "while fetching batch 3 (counted from 1: the 2 before it" in n for n in info.value.__notes__)
        with pytest.raises(StopIteration):
            next(p)
        free_the_frames(info)


@pytest.mark.parametrize("workers, pin", LOADERS, ids=IDS)
def test_close_mid_stream_stops_the_loader(workers, pin):
    """§2, §5: close() part-way stops the fetch thread and, with it, the
    loader's workers and pin thread; batches held stay valid; next() raises."""
    dl = loader(Squares(400), workers, pin)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)   # close() must not need its grace-period warning
        p = Prefetcher(dl, depth=3)
        first = next(p)
        p.close()
    assert p.closed
    with pytest.raises(ClosedError):
        next(p)
    check_batch(first, 0)


@pytest.mark.parametrize("workers", [0, 2])
def test_dropping_the_prefetcher_stops_the_loader(workers):
    """§5: no close(): dropping the last reference releases thread and workers."""
    p = Prefetcher(loader(Squares(400), workers, False), depth=2)
    check_batch(next(p), 0)
    with pytest.warns(ResourceWarning, match="unclosed prefetcher"):
        del p   # the fixtures check threads and processes are gone


def test_device_cpu_with_loader():
    dl = loader(Squares(8), 2, False)
    with Prefetcher(dl, device=torch.device("cpu")) as p:
        got = list(p)
    for k, b in enumerate(got):
        check_batch(b, k)
