"""prefetch.torch reads torch's RandomSampler without the list of every
index torch makes for each permutation (issue 36: at 1.5 M samples that list
is about 58 MiB held for the epoch, and the epoch plan made another). The
stand-in must give torch's indices with torch's draws, read for read: the
same batches, and the generator (the sampler's own, or torch's global one
that seeds it) in the same state after every read."""
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler  # noqa: E402

from prefetch.torch import DataLoader  # noqa: E402
from prefetch.torch._sampler import _lean, _Permutation  # noqa: E402


def _reads(sampler, generator, reads):
    """Each read of iter(sampler) with the generator's state after it (None once it ended)."""
    it = iter(sampler)
    out = []
    for _ in range(reads):
        item = next(it, None)
        out.append((item, bytes(generator.get_state().numpy())))
    return out


@pytest.mark.parametrize("n", [12, 13])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("num_samples", [None, 5, 30])
def test_batches_and_draws_are_torchs_read_for_read(n, drop_last, num_samples):
    def batches(lean):
        g = torch.Generator().manual_seed(3)
        sampler = BatchSampler(RandomSampler(range(n), num_samples=num_samples, generator=g), 4, drop_last)
        return _reads(_lean(sampler) if lean else sampler, g, 12)
    ours = batches(lean=True)
    assert ours == batches(lean=False)
    assert any(b is None for b, _ in ours)   # read past the end: the last draw is compared too


@pytest.mark.parametrize("num_samples", [None, 7])
def test_a_sampler_without_a_generator_seeds_from_torchs_global_one_as_torch_does(num_samples):
    def reads(lean):
        torch.manual_seed(11)
        sampler = RandomSampler(range(10), num_samples=num_samples)
        return [(i, bytes(torch.get_rng_state().numpy())) for i in (_lean(sampler) if lean else sampler)]
    ours = reads(lean=True)
    assert ours == reads(lean=False)


def test_only_torchs_own_sampler_without_replacement_is_replaced():
    g = torch.Generator()
    assert type(_lean(RandomSampler(range(5), generator=g))) is _Permutation
    assert type(_lean(BatchSampler(RandomSampler(range(5)), 2, False)).sampler) is _Permutation
    for kept in (RandomSampler(range(5), replacement=True), SequentialSampler(range(5)),
                 BatchSampler(SequentialSampler(range(5)), 2, False),
                 type("Sub", (RandomSampler,), {})(range(5))):
        assert _lean(kept) is kept


@pytest.mark.parametrize("persistent", [False, True])
def test_shuffled_epochs_are_torchs(persistent):
    kw = dict(batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(5))
    # torch draws a base seed from the generator for each iterator: one per
    # epoch, or one in all with persistent workers (which need a process)
    procs = dict(num_workers=1, persistent_workers=True) if persistent else {}
    reference = torch.utils.data.DataLoader(list(range(20)), **procs, **kw)
    theirs = [[b.tolist() for b in reference] for _ in range(3)]
    del reference
    kw["generator"] = torch.Generator().manual_seed(5)
    with DataLoader(list(range(20)), num_workers=2, persistent_workers=persistent, **kw) as loader:
        ours = [[b.tolist() for b in loader] for _ in range(3)]
    assert ours == theirs
