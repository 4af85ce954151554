"""prefetch.torch.DataLoader with persistent workers loads the next epoch's
first batches while this one's last are consumed, where torch's own sampler
gives an order known ahead (issue 23: the drop-in within 5 % of the Loader,
whose gap was the epoch boundary; SPEC §9 epochs). Each test checks the
batches against torch's own DataLoader on the same input: what is loaded
early must be what torch's sampler gives, and is dropped when anything the
order depends on changed in between."""
import threading

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler  # noqa: E402
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402

from prefetch import ClosedError  # noqa: E402
from prefetch.torch import DataLoader  # noqa: E402
from prefetch.torch._sampler import _plan  # noqa: E402


class Recorded:
    """range(n) whose loads are counted, so a test can wait for a load."""

    def __init__(self, n):
        self.n = n
        self.calls = 0
        self.loaded = threading.Condition()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.loaded:
            self.calls += 1
            self.loaded.notify_all()
        return i

    def wait_for_calls(self, count, timeout=20):
        with self.loaded:
            return self.loaded.wait_for(lambda: self.calls >= count, timeout)


def _value(batch):
    return batch.tolist() if isinstance(batch, torch.Tensor) else batch


def torch_epochs(epochs, between=lambda loader, epoch: None, **kw):
    """torch's own batches, workers in processes as the drop-in's reference."""
    loader = TorchLoader(num_workers=2, persistent_workers=True, multiprocessing_context="fork",
                         timeout=30, **kw)
    got = []
    for epoch in range(epochs):
        got.append([_value(b) for b in loader])
        between(loader, epoch)
    loader._iterator._shutdown_workers()
    return got


@pytest.mark.parametrize("shuffle", [False, True])
def test_the_next_epochs_first_batches_load_before_it_is_asked_for(shuffle):
    """After the second epoch (the first one plans nothing ahead: a loader
    iterated once loads nothing for an epoch not asked for), the threads load
    the third epoch's first batches with no iter() called; that epoch is
    still torch's."""
    n = 24
    ds = Recorded(n)
    kw = dict(batch_size=4, shuffle=shuffle)
    theirs = torch_epochs(3, dataset=list(range(n)), generator=torch.Generator().manual_seed(3), **kw)
    with DataLoader(ds, num_workers=2, persistent_workers=True, generator=torch.Generator().manual_seed(3),
                    **kw) as loader:
        ours = [[_value(b) for b in loader] for _epoch in range(2)]
        assert ds.wait_for_calls(2 * n + 1), "nothing of the next epoch loaded before iter()"
        ours.append([_value(b) for b in loader])
    assert ours == theirs


def _sampler(kind, g):
    if kind == "replacement":
        return RandomSampler(range(20), replacement=True, num_samples=37, generator=g)
    return RandomSampler(range(20), num_samples=27, generator=g)


@pytest.mark.parametrize("case", ["sequential", "shuffle", "drop_last", "batch_size=None", "replacement",
                                  "num_samples"])
@pytest.mark.parametrize("touch", [False, True])
def test_epochs_loaded_early_are_torchs_epochs(case, touch):
    """torch's own samplers, planned ahead, over five epochs; with ``touch``
    the user draws from the generator between epochs (the epoch loaded early
    is then not the one torch gives, and is dropped)."""

    def kwargs():
        g = torch.Generator().manual_seed(7)
        kw = dict(dataset=list(range(20)), batch_size=3, generator=g)
        if case == "shuffle":
            kw["shuffle"] = True
        elif case == "drop_last":
            kw.update(shuffle=True, drop_last=True)
        elif case == "batch_size=None":
            kw.update(shuffle=True, batch_size=None)
        elif case in ("replacement", "num_samples"):
            kw["sampler"] = _sampler(case, g)
        return kw

    def between(loader, epoch):
        if touch:
            torch.empty(()).random_(generator=loader.generator)

    theirs = torch_epochs(5, between, **kwargs())
    kw = kwargs()
    ours = []
    with DataLoader(num_workers=2, persistent_workers=True, **kw) as loader:
        for epoch in range(5):
            ours.append([_value(b) for b in loader])
            between(loader, epoch)
    assert ours == theirs


