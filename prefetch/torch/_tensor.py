"""``torch.Tensor`` leaves, registered on import.

A CPU tensor is copied by the core: a pool block that the core fills later
in the batch without the GIL, wrapped by ``torch.from_numpy``, so the tensor
handed out owns the block and it goes back to the pool only when torch frees
the tensor. A plain contiguous tensor is read from its address
(``plan.array_at``, its storage kept alive until the memcpy ran); any other
is seen as a numpy array first (``.numpy()``, no copy) for ``plan.array``.

What comes out of a copy: docs/pytorch.md, "What comes out".

Hand-over without a copy: when the core has proven that only the batch holds
the tensor object, ``exclusive`` proves that only that object reaches its
memory (a tensor's reference count says nothing about its storage), and the
tensor is handed out as is. What the proof cannot see: a C++ weak pointer to
the storage (``torch.multiprocessing.reductions.StorageWeakRef``, which torch
keeps for its shared-memory cache, whose storages are copied anyway, and in
compiler internals); a source that revives a storage through one is not
detected.

Threading contract: ``copy_tensor`` and ``exclusive`` run on the thread that
copies the batch (a Prefetcher's publisher thread, a Loader's threads) with
the GIL held.
"""
from __future__ import annotations

from sys import getrefcount
from typing import Any
from weakref import getweakrefcount

from prefetch._framework import register_leaf
from prefetch.torch._torch import torch

Tensor = torch.Tensor

# Dtypes numpy has no equivalent for: their bytes travel as an integer dtype
# of the same item size (a view, no copy), and the copy is viewed back.
_BY_ITEMSIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
NUMPY_DTYPES = frozenset((
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.float32,
    torch.float64, torch.complex64, torch.complex128))
VIEW_AS = {dt: _BY_ITEMSIZE[dt.itemsize] for dt in (
    torch.bfloat16, torch.complex32, torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2,
    torch.float8_e5m2fnuz, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2)}
_COPYABLE = NUMPY_DTYPES | frozenset(VIEW_AS)   # no quantized or sub-byte integer dtype

# ndim -> (memory format, permutation to contiguous, permutation back)
_CHANNELS_LAST = {
    4: (torch.channels_last, (0, 2, 3, 1), (0, 3, 1, 2)),
    5: (torch.channels_last_3d, (0, 2, 3, 4, 1), (0, 4, 1, 2, 3)),
}
_STRIDED = torch.strided
_from_numpy = torch.from_numpy
# copy_tensor's common case: torch dtype -> the numpy dtype its bytes travel as.
# Complex dtypes take the general path, where a lazy conjugate is resolved.
_AS_NUMPY = {dt: torch.empty(0, dtype=VIEW_AS.get(dt, dt)).numpy().dtype for dt in _COPYABLE if not dt.is_complex}
_PLAIN_TYPES = frozenset((Tensor, torch.nn.Parameter, torch.nn.Buffer))


def copy_tensor(t: Tensor, plan: Any) -> Tensor:
    """Leaf hook (prefetch.register_leaf): a fresh tensor with ``t``'s shape,
    dtype and values, over a pool block the core fills without the GIL."""
    # The common case, a plain contiguous CPU tensor, without a numpy view of
    # the source: .numpy() alone costs more than the rest of a small tensor's
    # copy (a tiny batch's budget is about 1 µs a leaf), so one torch call per
    # check, and no check whose failure a later call reports anyway.
    if type(t) is Tensor and t.is_cpu:
        try:
            dtype = t.dtype
            as_numpy = _AS_NUMPY.get(dtype) if t.is_contiguous() and not t.is_neg() else None
            address = t.data_ptr() if as_numpy is not None else 0   # 0 also: a ZeroTensor's
            shape = t.shape
        except RuntimeError:   # no memory (sparse, mkldnn layouts) or no shape (nested)
            address = 0
        if address:
            # The storage keeps the memory valid until the memcpy, whatever
            # becomes of the tensor object meanwhile (set_, resize_).
            out = _from_numpy(plan.array_at(t.untyped_storage(), address, shape, as_numpy))
            return out if dtype not in VIEW_AS else out.view(dtype)
    return _copy_general(t, plan)


def _copy_general(t: Tensor, plan: Any) -> Tensor:
    """Every tensor: subclasses, other devices and layouts, strided, channels_last,
    complex (a lazy conjugate), negative views, nested and quantized ones."""
    cls = type(t)
    if cls is not Tensor:
        return _copy_subclass(t, cls, plan)
    if not t.is_cpu or t.layout is not _STRIDED:
        return _copy_unusual(t)
    if t.requires_grad:
        t = t.detach()
    back: tuple[int, ...] | None = None
    # Quantized and nested tensors fail in .numpy() below (diagnosed there):
    # checking them here would cost every tensor (a tiny batch's budget is ~1 µs a leaf).
    if not t.is_contiguous() and not t.is_nested:
        fmt = _CHANNELS_LAST.get(t.dim())
        if fmt is not None and t.is_contiguous(memory_format=fmt[0]):
            t = t.permute(fmt[1])   # contiguous: one memcpy instead of a strided copy
            back = fmt[2]
    view = VIEW_AS.get(t.dtype)
    try:
        src = (t if view is None else t.view(view)).numpy()
    except (RuntimeError, TypeError) as exc:
        if t.is_quantized or t.is_nested:
            return _copy_unusual(t)
        if not (t.is_conj() or t.is_neg()):
            raise TypeError(f"prefetch cannot copy a torch.Tensor of dtype {t.dtype}: {exc}") from exc
        # A lazy conjugate/negative view: torch materialises it into a tensor
        # of its own, which nothing else can reach (not pooled; rare). It does
        # not go through plan.array: the plan would copy from it after it died.
        out = t.resolve_conj().resolve_neg().contiguous()
        return out if back is None else out.permute(back)
    out = torch.from_numpy(plan.array(src))   # keeps the pool array (and its block) alive
    if view is not None:
        out = out.view(t.dtype)
    if back is not None:
        out = out.permute(back)
    return out


