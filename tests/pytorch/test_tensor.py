"""torch.Tensor leaves (SPEC §3, §5, issue 12): fresh tensors, same shape,
dtype and values, no shared storage, pooled memory reused after torch frees it."""
import gc
import itertools
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import prefetch  # noqa: E402
from prefetch import Prefetcher  # noqa: E402
from support import python_output  # noqa: E402


def one(batch, **kw):
    """The single batch a prefetcher makes of ``batch``."""
    with Prefetcher([batch], **kw) as p:
        (out,) = list(p)
    return out


def same_bytes(a, b):
    """Equal shape, dtype and bits (NaN-safe, for dtypes torch.equal cannot compare)."""
    assert a.shape == b.shape and a.dtype == b.dtype
    return a.contiguous().view(-1).view(torch.uint8).tolist() == b.contiguous().view(-1).view(torch.uint8).tolist()


def assert_fresh(out, src):
    """§3 rule 1: a plain tensor with src's values sharing none of its memory."""
    assert type(out) is torch.Tensor
    assert out.shape == src.shape and out.dtype == src.dtype
    assert same_bytes(out, src)
    assert not out.requires_grad and out.grad_fn is None
    if out.numel():
        s = src.untyped_storage()
        lo, hi = s.data_ptr(), s.data_ptr() + s.nbytes()
        o = out.untyped_storage()
        assert o.data_ptr() + o.nbytes() <= lo or o.data_ptr() >= hi


with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)   # complex32 is "experimental"
    DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.bool,
              torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
              torch.uint16, torch.uint32, torch.uint64, torch.complex64, torch.complex128,
              torch.complex32, torch.float8_e4m3fn, torch.float8_e5m2]


def sample(dtype, shape=(3, 5, 4)):
    base = torch.arange(int(np.prod(shape)), dtype=torch.int64).reshape(shape) % 7 - 3
    if dtype is torch.bool:
        return base > 0
    if dtype.is_complex:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.complex(base.float(), -base.float()).to(dtype)
    if not dtype.is_floating_point and not dtype.is_signed:
        return (base + 3).to(dtype)
    return base.to(dtype)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_contiguous_and_strided(dtype):
    """§3: same dtype and bits for every dtype, numpy's or not (bfloat16,
    float8, complex32 travel as same-itemsize integers)."""
    src = sample(dtype)
    for view in (src, src[:, ::2], src.transpose(0, 2), src[1]):
        out = one(view)
        assert_fresh(out, view)
        assert out.is_contiguous()


def test_issue_example_refilled_buffer():
    """§3 rule 3, the issue's example: a tensor refilled in place gives distinct batches."""
    buf = torch.zeros(4)

    def src():
        for i in range(3):
            buf.fill_(i)
            yield buf

    with Prefetcher(src()) as p:
        assert [o.tolist() for o in p] == [[0.0] * 4, [1.0] * 4, [2.0] * 4]


@pytest.mark.parametrize("workers", [1, 2])
def test_refilling_source_kept_batches(workers):
    """§3 rule 3 with any workers, the consumer keeping every batch; big enough to split."""
    buf = torch.empty(300_000)

    def src():
        for i in range(6):
            buf.fill_(i)
            yield {"x": buf, "y": buf[::3]}

    with Prefetcher(src(), workers=workers) as p:
        got = list(p)
    for i, b in enumerate(got):
        assert torch.all(b["x"] == i) and torch.all(b["y"] == i)
        assert b["y"].untyped_storage().data_ptr() != b["x"].untyped_storage().data_ptr()


@pytest.mark.parametrize("make", [
    lambda: torch.tensor(2.5),                       # 0-d
    lambda: torch.empty(0, 3),                       # empty
    lambda: torch.empty(4, 0, dtype=torch.bfloat16),
    lambda: torch.ones(3).expand(4, 3),              # stride 0
    lambda: torch.arange(6.0).reshape(1, 6).expand(5, 6).t(),
    lambda: torch.arange(24.0).reshape(2, 3, 4)[:, 1:, ::3],
    lambda: torch.arange(10, dtype=torch.bfloat16)[3:],  # storage offset
], ids=["0d", "empty", "empty-bf16", "expanded", "expanded-t", "sliced", "offset"])
def test_layouts_come_out_contiguous(make):
    src = make()
    out = one(src)
    assert_fresh(out, src)
    assert out.is_contiguous() and out.storage_offset() == 0


