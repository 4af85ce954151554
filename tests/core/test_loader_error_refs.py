"""A Loader's error does not keep the consumer's frames alive (SPEC §5, §9,
issue 17): the stage, kept by the finalizer's registry, must not hold the
error once raised, or every object in its traceback's frames (the Loader's
owner included) is never collected and its threads never stop."""
import gc
import threading
import weakref

import pytest

import prefetch


class Owner:
    def __init__(self, **kwargs):
        self.loader = prefetch.Loader(list(range(10)), batch_size=2, workers=2, **kwargs)

    def run(self):
        for _ in self.loader:
            pass


def _fail(*args):
    raise KeyError("boom")


class Failing:
    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 6:
            raise KeyError(i)
        return i


@pytest.mark.parametrize("case", ["sample", "collate", "worker_init"])
def test_owner_of_a_failed_loader_is_collected(case):
    owner = Owner(**{"collate": dict(collate=_fail), "worker_init": dict(worker_init=_fail)}.get(case, {}))
    if case == "sample":
        owner.loader = prefetch.Loader(Failing(), batch_size=2, workers=2)
    with pytest.raises(KeyError):
        owner.run()
    ref = weakref.ref(owner)
    del owner
    gc.collect()
    assert ref() is None
    # The finalizer closed the loader: its threads end (a thread may still be
    # leaving its last frame when close() returns; join bounds that, not a leak).
    left = [t for t in threading.enumerate() if t.name.startswith("loader-")]
    for t in left:
        t.join(10)
    assert not [t.name for t in left if t.is_alive()]
