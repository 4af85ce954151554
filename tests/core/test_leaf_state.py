"""The state an array leaf holds besides its memory: an ndarray subclass's
attributes are copied like a batch, never carried over from the source
(SPEC §3 rule 1, issue 18 item 8).

numpy's documented ``__array_finalize__`` pattern (``self.info = getattr(obj,
"info", None)``) gives a copy the source's very attribute objects; an array
among them, written by the source later, must not show in the batch.
"""
import numpy as np
import pytest

from prefetch import Prefetcher
from prefetch._core import MAX_STATE_NESTING


class Masked(np.ndarray):
    """numpy's documented subclass pattern, with an array attribute."""

    def __array_finalize__(self, obj):
        self.mask = getattr(obj, "mask", None)


class Info(np.ndarray):
    def __array_finalize__(self, obj):
        self.info = getattr(obj, "info", None)


class Slotted(np.ndarray):
    __slots__ = ("mask", "unset")

    def __array_finalize__(self, obj):
        self.mask = getattr(obj, "mask", None)


class Parent(np.ndarray):
    """Keeps the array it was made from (a view's parent)."""

    def __array_finalize__(self, obj):
        self.parent = obj


def one(batch, **kw):
    with Prefetcher([batch], **kw) as p:
        (out,) = list(p)
    return out


def test_subclass_attribute_array_is_copied_not_shared():
    """Issue 18 item 8: the documented pattern's mask comes out as a copy; the
    source's later write to its mask does not show in the batch."""
    a = np.arange(6.0).view(Masked)
    a.mask = np.array([False, True, False, True, False, True])
    out = one(a)
    assert type(out) is Masked and np.array_equal(out, a)
    assert out.mask is not a.mask and not np.shares_memory(out.mask, a.mask)
    assert out.mask.tolist() == [False, True] * 3
    a.mask[:] = True            # the source reuses its mask for the next batch
    assert out.mask.tolist() == [False, True] * 3


def test_subclass_attribute_containers_are_walked_like_a_batch():
    """Arrays nested in an attribute's containers are copied; the containers are
    rebuilt; plain values are the same objects (the one documented exception)."""
    tag = object()
    boxes = np.ones((2, 4), np.float32)
    a = np.zeros(3).view(Info)
    a.info = {"boxes": [boxes], "size": (480, 640), "tag": tag}
    out = one(a)
    assert out.info is not a.info and out.info["boxes"] is not a.info["boxes"]
    copied = out.info["boxes"][0]
    assert np.array_equal(copied, boxes) and not np.shares_memory(copied, boxes)
    assert out.info["size"] == (480, 640) and out.info["tag"] is tag
    boxes[:] = 7
    assert (copied == 1).all()


def test_subclass_slots_are_copied_and_unset_slots_stay_unset():
    a = np.arange(4).view(Slotted)
    a.mask = np.zeros(4, bool)
    out = one(a)
    assert type(out) is Slotted and not np.shares_memory(out.mask, a.mask)
    a.mask[:] = True
    assert not out.mask.any()
    with pytest.raises(AttributeError):
        getattr(out, "unset")  # noqa: B009


@pytest.mark.parametrize("workers", [1, 2])
def test_subclass_attributes_are_copied_in_every_batch_of_a_refilling_source(workers):
    """§3 rule 3 with state: a source that refills one subclass array and its
    mask in place still yields distinct, correct batches (attribute included)."""
    a = np.zeros(1000).view(Masked)
    a.mask = np.zeros(1000, np.int64)

    def src():
        for i in range(6):
            a[:] = i
            a.mask[:] = -i
            yield {"x": a}
    with Prefetcher(src(), depth=3, workers=workers) as p:
        out = list(p)
    for i, b in enumerate(out):
        assert (b["x"] == i).all() and (b["x"].mask == -i).all()


def test_attribute_referring_back_to_the_source_refers_to_the_copy():
    """A finalizer that keeps the array it came from (self.parent = obj) gives
    the copy a reference to the source: it becomes a reference to the copy (as
    copy.deepcopy's memo does), not a copy of the source over and over."""
    base = np.arange(10.0).view(Parent)

    def src():
        for i in range(3):
            yield base[i:i + 2]     # a view whose .parent is base
    with Prefetcher(src()) as p:
        out = list(p)
    for i, b in enumerate(out):
        assert b.tolist() == [i, i + 1]
        assert b.parent is b and not np.shares_memory(b, base)


def test_leaves_nested_in_attributes_too_deep_raise_and_the_stream_ends():
    """§4: a chain of arrays in each other's attributes deeper than the limit is an
    error in the consumer, after the batches before it; the process goes on."""
    head = np.zeros(1).view(Info)
    node = head
    for _ in range(MAX_STATE_NESTING + 1):
        nxt = np.zeros(1).view(Info)
        node.info = nxt
        node = nxt
    with Prefetcher([np.ones(2), head, np.ones(2)]) as p:
        assert next(p).tolist() == [1.0, 1.0]
        with pytest.raises(ValueError, match=f"deeper than {MAX_STATE_NESTING} levels"):
            next(p)
        with pytest.raises(StopIteration):
            next(p)
    node.info = None
    shallow = np.zeros(1).view(Info)
    shallow.info = head.info.info.info          # three levels: fine
    out = one(shallow)
    assert out.info is not shallow.info and type(out.info.info) is Info


def test_shadowed_slot_subclass_is_refused_with_a_clear_error():
    class Shadowed(Slotted):
        mask = None                 # hides the base's slot: its state cannot be read by name

    a = np.zeros(2).view(Shadowed)
    with pytest.raises(TypeError, match=r"Shadowed.*__slots__.*register_leaf"):
        one(a)


def test_masked_array_and_memmap_keep_their_state(tmp_path):
    """The state a subclass computes for a copy is kept: a MaskedArray's mask (a
    copy), a memmap copy that maps no file."""
    m = np.ma.masked_array([1.0, 2.0, 3.0], mask=[0, 1, 0], fill_value=-1.0)
    out = one(m)
    assert type(out) is np.ma.MaskedArray and out.fill_value == -1.0
    assert out.mask.tolist() == [False, True, False] and not np.shares_memory(out.mask, m.mask)
    m.mask[:] = True
    assert out.mask.tolist() == [False, True, False]
    mm = np.memmap(tmp_path / "a.bin", dtype=np.uint8, mode="w+", shape=(8,))
    out = one(mm[2:6])
    assert type(out) is np.memmap and out._mmap is None and out.filename is None
    mm[:] = 9
    assert not out.any()
    del mm