@pytest.mark.parametrize("shape, fmt", [((2, 3, 5, 4), torch.channels_last),
                                        ((2, 3, 2, 5, 4), torch.channels_last_3d)])
def test_channels_last_is_kept(shape, fmt):
    """README: a channels_last input comes out channels_last (one memcpy)."""
    src = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape).contiguous(memory_format=fmt)
    assert not src.is_contiguous()
    out = one(src)
    assert_fresh(out, src)
    assert out.is_contiguous(memory_format=fmt) and out.stride() == src.stride()


def test_requires_grad_is_copied_by_value():
    """README: detached copy, requires_grad=False, no grad_fn; the graph is untouched."""
    w = torch.ones(3, requires_grad=True)
    y = w * 2
    out = one((w, y))
    for o, s in zip(out, (w, y)):
        assert_fresh(o, s.detach())
    y.sum().backward()
    assert w.grad.tolist() == [2.0, 2.0, 2.0]


def test_parameter_becomes_a_plain_tensor():
    """README: a torch.nn.Parameter comes out as a plain tensor holding its value."""
    p = torch.nn.Parameter(torch.arange(4.0))
    out = one([p])[0]
    assert_fresh(out, p.detach())


def test_conj_and_neg_bits_are_resolved():
    z = torch.complex(torch.arange(4.0), torch.ones(4))
    # A real tensor carries a neg bit too (contiguous: the common path's case), and
    # keeps it through detach(): not a view.
    neg = torch._neg_view(torch.arange(4.0))
    for src in (z.conj(), z.conj()[::2], torch._neg_view(z), neg, neg.detach()):
        out = one(src)
        assert type(out) is torch.Tensor and not out.is_conj() and not out.is_neg()
        assert torch.equal(out, src.resolve_conj().resolve_neg())


def test_a_tensor_without_memory_is_refused_not_read():
    """Bad input: a ZeroTensor (storage without memory: data_ptr 0) is a TypeError
    naming it, never a read of address 0."""
    z = torch._efficientzerotensor(3)
    assert z.data_ptr() == 0
    with Prefetcher([z]) as p, pytest.raises(TypeError, match=r"prefetch cannot copy a torch\.Tensor.*ZeroTensor"):
        next(p)


class _DropsStorage:
    """A registered leaf whose copy hook makes the tensor before it in the batch drop
    its storage (set_): the memcpy planned for that tensor runs after this."""

    def __init__(self, victim):
        self.victim = victim


def _drop_storage(leaf, plan):
    leaf.victim.set_(torch.empty(0))
    return None


prefetch.register_leaf(_DropsStorage, _drop_storage)


def test_the_source_storage_lives_until_its_copy_ran():
    """§3 rule 1, §5: a tensor's copy is planned while the batch is walked and runs after;
    its storage is kept alive until then, whatever happens to the tensor object. 16 MiB:
    memory glibc unmaps when freed, so a read after the free would fault, not pass by luck."""
    t = torch.full((1 << 22,), 7.0)
    out, _ = one((t, _DropsStorage(t)))
    assert t.numel() == 0 and out.shape == (1 << 22,) and bool((out == 7.0).all())


class Tagged(torch.Tensor):
    """A plain Python subclass with metadata, as torchvision's tv_tensors are."""


def test_plain_subclass_keeps_its_type_and_metadata():
    src = torch.arange(6.0).reshape(2, 3).as_subclass(Tagged)
    src.fmt = "xyxy"
    out = one(src)
    assert type(out) is Tagged and out.fmt == "xyxy"
    assert_fresh(out.as_subclass(torch.Tensor), src.as_subclass(torch.Tensor))
    src.fmt = "changed"
    assert out.fmt == "xyxy"


