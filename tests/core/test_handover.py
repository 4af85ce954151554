"""Hand-over without a copy, and the copy in every other case (SPEC §3 rule 1, issue 13).

A leaf is handed over as is only when nothing but the prefetcher can reach its
memory; everything a source can still reach through any path (a kept
reference, a view either way, a weak reference, a buffer export, a file
mapping, a refilled buffer, a container it keeps, a subclass, a leaf listed
twice) must arrive as a copy. "Handed over" is observed through the data
address: a copy is made while the original is still alive, so its address
differs from the original's; only a handed-over leaf keeps it.

A generator's suspended frame holds its locals, so `a = ...; yield a` is (rightly)
copied: the sources below build each batch in a helper and `yield make(...)`, so
that the one way of still reaching a leaf under test is the only one.
"""
import ctypes
import mmap
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prefetch
from prefetch import Prefetcher
from support import RefillingSource

SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}


def addr(a):
    # __array_interface__ exports no buffer and keeps no reference.
    return a.__array_interface__["data"][0]


def run(src, **kw):
    with Prefetcher(src, depth=2, **kw) as p:
        out = list(p)
        return out, p.stats()


# -- what is handed over ---------------------------------------------------------

def test_a_fresh_root_array_is_handed_over():
    """§3 rule 1: a fresh numpy array that only the prefetcher holds is handed over,
    with no copy (same memory), and counted in stats()."""
    def src():
        for i in range(5):
            yield np.full(1000, i, np.float32)[...]   # a view of a temporary: copied

    def fresh():
        for i in range(5):
            yield np.full(1000, i, np.float32)
    out, s = run(fresh())
    assert [int(b[0]) for b in out] == list(range(5))
    assert s.leaves_handed_over == 5 and s.bytes_handed_over == 5 * 4000
    assert s.leaves_copied == 0 and s.bytes_copied == 0
    assert s.blocks_allocated == 0
    out, s = run(src())
    assert s.leaves_copied == 5 and s.leaves_handed_over == 0


def test_fresh_arrays_in_builtin_containers_are_handed_over():
    """§3 rule 1: fresh leaves of a fresh tuple/list/dict nest are handed over; the
    containers are rebuilt (same types), plain values pass through."""
    def src():
        for i in range(3):
            yield (np.full(8, i), {"y": [np.zeros((2, 3), np.float16), "s", i], "z": np.ones(0)})
    out, s = run(src())
    assert s.leaves_handed_over == 9 and s.leaves_copied == 0
    for i, b in enumerate(out):
        assert type(b) is tuple and type(b[1]) is dict and type(b[1]["y"]) is list
        assert b[1]["y"][1:] == ["s", i] and int(b[0][0]) == i


def test_copy_always_copies_even_fresh_arrays():
    """§3 rule 1: copy="always" copies every array leaf into pooled memory."""
    out, s = run((np.full(100, i) for i in range(4)), copy="always")
    assert s.leaves_copied == 4 and s.bytes_copied == 4 * out[0].nbytes
    assert s.leaves_handed_over == 0 and s.bytes_handed_over == 0
    assert all(b.base is not None for b in out)   # pool-backed


@pytest.mark.parametrize("value, exc", [(True, TypeError), (None, TypeError), ("never", ValueError),
                                        ("AUTO", ValueError)])
def test_bad_copy_option_names_argument_and_value(value, exc):
    """§2 bad arguments: a clear error naming the argument and the value (§3 rule 1 option)."""
    with pytest.raises(exc, match=r"copy must be 'auto' or 'always', got " + repr(value).replace("(", r"\(")):
        Prefetcher([1], copy=value)


