"""The map stage's error policy for framework loaders (issue 23 deliverable 2):
with it, a batch whose sample or collate raised is that batch's error, and
the epoch goes on with the next batch; the sampler's and a thread's start-up
errors still end the epoch. Without it (the default, SPEC §4, §9) the epoch
ends with the error."""
import numpy as np
import pytest

import prefetch
from prefetch._framework import FrameworkLoader
from support import outcomes


class FailsAt:
    """range(n), raising KeyError at the indices in ``bad``."""

    def __init__(self, n, bad):
        self.n, self.bad = n, set(bad)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise KeyError(f"no sample {i}")
        return i


def going_on(dataset, lookahead=0, **kwargs):
    """A loader with a drop-in's continue policy, through the seam drop-ins use."""
    return FrameworkLoader(dataset, remedy="a process loader", go_on=True, lookahead=lookahead, **kwargs)


def test_without_the_policy_the_epoch_ends_with_the_error():
    with prefetch.Loader(FailsAt(10, [2]), batch_size=2, workers=2) as loader:
        assert outcomes(loader) == [[0, 1], "KeyError"]


@pytest.mark.parametrize("lookahead", [0, 1, 2])
@pytest.mark.parametrize("workers", [1, 3])
def test_in_order_each_failed_batch_is_its_error_and_the_epoch_goes_on(workers, lookahead):
    """lookahead=1: a failed batch counts as taken, or the next one never opens."""
    with going_on(FailsAt(11, [2, 7]), batch_size=2, workers=workers, lookahead=lookahead) as loader:
        expected = [[0, 1], "KeyError", [4, 5], "KeyError", [8, 9], [10]]
        assert outcomes(loader) == expected
        assert outcomes(loader) == expected   # the next epoch too


@pytest.mark.parametrize("lookahead", [0, 1])
def test_out_of_order_every_other_batch_comes_once(lookahead):
    loader = going_on(FailsAt(11, [2, 7]), batch_size=2, workers=3, ordered=False, lookahead=lookahead)
    with loader:
        got = outcomes(loader)
    assert got.count("KeyError") == 2
    assert sorted(b for b in got if b != "KeyError") == [[0, 1], [4, 5], [8, 9], [10]]


def collate(samples):
    if 4 in samples:
        raise ValueError("cannot collate")
    return np.array(samples)


def test_a_collate_error_is_its_batch_s():
    with going_on(list(range(8)), batch_size=2, workers=2, collate=collate) as loader:
        assert outcomes(loader) == [[0, 1], [2, 3], "ValueError", [6, 7]]


def test_the_sampler_s_error_still_ends_the_epoch():
    def sampler():
        yield from range(4)
        raise RuntimeError("sampler broke")

    class Sampler:
        def __iter__(self):
            return sampler()

    with going_on(list(range(8)), batch_size=2, sampler=Sampler(), workers=2) as loader:
        assert outcomes(loader) == [[0, 1], [2, 3], "RuntimeError"]


def test_a_failed_worker_init_still_ends_the_epoch():
    def init(worker_id):
        raise OSError("no device")

    with going_on(list(range(8)), batch_size=2, workers=2, worker_init=init) as loader:
        assert outcomes(loader) == ["OSError"]