@pytest.mark.parametrize("case", ["sequential", "shuffle", "drop_last", "batch_size=None", "replacement",
                                  "num_samples"])
def test_the_plan_made_ahead_is_the_one_the_epoch_reads(case):
    """The next epoch's plan, made as an epoch begins, is the one read as
    that epoch begins (nothing drawn in between): the batches loaded early
    are used, not loaded again."""
    g = torch.Generator().manual_seed(7)
    kw = dict(batch_size=3)
    if case in ("shuffle", "drop_last", "batch_size=None"):
        kw.update(shuffle=True, drop_last=case == "drop_last", batch_size=None if case == "batch_size=None" else 3)
    elif case in ("replacement", "num_samples"):
        kw["sampler"] = _sampler(case, g)
    with DataLoader(list(range(20)), num_workers=2, persistent_workers=True, generator=g, **kw) as loader:
        planned = None
        for _epoch in range(4):
            it = iter(loader)
            batches = it._batches
            assert batches.plan is not None and batches.plan == planned or planned is None
            planned = batches.order(batches.plan.epoch + 1).plan   # the next epoch opened early (_Early)
            for _batch in it:
                pass


@pytest.mark.parametrize("shuffle", [False, True])
def test_out_of_order_epochs_loaded_early_give_every_batch_once(shuffle):
    """in_order=False: each epoch, the early batches among them, gives torch's
    batches once each, in any order."""
    kw = dict(batch_size=3, shuffle=shuffle, in_order=False)
    theirs = torch_epochs(4, dataset=list(range(20)), generator=torch.Generator().manual_seed(2), **kw)
    with DataLoader(list(range(20)), num_workers=2, persistent_workers=True,
                    generator=torch.Generator().manual_seed(2), **kw) as loader:
        ours = [[_value(b) for b in loader] for _epoch in range(4)]
    assert [sorted(e) for e in ours] == [sorted(e) for e in theirs]


def test_a_dataset_that_changed_length_between_epochs_gives_its_new_order():
    """SequentialSampler reads len(dataset) as each epoch begins: the epoch
    loaded early for the old length is dropped."""
    data = list(range(12))
    with DataLoader(data, batch_size=4, num_workers=2, persistent_workers=True) as loader:
        first = [[_value(b) for b in loader] for _epoch in range(2)]
        del data[8:]
        after = [_value(b) for b in loader]
    assert first == [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]] * 2
    assert after == [[0, 1, 2, 3], [4, 5, 6, 7]]


class OwnSampler(torch.utils.data.Sampler):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(range(self.n))


class SequentialSubclass(SequentialSampler):
    pass


@pytest.mark.parametrize("sampler", [
    RandomSampler(range(8)),                                               # torch's global generator
    SequentialSubclass(range(8)),                                          # a subclass may draw
    OwnSampler(8),                                                         # the user's
], ids=["global-generator", "subclass", "user-sampler"])
def test_orders_user_code_may_draw_for_are_not_planned(sampler):
    """Only torch's own classes over a generator of the loader's own are
    replayed ahead: the global generator is drawn from by the training step
    too, and a sampler of the user's may draw from anything."""
    assert _plan(BatchSampler(sampler, 2, False), single=False, epoch=1) is None
    assert _plan(sampler, single=True, epoch=1) is None


def test_orders_of_torchs_own_samplers_are_planned():
    g = torch.Generator().manual_seed(0)
    assert _plan(BatchSampler(SequentialSampler(range(8)), 2, False), single=False, epoch=1) is not None
    assert _plan(BatchSampler(RandomSampler(range(8), generator=g), 2, True), single=False, epoch=1) is not None


@pytest.mark.parametrize("how", ["close", "drop"])
def test_a_loader_closed_or_dropped_while_the_next_epoch_loads_early_leaves_nothing(how):
    """close() (or dropping the DataLoader) while its threads load the next
    epoch's first batches stops them; nothing is left running (the autouse
    fixture checks the threads and the core's objects)."""
    n = 24
    ds = Recorded(n)
    loader = DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    for _epoch in range(2):
        assert len(list(loader)) == 6
    assert ds.wait_for_calls(2 * n + 1)
    if how == "close":
        loader.close()
        with pytest.raises(ClosedError):
            next(iter(loader))
    del loader
