"""torch.Tensor hand-over without a copy, and the copy in every other case
(SPEC §3 rule 1, issue 17 item 4).

A tensor is handed over as is only when the core proves that only the batch
holds the tensor object and the adapter's ``exclusive`` hook proves that only
that object reaches its memory. Every way a source can still reach the memory
(another tensor on the storage, a numpy array, a DLPack capsule, the storage
object, a weak reference, a file or shared-memory mapping) must give a copy:
each case below writes through what the source kept after the batch came out,
and the batch must not change. "Handed over" is observed through the data
address: a copy is made while the original is alive, so only a handed-over
tensor keeps it.

As in tests/core/test_handover.py, sources build each leaf in a helper and
``yield make(...)``: a generator's suspended frame would keep its locals.
"""
import mmap
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils import dlpack  # noqa: E402
from torch.utils.data import DataLoader, Dataset, default_collate  # noqa: E402

from prefetch import Prefetcher  # noqa: E402
from prefetch.torch._tensor import exclusive  # noqa: E402


def run(src, **kw):
    with Prefetcher(src, depth=2, **kw) as p:
        return list(p), p.stats()


# -- the proof, asked directly ------------------------------------------------------

def test_fresh_tensors_are_exclusive():
    """§3 rule 1: tensors torch allocated for this object alone are exclusive, whatever
    their dtype, shape or size, and whether or not their storage object was made."""
    assert exclusive(torch.ones(3, 4)) is True
    assert exclusive(torch.empty(0)) is True
    assert exclusive(torch.tensor(5)) is True
    assert exclusive(torch.zeros(2, dtype=torch.bfloat16)) is True
    assert exclusive(torch.stack([torch.ones(2), torch.ones(2)])) is True
    t = torch.arange(6)
    t.untyped_storage()            # its storage object made and dropped: torch keeps it,
    assert exclusive(t) is True    # but nothing else does


def test_storage_count_sees_another_tensor_whether_or_not_the_storage_object_exists():
    """§3 rule 1: the storage's use count tells a second tensor on the storage apart, both
    before torch made the storage's Python object and after (which adds an owner)."""
    t = torch.ones(4)
    u = t.view(2, 2)               # the storage object is made first inside exclusive()
    assert exclusive(t) is False
    del u
    assert exclusive(t) is True    # now it exists (kept by torch, not by us)
    u = torch.empty(0).set_(t.untyped_storage())
    assert exclusive(t) is False and exclusive(u) is False
    del u
    assert exclusive(t) is True


