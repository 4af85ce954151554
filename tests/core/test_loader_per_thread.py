"""The Loader's per-thread dataset hook (issue 23 deliverable 2, SPEC §9),
through the seam the drop-ins use (prefetch/_framework.py): a drop-in whose
threads cannot share the dataset gives each loader thread a dataset of its own, made once on that thread before worker_init; every sample
that thread loads comes from its copy, and the threads keep their copies
across epochs."""
import threading

import numpy as np
import pytest

from prefetch import Loader
from prefetch._framework import FrameworkLoader
from prefetch._types import ClosedError


class Positioned:
    """A reader with a position: seek then read, which threads cannot share."""

    def __init__(self, n):
        self.n = n
        self.owner = None   # the thread of a per-thread copy

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.owner is not None and self.owner is not threading.current_thread():
            raise AssertionError(f"sample {i} loaded from another thread's copy")
        return np.array([i, id(self)], np.int64)


def own_copies(dataset, batch_size, *, made, **kwargs):
    """A loader whose threads each load from a copy of their own, through the seam drop-ins use."""
    def per_thread(dataset, worker_id):
        copy = Positioned(dataset.n)
        copy.owner = threading.current_thread()
        made.append((worker_id, copy, list(inits)))
        return copy

    inits = []
    return FrameworkLoader(dataset, remedy="a process loader", per_thread=per_thread, batch_size=batch_size,
                           worker_init=inits.append, **kwargs)


@pytest.mark.parametrize("workers", [1, 3])
def test_each_thread_loads_from_its_own_copy_made_once_before_worker_init(workers):
    made = []
    shared = Positioned(40)
    with own_copies(shared, 4, workers=workers, made=made) as loader:
        for _ in range(3):
            rows = np.concatenate([b for b in loader])
            assert rows[:, 0].tolist() == list(range(40))
            copies = {id(c) for _, c, _ in made}
            assert set(rows[:, 1].tolist()) <= copies and id(shared) not in rows[:, 1]
    assert sorted(w for w, _, _ in made) == list(range(workers))   # once per thread, kept across epochs
    assert all(w not in inits for w, _, inits in made)              # before that thread's worker_init


def test_a_failing_per_thread_hook_is_the_epochs_error_and_the_loader_closes():
    def per_thread(dataset, worker_id):
        raise OSError("cannot open the reader")

    loader = FrameworkLoader(Positioned(8), remedy="a process loader", per_thread=per_thread, batch_size=4,
                             workers=2)
    with pytest.raises(OSError, match="cannot open the reader"):
        list(loader)
    loader.close()
    with pytest.raises(ClosedError):
        list(loader)


def test_without_the_hook_every_thread_shares_the_dataset():
    shared = Positioned(12)
    with Loader(shared, 4, workers=3) as loader:
        assert {int(r[1]) for b in loader for r in b} == {id(shared)}