def test_subclass_attribute_tensors_and_arrays_are_copied_deep():
    """§3 rule 1 (issue 18 item 9): tensors and arrays in a subclass's attributes,
    nested in containers too, are copied, never shared: the source's later
    writes do not show; containers are rebuilt, plain values kept."""
    boxes, mask = torch.ones(2, 4), np.zeros(3, bool)
    src = torch.ones(2).as_subclass(Tagged)
    src.extra = {"boxes": [boxes], "mask": mask, "fmt": "xyxy"}
    src.direct = torch.arange(3)
    out = one(src)
    assert type(out) is Tagged and out.extra is not src.extra
    assert out.extra["boxes"] is not src.extra["boxes"] and out.extra["fmt"] == "xyxy"
    assert_fresh(out.extra["boxes"][0], boxes)
    assert_fresh(out.direct, src.direct)
    assert not np.shares_memory(out.extra["mask"], mask)
    boxes.fill_(5)
    mask[:] = True
    src.direct.fill_(9)
    assert (out.extra["boxes"][0] == 1).all() and not out.extra["mask"].any()
    assert out.direct.tolist() == [0, 1, 2]


def test_subclass_attribute_referring_to_itself_refers_to_the_copy():
    """A subclass whose attribute holds the tensor itself: the copy's holds the copy
    (copy.deepcopy's memo), neither the source nor an endless recursion."""
    src = torch.ones(2).as_subclass(Tagged)
    src.me = {"self": src}
    out = one(src)
    assert out.me["self"] is out


def test_subclass_attribute_arrays_are_not_delivered():
    """A leaf's attributes are its state, not array leaves: with device= they are
    copied, not delivered (a numpy attribute stays numpy)."""
    src = torch.ones(2).as_subclass(Tagged)
    src.mask = np.zeros(2, bool)
    out = one({"t": src, "a": np.ones(2)}, device=torch.device("cpu"))
    assert isinstance(out["a"], torch.Tensor)
    assert type(out["t"].mask) is np.ndarray and not np.shares_memory(out["t"].mask, src.mask)


class Wrapper(torch.Tensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise AssertionError("never dispatched")


def test_wrapper_subclass_is_refused():
    src = torch.Tensor._make_subclass(Wrapper, torch.ones(2))
    with pytest.raises(TypeError, match=r"Wrapper.*__torch_dispatch__.*register_leaf"):
        one(src)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("make, what", [
    (lambda: torch.ones(3, device="meta"), r"'meta' devices are not supported"),
    (lambda: torch.ones(2, 3).to_sparse(), r"layout torch.sparse_coo.*sparse tensors"),
    (lambda: torch.ones(2, 3).to_sparse_csr(), r"layout torch.sparse_csr.*sparse tensors"),
    pytest.param(lambda: torch.ones(2, 3).to_mkldnn(), r"layout torch._mkldnn.*mkldnn tensors",
                 marks=pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                          reason="this torch build has no mkldnn")),
    (lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8), r"dtype torch.quint8.*quantized"),
    (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), r"nested tensors"),
], ids=["meta", "sparse_coo", "sparse_csr", "mkldnn", "quantized", "nested"])
def test_unreadable_tensors_raise_naming_the_type(make, what):
    """Bad input: a clear TypeError naming the type, delivered like any copy error (§4)."""
    src = make()
    with Prefetcher([np.ones(2), src, np.zeros(2)]) as p:
        assert next(p).tolist() == [1.0, 1.0]
        with pytest.raises(TypeError, match=r"prefetch cannot copy a torch\.Tensor .*" + what) as info:
            next(p)
        assert "while copying batch 2 (counted from 1" in " ".join(info.value.__notes__)
        with pytest.raises(StopIteration):
            next(p)


def test_block_returns_to_pool_when_torch_frees_the_tensor():
    """§3 rule 2 and §5: the tensor keeps its pool block alive, and the block is
    reused only after torch frees it; steady state allocates nothing."""
    src = torch.arange(1000.0)
    with Prefetcher(itertools.repeat(src), depth=2) as p:
        kept = next(p)
        ptr = kept.data_ptr()
        held = [next(p) for _ in range(20)]
        assert len({h.data_ptr() for h in held} | {ptr}) == 21   # none handed out twice while held
        del held
        for _ in range(50):
            next(p)
        steady = p.stats().blocks_allocated
        for _ in range(200):
            out = next(p)
            assert out.data_ptr() != ptr and torch.equal(out, src)
            del out
        assert p.stats().blocks_allocated == steady
        assert p.stats().blocks_reused > 200
    # close() freed every block but the one torch still holds for us.
    blocks = prefetch._core._live_counts()["blocks"]
    assert torch.equal(kept, src)
    del kept
    gc.collect()
    assert prefetch._core._live_counts()["blocks"] == blocks - 1