def _alias_makers():
    """name -> make(reach): a tensor, and what the source keeps that reaches its memory."""
    def keep(reach, *handles):
        reach.extend(handles)

    def numpy_kept(reach):
        t = torch.ones(6)
        keep(reach, t.numpy())
        return t

    def from_numpy(reach):
        a = np.ones(6, np.float32)
        keep(reach, a)
        return torch.from_numpy(a)

    def dlpack_capsule(reach):
        t = torch.ones(6)
        keep(reach, dlpack.to_dlpack(t))
        return t

    def np_from_dlpack(reach):
        t = torch.ones(6)
        keep(reach, np.from_dlpack(t))
        return t

    def torch_from_dlpack(reach):
        a = np.ones(6, np.float32)
        keep(reach, a)
        return torch.from_dlpack(a)

    def storage_kept(reach):
        t = torch.ones(6)
        keep(reach, t.untyped_storage())
        return t

    def storage_weakref(reach):
        t = torch.ones(6)
        keep(reach, weakref.ref(t.untyped_storage()))
        return t

    def tensor_weakref(reach):
        t = torch.ones(6)
        keep(reach, weakref.ref(t))
        return t

    def view_kept(reach):
        t = torch.ones(6)
        keep(reach, t.view(2, 3))
        return t

    def is_view(reach):
        t = torch.ones(8)
        keep(reach, t)
        return t[2:]

    def view_of_temporary(reach):
        return torch.ones(8)[2:]          # its _base keeps the rest alive

    def as_strided_kept(reach):
        t = torch.ones(6)
        keep(reach, t.as_strided((3,), (2,)))
        return t

    def narrow_kept(reach):
        t = torch.ones(6)
        keep(reach, t.narrow(0, 1, 3))
        return t

    def set_storage(reach):
        t = torch.ones(6)
        keep(reach, t)
        return torch.empty(0).set_(t.untyped_storage())

    def detach_kept(reach):
        t = torch.ones(6)
        keep(reach, t.detach())
        return t

    def data_kept(reach):
        t = torch.ones(6)
        keep(reach, t.data)
        return t

    def shared_memory(reach):
        t = torch.ones(6).share_memory_()
        s = t.untyped_storage()           # another process would map this fd
        keep(reach, np.frombuffer(mmap.mmap(s._get_shared_fd(), s.nbytes()), np.float32))
        return t

    def storage_larger(reach):
        return torch.ones(12).resize_(6)  # spare bytes: copied, as numpy copies them

    def grad_set(reach):
        t = torch.ones(6)
        g = torch.zeros(6)
        t.grad = g
        keep(reach, g)
        return t

    def attribute(reach):
        t = torch.ones(6)
        t.meta = np.ones(6, np.float32)   # the batch would carry what the source keeps
        keep(reach, t.meta)
        return t

    def subclass(reach):
        return torch.nn.Parameter(torch.ones(6), requires_grad=False)

    def requires_grad(reach):
        return torch.ones(6, requires_grad=True)

    def not_contiguous(reach):
        return torch.empty_strided((2, 3), (1, 2)).fill_(1)   # its own storage, column-major

    return {name: make for name, make in locals().items() if callable(make) and name != "keep"}


ALIASES = _alias_makers()


def _write(handle):
    """Write -1 through whatever the source kept."""
    if isinstance(handle, weakref.ref):
        handle = handle()
        if handle is None:
            return                     # the original died: nothing reaches the batch
    if isinstance(handle, torch.UntypedStorage):
        handle = torch.empty(0).set_(handle)
    elif type(handle).__name__ == "PyCapsule":
        handle = dlpack.from_dlpack(handle)
    if isinstance(handle, np.ndarray):
        handle[...] = -1
    else:
        handle.fill_(-1)


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_every_way_of_still_reaching_the_memory_is_copied(name):
    """§3 rule 1: a tensor whose memory anything besides the batch reaches (or that is
    not what a copy would give) is copied, exclusive() says so, and a later write
    through what the source kept does not show in the batch."""
    reach = []
    assert exclusive(ALIASES[name](reach)) is False
    out, s = run(ALIASES[name](reach) for _ in range(2))
    assert s.leaves_handed_over == 0 and s.leaves_copied == 2
    for h in reach:
        _write(h)
    for b in out:
        assert type(b) is torch.Tensor and not b.requires_grad and b.grad is None
        assert b.is_contiguous() and bool((b == 1).all())


def test_a_kept_tensor_and_a_tensor_twice_are_copied():
    """§3 rule 1: the source keeping the tensor object itself, or a batch listing it
    twice, is the core's proof failing: exclusive() is not even asked."""
    kept = []

    def make():
        t = torch.ones(4)
        kept.append(t)
        return (t,)

    def twice():
        t = torch.ones(4)
        return (t, [t])
    out, s = run(make() for _ in range(2))
    assert s.leaves_handed_over == 0 and s.leaves_copied == 2
    out2, s2 = run(twice() for _ in range(2))
    assert s2.leaves_handed_over == 0 and s2.leaves_copied == 4
    for t in kept:
        t.fill_(-1)
    assert all(bool((b[0] == 1).all()) for b in out)
    assert all(b[0].data_ptr() != b[1][0].data_ptr() for b in out2)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("make", [
    lambda: torch.ones(3, device="meta"),
    lambda: torch.ones(2, 3).to_sparse(),
    lambda: torch.ones(2, 3).to_sparse_csr(),
    lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8),
    lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
], ids=["meta", "sparse_coo", "sparse_csr", "quantized", "nested"])
def test_tensors_copy_refuses_are_refused_fresh_too(make):
    """§3: a fresh tensor that copy_tensor refuses is not exclusive either, so it is
    refused (TypeError) as it is without hand-over, never handed out."""
    assert exclusive(make()) is False
    with Prefetcher(make() for _ in range(1)) as p:
        with pytest.raises(TypeError, match=r"prefetch cannot copy a torch\.Tensor"):
            next(p)