def test_max_bytes_counts_handed_over_bytes():
    """§2/§5 with §3 rule 1: handed-over batches count against max_bytes like copies."""
    nbytes = 1 << 16
    with Prefetcher((np.zeros(nbytes, np.uint8) for _ in range(20)), depth=8,
                    max_bytes=nbytes + nbytes // 2) as p:
        for _ in range(20):
            assert p.stats().fill <= 1
            next(p)
        assert p.stats().leaves_handed_over == 20


# -- what must be copied: every way the source can still reach a leaf -----------

def _assert_copied(out, reach, s, n):
    assert s.leaves_handed_over == 0 and s.leaves_copied == n, s
    for b in out:
        for leaf in _leaves(b):
            for r in reach:
                assert not np.shares_memory(leaf, np.asarray(r)), (leaf, r)


def _leaves(b):
    if isinstance(b, np.ndarray):
        return [b]
    if isinstance(b, dict):
        b = list(b.values())
    if isinstance(b, (list, tuple)):
        return [x for c in b for x in _leaves(c)]
    return []


def test_a_kept_reference_is_copied():
    """§3 rule 1: the source keeps the array (a list, an attribute, a generator local)."""
    kept = []

    def src():
        for i in range(3):
            a = np.full(10, i)
            kept.append(a)
            yield (a,)
    out, s = run(src())
    _assert_copied(out, kept, s, 3)

    def local():
        for i in range(3):
            a = np.full(10, i)   # the suspended frame still holds it and may write it
            yield a
            a += 100
    out, s = run(local())
    assert s.leaves_handed_over == 0 and [int(b[0]) for b in out] == [0, 1, 2]


def test_views_either_way_are_copied():
    """§3 rule 1: a leaf that is a view, or whose view the source keeps, is copied."""
    reach = []

    def is_view(i):
        base = np.full(20, i)
        reach.append(base)
        return base[2:]

    def view_kept(i):
        a = np.full(20, i)
        reach.append(a[::2])
        return a

    def src():
        for i in range(3):
            yield is_view(i)
            yield view_kept(i)
            yield np.full((4, 4), i).T        # a view of a fresh temporary
    out, s = run(src())
    _assert_copied(out, reach, s, 9)


def test_weak_references_are_copied():
    """§3 rule 1: a weakly referenced array is copied (weakref, WeakValueDictionary)."""
    refs = []
    cache = weakref.WeakValueDictionary()

    def make(i):
        a = np.full(10, i)
        if i % 2:
            refs.append(weakref.ref(a))
        else:
            cache[i] = a
        return a

    out, s = run(make(i) for i in range(4))
    assert s.leaves_handed_over == 0 and s.leaves_copied == 4
    for i, b in enumerate(out):
        r = refs[i // 2]() if i % 2 else cache.get(i)
        assert r is None or not np.shares_memory(b, r)


def test_buffer_exports_are_copied():
    """§3 rule 1: a live memoryview/buffer export, np.frombuffer over the array or over
    bytes, and an array that once exported a buffer are all copied."""
    reach = []

    def exported(i):
        a = np.full(16, i, np.uint8)
        reach.append(memoryview(a))
        return a

    def viewed_by_frombuffer(i):
        a = np.full(16, i, np.uint8)
        reach.append(np.frombuffer(a, np.uint8))
        return a

    def over_bytes(i):
        ba = bytearray(bytes([i]) * 16)
        reach.append(ba)
        return np.frombuffer(ba, np.uint8)

    def once_exported(i):
        a = np.full(16, i, np.uint8)
        memoryview(a).release()
        return a

    makers = [exported, viewed_by_frombuffer, over_bytes, once_exported]
    out, s = run(make(i) for i, make in enumerate(makers))
    assert [int(b[0]) for b in out] == [0, 1, 2, 3]
    _assert_copied(out, reach, s, 4)


def test_memmap_and_mmap_backed_arrays_are_copied(tmp_path):
    """§3 rule 1: a np.memmap (a subclass) and an array over an mmap are copied: the
    file, and whoever maps it, still reach that memory."""
    path = tmp_path / "data.bin"
    np.arange(64, dtype=np.uint8).tofile(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r+")
    with open(path, "r+b") as f:
        raw = mmap.mmap(f.fileno(), 0)

    def src():
        yield np.memmap(path, dtype=np.uint8, mode="r+", shape=(64,))
        yield np.frombuffer(raw, np.uint8)
    out, s = run(src())
    assert s.leaves_handed_over == 0 and s.leaves_copied == 2
    assert isinstance(out[0], np.memmap)   # a subclass keeps its type
    mm[:] = 0                              # the file changes under the source...
    mm.flush()
    assert list(out[0][:3]) == [0, 1, 2] and list(out[1][:3]) == [0, 1, 2]   # ...not the batch
    del out
    raw.close()
    del mm


def test_a_refilled_buffer_is_copied_and_batches_stay_distinct():
    """§3 rules 1 and 3: a source refilling one buffer is copied every time."""
    src = RefillingSource(10, shape=(4, 5))
    out, s = run(iter(src))
    assert s.leaves_handed_over == 0
    for i, (x, d) in enumerate(out):
        want_x, want_l = src.expected(i)
        np.testing.assert_array_equal(x, want_x)
        np.testing.assert_array_equal(d["label"], want_l)
        assert not np.shares_memory(x, src.buf)


def test_a_container_the_source_keeps_makes_its_leaves_copied():
    """§3 rule 1: the source keeps (and may refill) the tuple/list/dict it yields: every
    leaf under it is reachable, so copied."""
    class Src:
        def __init__(self):
            self.batch = [np.zeros(4), {"y": np.zeros(2)}]

        def __iter__(self):
            for i in range(3):
                self.batch[0] = np.full(4, i)    # fresh array, but in a kept list
                self.batch[1]["y"] = np.full(2, i)
                yield self.batch
    s_ = Src()
    out, s = run(iter(s_))
    assert s.leaves_handed_over == 0 and s.leaves_copied == 6
    assert [int(b[0][0]) for b in out] == [0, 1, 2]

    inner = {"y": None}

    def src():
        for i in range(3):
            inner["y"] = np.full(2, i)
            yield (np.full(3, i), inner)         # fresh tuple, kept dict inside
    out, s = run(src())
    assert s.leaves_handed_over == 3 and s.leaves_copied == 3
    assert [int(b[1]["y"][0]) for b in out] == [0, 1, 2]
    assert all(not np.shares_memory(b[1]["y"], inner["y"]) for b in out)


def test_zip_reuses_its_tuple_so_its_leaves_are_copied():
    """§3 rule 1: zip() keeps the tuple it returned (to reuse it): not provably sole."""
    out, s = run(zip((np.full(3, i) for i in range(3)), range(3)))
    assert s.leaves_handed_over == 0 and s.leaves_copied == 3
    assert [(int(x[0]), j) for x, j in out] == [(0, 0), (1, 1), (2, 2)]


def test_the_same_array_twice_in_a_batch_is_copied_twice():
    """§3 rule 1: a leaf listed twice is referenced twice; both places get their own copy."""
    def twice(i):
        a = np.full(5, i)
        return (a, [a])
    out, s = run(twice(i) for i in range(2))
    assert s.leaves_handed_over == 0 and s.leaves_copied == 4
    for b in out:
        assert not np.shares_memory(b[0], b[1][0])


def test_subclasses_layouts_and_object_dtypes_are_copied():
    """§3 rule 1: only an exact, C-contiguous, aligned, writeable, reference-free ndarray
    that owns its memory may be handed over; anything else is copied."""
    class Sub(np.ndarray):
        pass

    def unaligned():
        raw = np.zeros(8 * 4 + 1, np.uint8)
        return np.ndarray((4,), np.float64, buffer=raw, offset=1)   # base, unaligned

    def ro():
        a = np.ones(4)
        a.flags.writeable = False
        return a

    makers = [lambda: np.ones(4).view(Sub), lambda: np.ma.masked_array(np.ones(4)),
              lambda: np.ones((3, 4), order="F"), ro, unaligned,
              lambda: np.array([1, "x", None], dtype=object)]

    def src():
        for make in makers:
            yield make()
    out, s = run(src())
    assert s.leaves_handed_over == 0 and s.leaves_copied == len(makers)
    assert type(out[0]) is Sub and isinstance(out[1], np.ma.MaskedArray)
    assert out[2].flags.c_contiguous and out[3].flags.writeable


def test_arrays_inside_object_arrays_and_passed_through_objects():
    """§3: an object array is copied element by element (same referenced objects, the
    element arrays are not leaves); a passed-through object is the same object (the one
    exception to rule 1). Nothing inside either is handed over or replaced."""
    class Holder:
        def __init__(self, a):
            self.a = a

    def make(i):
        obj = np.empty(2, dtype=object)
        obj[0], obj[1] = np.full(3, i), i
        return (obj, Holder(np.full(3, i)))
    out, s = run(make(i) for i in range(2))
    assert s.leaves_handed_over == 0 and s.leaves_copied == 2
    for i, (obj, h) in enumerate(out):
        assert obj.dtype == object and int(obj[0][0]) == i and type(h) is Holder


def test_arrays_sharing_memory_with_a_framework_tensor_are_copied():
    """§3 rule 1: numpy arrays whose memory a torch tensor also reaches (from_numpy keeps
    the array, .numpy() and DLPack give arrays with a base) are copied."""
    torch = pytest.importorskip("torch")
    tensors = []

    def shared_with_tensor(i):
        a = np.full(6, i, np.float32)
        tensors.append(torch.from_numpy(a))
        return a

    def numpy_of_tensor(i):
        t = torch.full((6,), float(i))
        tensors.append(t)
        return t.numpy()

    def from_dlpack(i):
        t = torch.full((6,), float(i))
        tensors.append(t)
        return np.from_dlpack(t)

    makers = [shared_with_tensor, numpy_of_tensor, from_dlpack]
    out, s = run(make(i) for i, make in enumerate(makers))
    assert s.leaves_handed_over == 0 and s.leaves_copied == 3
    for t in tensors:
        t.fill_(-1)
    assert [float(b[0]) for b in out] == [0.0, 1.0, 2.0]


# -- registered leaves: the adapter's exclusive() hook ---------------------------

class Box:
    """A toy framework array: wraps a numpy array."""

    def __init__(self, a, shared=False):
        self.a = a
        self.shared = shared
        self.nbytes = a.nbytes


def test_a_registered_leaf_is_handed_over_only_when_sole_and_exclusive():
    """§3 rule 1 (issue 13 item 5): a registered leaf is handed over only when the core
    proves that only the batch holds it AND its adapter's exclusive(leaf) returns True;
    otherwise its copy() runs. Without an exclusive hook it is always copied."""
    calls = []

    def copy(leaf, plan):
        return Box(plan.array(leaf.a))

    def exclusive(leaf):
        calls.append(leaf)
        return not leaf.shared

    prefetch.register_leaf(Box, copy, exclusive=exclusive)
    try:
        kept = Box(np.full(3, 9))

        def src():
            yield (Box(np.full(3, 1)),)                # sole, exclusive: handed over
            yield (Box(np.full(3, 2), shared=True),)   # sole, not exclusive: copied
            yield (kept,)                              # kept by the source: copied,
        out, s = run(src())                            # exclusive() not even asked
        assert (s.leaves_handed_over, s.leaves_copied) == (1, 2)
        assert s.bytes_handed_over == 24
        assert len(calls) == 2 and all(c is not kept for c in calls)
        assert out[2][0] is not kept and not np.shares_memory(out[2][0].a, kept.a)

        prefetch.register_leaf(Box, copy, exclusive=lambda leaf: 1)   # truthy is not True
        _, s = run((Box(np.full(3, i)),) for i in range(2))
        assert s.leaves_handed_over == 0

        prefetch.register_leaf(Box, copy)   # no hook: always copied
        _, s = run((Box(np.full(3, i)),) for i in range(2))
        assert s.leaves_handed_over == 0 and s.leaves_copied == 2
    finally:
        prefetch.register_leaf(Box, copy)


# -- the property -----------------------------------------------------------------

# How a source builds one leaf, and what it keeps that still reaches its memory.
MODES = ["fresh", "kept", "is_view", "view_kept", "weakref", "memoryview", "frombuffer",
         "twice", "transposed", "readonly", "subclass"]
HOLDERS = ["root", "tuple", "list", "dict", "kept_list", "nested"]


class Sub(np.ndarray):
    pass


def _make(mode, i, reach, size):
    """(leaves to put in the batch, True when they must be handed over)."""
    a = np.full(size, i, np.int32)
    if mode == "fresh":
        return [a], True
    if mode == "kept":
        reach.append(a)
    elif mode == "is_view":
        reach.append(a)
        a = a[1:]
    elif mode == "view_kept":
        reach.append(a[::2])
    elif mode == "weakref":
        reach.append(weakref.ref(a))
    elif mode == "memoryview":
        reach.append(memoryview(a))
    elif mode == "frombuffer":
        reach.append(np.frombuffer(a, np.int32))
    elif mode == "twice":
        return [a, a], False
    elif mode == "transposed":
        a = np.full((2, size), i, np.int32).T
    elif mode == "readonly":
        a.flags.writeable = False
    elif mode == "subclass":
        a = a.view(Sub)
    return [a], False


@settings(max_examples=150, **SETTINGS)
@given(batches=st.lists(st.tuples(st.sampled_from(HOLDERS),
                                  st.lists(st.sampled_from(MODES), min_size=1, max_size=4)),
                        min_size=1, max_size=6),
       size=st.integers(1, 3000), depth=st.integers(1, 3), workers=st.integers(1, 2))
def test_no_batch_shares_memory_with_what_the_source_reaches(batches, size, depth, workers):
    """§3 rule 1: for sources that keep, view, export or weakly reference some of their
    arrays, no yielded batch shares memory with anything the source still reaches, however
    long both are kept; the fresh arrays of fresh containers are handed over (same memory)."""
    reach = []          # everything the source can still reach
    expect = []         # per batch: data addresses that must be handed over

    def build(i, holder, modes):
        leaves, fresh = [], []
        for mode in modes:
            made, handed = _make(mode, i, reach, size)
            leaves += made
            if handed and holder != "kept_list":
                fresh.append(addr(made[0]))
        expect.append(fresh)
        if holder == "root" and len(leaves) == 1:
            return leaves[0]
        if holder in ("root", "tuple"):
            return tuple(leaves)
        if holder == "list":
            return leaves
        if holder == "dict":
            return {f"k{j}": x for j, x in enumerate(leaves)}
        if holder == "nested":
            return ({"a": leaves}, [i])
        reach.append(leaves)   # kept_list: the source keeps the list it yields
        return leaves

    def src():
        for i, (holder, modes) in enumerate(batches):
            yield build(i, holder, modes)

    with Prefetcher(src(), depth=depth, workers=workers) as p:
        out = list(p)
        s = p.stats()
    # No gc.collect() (most of this test's time): an array a cycle still keeps alive is
    # checked like any other one the source reaches, which asks more, not less.
    reachable = []
    for r in reach:
        r = r() if isinstance(r, weakref.ref) else r
        if r is None:
            continue
        reachable += r if isinstance(r, list) else [r]
    for b, fresh in zip(out, expect):
        got = _leaves(b)
        handed = {addr(x) for x in got} & set(fresh)
        assert handed == set(fresh), (b, fresh)
        for x in got:
            for r in reachable:
                assert not np.shares_memory(x, np.asarray(r)), (x, r)
    assert s.leaves_handed_over == sum(len(f) for f in expect)
    assert s.leaves_handed_over + s.leaves_copied == sum(len(_leaves(b)) for b in out)



@pytest.mark.parametrize("keep", ["ctypes.data", "__array_interface__"])
def test_a_source_writing_through_a_kept_raw_address_needs_copy_always(keep):
    """§3 rule 1 (issue 18 item 11): a raw address holds no reference, so no proof
    sees it: with copy="auto" the array is handed over and the source's later
    write through the address lands in the batch (the documented limit).
    copy="always" protects such a source: the copy is made while the source's
    array is alive, so the batch's memory lies outside the source's address range."""
    nbytes = 1000 * 4
    kept = []

    def fresh(i):
        a = np.full(1000, i, np.float32)
        kept.append(a.ctypes.data if keep == "ctypes.data" else dict(a.__array_interface__)["data"][0])
        return a

    def src(i):
        yield fresh(i)

    (b,), s = run(src(1))
    assert s.leaves_handed_over == 1 and addr(b) == kept[0]
    ctypes.memset(kept[0], 0, nbytes)       # b keeps that memory alive: a safe write
    assert not b.any()                      # the hole copy="auto" cannot see

    (b,), s = run(src(2), copy="always")
    assert s.leaves_handed_over == 0 and s.leaves_copied == 1
    lo = addr(b)
    assert lo + nbytes <= kept[1] or lo >= kept[1] + nbytes
    assert (b == 2).all()