def test_mixed_batch_structure_kept():
    src = {"img": torch.ones(2, 3, dtype=torch.uint8), "meta": [torch.tensor(7), "name", 3],
           "np": np.arange(3)}
    out = one(src)
    assert out["meta"][1:] == ["name", 3] and out["meta"][0].item() == 7
    assert type(out["np"]) is np.ndarray and out["np"].tolist() == [0, 1, 2]
    assert_fresh(out["img"], src["img"])


# -- optional dependency and discovery (issue 12.3) ----------------------------



def test_import_prefetch_never_imports_torch():
    out = python_output(
        "import sys, numpy as np, prefetch\n"
        "with prefetch.Prefetcher([np.ones(3), (np.zeros(2), 1)]) as p:\n"
        "    list(p)\n"
        "print('torch' in sys.modules, 'prefetch.torch' in sys.modules)\n")
    assert out == "False False\n"


def test_tensor_leaf_imports_prefetch_torch_on_demand():
    """Discovery: the entry point loads the adapter at the first tensor leaf."""
    out = python_output(
        "import sys, torch, prefetch\n"
        "print('prefetch.torch' in sys.modules)\n"
        "buf = torch.zeros(2)\n"
        "with prefetch.Prefetcher([buf]) as p:\n"
        "    out = next(p)\n"
        "print('prefetch.torch' in sys.modules, out.data_ptr() != buf.data_ptr())\n")
    assert out == "False\nTrue True\n"


def test_without_installed_metadata_the_bundled_adapter_is_found():
    """§3 rule 1: prefetch run from a source tree or a vendored copy has no
    entry points; a tensor leaf was then passed through as the source's own
    object (found on an H100 machine running the checkout by PYTHONPATH), and
    device=torch.device(...) was refused. The adapter folder's FRAMEWORK line
    declares it there."""
    out = python_output(
        "import importlib.metadata as m\n"
        "real = m.entry_points\n"
        "m.entry_points = lambda **kw: [] if kw.get('group') == 'prefetch.adapters' else real(**kw)\n"
        "import torch, prefetch\n"
        "buf = torch.zeros(3)\n"
        "with prefetch.Prefetcher([buf]) as p:\n"
        "    out = next(p)\n"
        "buf.fill_(7)\n"
        "with prefetch.Prefetcher([buf], device=torch.device('cpu')) as p:\n"
        "    on = next(p)\n"
        "print(out is buf, out.tolist(), on.tolist(), sorted(prefetch.adapters.installed().items()))\n")
    assert out == "False [0.0, 0.0, 0.0] [7.0, 7.0, 7.0] [('mxnet', 'prefetch.mx'), ('torch', 'prefetch.torch')]\n"


def test_first_leaf_a_user_subclass_loads_the_adapter_and_is_copied():
    """§3 rule 1 (issue 18 item 9): a tensor subclass defined in the user's module,
    the first torch object a process batches, is found through its torch base:
    copied with its attributes, not passed through as the source's object."""
    out = python_output(
        "import torch, prefetch\n"
        "class Boxes(torch.Tensor):\n"
        "    pass\n"
        "src = torch.ones(3).as_subclass(Boxes)\n"
        "src.extra = {'ids': [torch.arange(2)]}\n"
        "with prefetch.Prefetcher([src]) as p:\n"
        "    out = next(p)\n"
        "src.fill_(7)\n"
        "src.extra['ids'][0].fill_(7)\n"
        "print(type(out).__name__, out.tolist(), out.extra['ids'][0].tolist())\n")
    assert out == "Boxes [1.0, 1.0, 1.0] [0, 1]\n"


def test_prefetch_torch_without_torch_says_what_to_install():
    out = python_output(
        "import sys\n"
        "sys.modules['torch'] = None  # as if not installed\n"
        "try:\n"
        "    import prefetch.torch\n"
        "except ImportError as exc:\n"
        "    print(exc)\n")
    assert "pip install 'torch>=2.13'" in out