# -- what is handed over -------------------------------------------------------------

def test_fresh_tensors_in_builtin_containers_are_handed_over():
    """§3 rule 1: fresh tensors of a fresh tuple/list/dict nest are handed over as
    they are (same memory), counted in stats()."""
    addrs = []

    def make(i):
        x, y = torch.full((4, 3), float(i)), torch.arange(5) + i
        addrs.append((x.data_ptr(), y.data_ptr()))
        return (x, {"y": [y, "s"], "i": i})
    out, s = run(make(i) for i in range(3))
    assert s.leaves_handed_over == 6 and s.leaves_copied == 0
    assert s.bytes_handed_over == 3 * (48 + 40) and s.bytes_copied == 0
    for i, b in enumerate(out):
        assert (b[0].data_ptr(), b[1]["y"][0].data_ptr()) == addrs[i]
        assert float(b[0][0, 0]) == i and int(b[1]["y"][0][0]) == i and b[1]["i"] == i


def test_copy_always_copies_fresh_tensors():
    """§3 rule 1: copy="always" copies every tensor."""
    out, s = run((torch.full((4,), float(i)) for i in range(3)), copy="always")
    assert s.leaves_handed_over == 0 and s.leaves_copied == 3
    assert [float(b[0]) for b in out] == [0.0, 1.0, 2.0]


def _sample(i):
    return torch.full((3, 8, 8), float(i)), i


def test_a_default_collate_batch_is_handed_over():
    """§3 rule 1 (issue 17): default_collate builds every tensor of a batch afresh, so a
    source yielding its batches has every leaf handed over."""
    addrs = []

    def make(k):
        b = default_collate([_sample(4 * k + j) for j in range(4)])
        addrs.append([t.data_ptr() for t in b])
        return b
    out, s = run(make(k) for k in range(3))
    assert s.leaves_handed_over == 6 and s.leaves_copied == 0
    assert s.bytes_handed_over == 3 * (4 * 3 * 8 * 8 * 4 + 4 * 8)
    for k, (x, y) in enumerate(out):
        assert [x.data_ptr(), y.data_ptr()] == addrs[k]
        assert y.tolist() == [4 * k + j for j in range(4)] and float(x[3, 0, 0, 0]) == 4 * k + 3


class Images(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return {"x": _sample(i)[0], "y": i}


def test_prefetcher_over_a_dataloader_hands_every_leaf_over():
    """§3 rule 1 (issue 17): Prefetcher(DataLoader) hands over every tensor of every
    batch of a DataLoader without worker processes."""
    out, s = run(DataLoader(Images(), batch_size=4))
    assert len(out) == 6 and s.leaves_handed_over == 12 and s.leaves_copied == 0
    for k, b in enumerate(out):
        assert b["y"].tolist() == list(range(4 * k, 4 * k + 4))
        assert float(b["x"][0, 0, 0, 0]) == 4 * k


def test_prefetcher_over_worker_processes_copies_their_shared_memory():
    """§3 rule 1: batches of DataLoader worker processes arrive in shared memory, which
    another process mapped: copied, into memory of the batch's own."""
    out, s = run(DataLoader(Images(), batch_size=4, num_workers=2))
    assert len(out) == 6 and s.leaves_handed_over == 0 and s.leaves_copied == 12
    assert not any(b["x"].is_shared() for b in out)
    assert [b["y"].tolist()[0] for b in out] == [0, 4, 8, 12, 16, 20]