def _storage_refs(t: Tensor) -> int:
    s = t.untyped_storage()
    return getrefcount(s)


# The Python references to a storage object that only its tensor reaches: the
# local variable, the argument of getrefcount (none where the interpreter
# borrows it) and the one torch's C++ holds while the storage also has other
# C++ owners (its tensor). Counted, not assumed, with the same code as below.
_SOLE_STORAGE_REFS = _storage_refs(torch.empty(1))
_storage_uses = torch._C._storage_Use_Count


def exclusive(t: Tensor) -> bool:
    """Leaf hook (prefetch.register_leaf): True only when nothing but ``t``
    reaches its memory, so the batch may hand it over uncopied. Asked only
    about a tensor object the core has proven that only the batch holds;
    anything not proven means copy.

    ``t`` must also be what ``copy_tensor`` would make of it (a plain CPU
    tensor, contiguous, no autograd state, no attributes), so a hand-over
    changes nothing the consumer can see. Then its memory is its own when:
    - its TensorImpl has one owner (this object): no view keeps it as its
      ``_base``, no DLPack capsule (``__dlpack__``, ``np.from_dlpack``)
      holds it, and no weak reference can bring the object back;
    - it is no view itself (``_base``, which the storage's count below also
      shows) and covers its whole storage (same bytes, so offset 0);
    - its storage has two owners, this tensor and the storage's own Python
      object, whose references are exactly ours (no one keeps
      ``t.untyped_storage()``) and which no weak reference reaches: no other
      tensor (views, ``detach()``, ``.data``, ``set_()``) and no numpy
      array of ``.numpy()`` shares it;
    - torch allocated that storage (resizable): not memory it wraps
      (``from_numpy``, ``frombuffer``, ``from_dlpack``, files, ``torch.load``);
    - it is not in shared memory (``share_memory_()``, ``from_file``,
      batches of DataLoader worker processes), which other processes reach.
    """
    if (type(t) is not Tensor or not t.is_cpu or t.layout is not _STRIDED or t.is_nested
            or t.dtype not in _COPYABLE or t.requires_grad or t.grad is not None
            or t._base is not None or not t.is_contiguous() or t._use_count() != 1
            or getweakrefcount(t) or t.__dict__):
        return False
    s = t.untyped_storage()
    return (getrefcount(s) == _SOLE_STORAGE_REFS and _storage_uses(s._cdata) == 2
            and not getweakrefcount(s) and s.nbytes() == t.nbytes and s.resizable()
            and not s.is_shared())


def _describe(t: Tensor) -> str:
    return f"a {type(t).__module__}.{type(t).__qualname__} (layout {t.layout}, dtype {t.dtype}, device {t.device})"


def _copy_unusual(t: Tensor) -> Tensor:
    """Tensors whose memory is not one CPU block the core can read."""
    if t.is_cuda and t.layout is torch.strided and not t.is_quantized and not t.is_nested:
        # Cloned by torch on the tensor's current stream: the consumer's work on
        # that stream (and the source's later writes) are ordered after it.
        return t.detach().clone(memory_format=torch.contiguous_format)
    if t.layout is not torch.strided:
        kind = "mkldnn" if t.layout is torch._mkldnn else "sparse"
        what = f"{kind} tensors are not supported (convert with .to_dense())"
    elif t.is_quantized:
        what = "quantized tensors are not supported (convert with .dequantize() or .int_repr())"
    elif t.is_nested:
        what = "nested tensors are not supported (convert with .unbind() or .to_padded_tensor())"
    else:
        what = f"tensors on {t.device.type!r} devices are not supported (only CPU and CUDA)"
    raise TypeError(f"prefetch cannot copy {_describe(t)}: {what}")


def _copy_subclass(t: Tensor, cls: type, plan: Any) -> Tensor:
    if cls in _PLAIN_TYPES:
        return copy_tensor(t.as_subclass(Tensor), plan)
    if cls.__torch_dispatch__ is not Tensor.__torch_dispatch__:  # type: ignore[attr-defined]
        # A wrapper subclass (FakeTensor, DTensor, ...): its data is not its storage.
        raise TypeError(
            f"prefetch cannot copy {_describe(t)}: it overrides __torch_dispatch__; "
            f"tell prefetch how with prefetch.register_leaf({cls.__qualname__}, copy)")
    out: Tensor = copy_tensor(t.as_subclass(Tensor), plan).as_subclass(cls)
    state = getattr(t, "__dict__", None)
    if state:
        out.__dict__.update(plan.copy_state(state, t, out))
    return out


register_leaf(Tensor, copy_tensor, exclusive=exclusive)
