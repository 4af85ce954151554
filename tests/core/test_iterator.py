"""Prefetcher yields what the source yields, in order, as fresh copies (SPEC §2, §3)."""
import collections
import dataclasses
import itertools
import weakref

import numpy as np
import pytest

import prefetch
from prefetch import Prefetcher
from support import RefillingSource


@pytest.mark.parametrize("depth,workers", [(1, 1), (2, 1), (4, 2), (7, 4), (64, 2)])
def test_order_and_completeness_over_10k_batches(depth, workers):
    """§2: every batch exactly once, in order, for any depth and worker count."""
    n = 10_000
    src = ((np.array([i, -i]), i) for i in range(n))
    with Prefetcher(src, depth=depth, workers=workers) as p:
        got = [(int(a[0]), int(a[1]), i) for a, i in p]
    assert got == [(i, -i, i) for i in range(n)]


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_refilled_buffer_kept_with_list_yields_distinct_correct_batches(workers):
    """§3 rule 3: a source refilling one buffer, consumed with list()."""
    src = RefillingSource(50, shape=(300, 1000))  # 1.2 MB: large enough to split across workers
    got = list(Prefetcher(src, depth=3, workers=workers))
    assert len(got) == 50
    for i, (buf, extra) in enumerate(got):
        want_buf, want_label = src.expected(i)
        np.testing.assert_array_equal(buf, want_buf)
        np.testing.assert_array_equal(extra["label"], want_label)
        assert extra["i"] == i


def test_batch_shares_no_memory_with_source():
    """§3 rule 1."""
    arrays = [np.arange(100).reshape(10, 10) for _ in range(5)]
    with Prefetcher([(a, a[::2], a.T) for a in arrays], depth=2) as p:
        for batch, a in zip(p, arrays):
            for out in batch:
                assert not np.shares_memory(out, a)


def test_source_mutation_after_next_does_not_change_batch():
    """§1/§3: nothing the source does afterwards can change a yielded batch."""
    buf = np.zeros(10)

    def src():
        for i in range(5):
            buf[:] = i
            yield buf
            buf[:] = -1  # scribble after handing it out

    with Prefetcher(src(), depth=1) as p:
        for i, b in enumerate(p):
            np.testing.assert_array_equal(b, np.full(10, i))


def test_held_batch_is_never_rewritten():
    """§3 rule 2: batches kept by the user stay intact while the stream goes on."""
    with Prefetcher((np.full(1000, i) for i in range(300)), depth=2) as p:
        kept = [next(p) for _ in range(3)]
        for _ in p:
            pass
    for i, b in enumerate(kept):
        np.testing.assert_array_equal(b, np.full(1000, i))


def test_blocks_are_reused_only_after_the_user_drops_them():
    """§3 rule 2 and §5: the pool recycles dropped batches; no new allocation in steady state.
    (copy="always": fresh arrays would be handed over, §3 rule 1, and never touch the pool.)"""
    n = 400
    with Prefetcher((np.full(4096, i % 256, np.uint8) for i in range(n)), depth=2,
                    copy="always") as p:
        ptrs = set()
        for i, b in enumerate(p):
            assert b[0] == i % 256
            ptrs.add(b.__array_interface__["data"][0])
            del b
        s = p.stats()
    assert s.produced == s.consumed == n
    assert s.blocks_allocated + s.blocks_reused == n
    assert s.blocks_allocated <= 2 + 3  # depth + the batch being filled + the one held
    assert len(ptrs) == s.blocks_allocated


def test_hoarded_batches_stay_valid_and_distinct():
    got = list(Prefetcher((np.full(100, i) for i in range(100)), depth=4))
    ptrs = {b.__array_interface__["data"][0] for b in got}
    assert len(ptrs) == 100
    assert [int(b[0]) for b in got] == list(range(100))


def test_dropped_batch_is_collected_not_held_by_prefetcher():
    """§3 rule 2 (weakref, after CPython's test_references)."""
    class Holder:
        pass

    with Prefetcher(((np.zeros(3), Holder()) for _ in range(1)), depth=1) as p:
        b = next(p)
        ref = weakref.ref(b[1])
        del b
        assert ref() is None


DTYPE_CASES = {
    "float32": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    "float16": np.linspace(0, 1, 10, dtype=np.float16),
    "bool": np.array([True, False, True]),
    "bigendian": np.arange(10, dtype=">i4"),
    "complex": np.arange(6, dtype=np.complex128) * 1j,
    "structured": np.array([(1, 2.0, b"ab"), (3, 4.0, b"cd")], dtype=[("a", "<i2"), ("b", ">f8"), ("c", "S2")]),
    "subarray_struct": np.zeros(3, dtype=[("v", "f4", (3,))]),
    "datetime": np.array(["2024-01-01", "2025-06-30"], dtype="M8[D]"),
    "unicode": np.array(["a", "bcd"]),
    "zero_d": np.array(3.5),
    "empty": np.zeros((0, 5)),
    "strided": np.arange(100.0).reshape(10, 10)[::3, 1::2],
    "transposed": np.arange(12).reshape(3, 4).T,
    "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    "negative_stride": np.arange(10)[::-1],
    "readonly": np.frombuffer(b"abcdefgh", dtype=np.uint8),
    "broadcast": np.broadcast_to(np.arange(4), (3, 4)),
}


@pytest.mark.parametrize("name", sorted(DTYPE_CASES))
def test_every_dtype_and_layout_copied_exactly(name):
    """§3: same shape, dtype and values; C-contiguous, writeable, not aliased."""
    a = DTYPE_CASES[name]
    with Prefetcher([a], depth=1) as p:
        (b,) = list(p)
    assert type(b) is np.ndarray
    assert b.shape == a.shape and b.dtype == a.dtype
    np.testing.assert_array_equal(b, a)
    assert b.flags.c_contiguous and b.flags.writeable
    assert not np.shares_memory(a, b)


def test_object_array_copied_element_by_element():
    """§3: a new object array referencing the same objects."""
    items = [object(), [1, 2], "s"]
    a = np.empty(3, dtype=object)
    a[:] = items
    with Prefetcher([a]) as p:
        (b,) = list(p)
    assert b is not a and b.dtype == object
    assert all(x is y for x, y in zip(b, items))
    a[0] = None
    assert b[0] is items[0]


def test_string_dtype_copied():
    if not hasattr(getattr(np, "dtypes", None), "StringDType"):
        pytest.skip("numpy < 2 has no StringDType (the mxnet environment pins numpy 1.23.5)")
    a = np.array(["alpha", "a much longer string than sixteen bytes"], dtype=np.dtypes.StringDType())
    with Prefetcher([a]) as p:
        (b,) = list(p)
    del a
    assert list(b) == ["alpha", "a much longer string than sixteen bytes"]


def test_ndarray_subclass_keeps_type_and_mask():
    m = np.ma.masked_array([1, 2, 3], mask=[0, 1, 0])
    with Prefetcher([m]) as p:
        (b,) = list(p)
    assert type(b) is np.ma.MaskedArray
    assert list(b.mask) == [False, True, False] and not np.shares_memory(b.data, m.data)


Point = collections.namedtuple("Point", "x y")


@dataclasses.dataclass
class Sample:
    image: np.ndarray
    label: int
    meta: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: np.ndarray


class MyList(list):
    pass


def test_nested_structure_and_container_types_preserved():
    """§3: the output has the same structure and container types."""
    x = np.arange(6)
    batch = {
        "t": (x, [x, {"deep": x}]),
        "nt": Point(x, 3),
        "dc": Sample(x, 7, {"k": x}),
        "frozen": Frozen(x),
        "od": collections.OrderedDict([("b", x), ("a", 1)]),
        "dd": collections.defaultdict(list, {"v": x}),
        "ml": MyList([x, "s"]),
        "plain": (None, 1.5, "str", b"bytes"),
    }
    with Prefetcher([batch]) as p:
        (out,) = list(p)
    assert type(out["nt"]) is Point and out["nt"].y == 3
    assert type(out["dc"]) is Sample and out["dc"].label == 7
    assert type(out["frozen"]) is Frozen
    assert type(out["od"]) is collections.OrderedDict and list(out["od"]) == ["b", "a"]
    assert type(out["dd"]) is collections.defaultdict and out["dd"].default_factory is list
    assert type(out["ml"]) is MyList
    assert out["plain"] == (None, 1.5, "str", b"bytes")
    arrays = [out["t"][0], out["t"][1][0], out["t"][1][1]["deep"], out["nt"].x, out["dc"].image,
              out["dc"].meta["k"], out["frozen"].a, out["od"]["b"], out["dd"]["v"], out["ml"][0]]
    for a in arrays:
        np.testing.assert_array_equal(a, x)
        assert not np.shares_memory(a, x)
    # plain leaves pass through as the same object (the documented exception)
    assert out["plain"][2] is batch["plain"][2]


def test_batches_that_change_structure_dtype_and_shape(rand):
    """Each batch stands alone."""
    def make(i):
        shape = tuple(rand.randrange(0, 5) for _ in range(rand.randrange(0, 4)))
        dtype = rand.choice([np.int8, np.float64, ">u2", np.bool_])
        arr = (np.arange(int(np.prod(shape)), dtype=np.int64) % 2).astype(dtype).reshape(shape)
        return rand.choice([lambda: arr, lambda: (arr, i), lambda: {"a": [arr]}])()

    batches = [make(i) for i in range(300)]
    with Prefetcher(batches, depth=3, workers=2) as p:
        got = list(p)
    assert len(got) == len(batches)
    for want, have in zip(batches, got):
        flat_w, flat_h = _flatten(want), _flatten(have)
        assert len(flat_w) == len(flat_h)
        for a, b in zip(flat_w, flat_h):
            if isinstance(a, np.ndarray):
                assert a.dtype == b.dtype and a.shape == b.shape
                np.testing.assert_array_equal(a, b)
            else:
                assert a == b


def _flatten(x):
    if isinstance(x, (list, tuple)):
        return list(itertools.chain.from_iterable(_flatten(y) for y in x))
    if isinstance(x, dict):
        return _flatten(list(x.values()))
    return [x]


def test_large_batch_split_across_workers_is_exact():
    """§2 workers: a 24 MiB leaf copied by 3 threads equals the source."""
    a = np.random.default_rng(0).integers(0, 2**63, size=3 << 20, dtype=np.uint64)
    with Prefetcher([a, a[::-1].copy()], depth=1, workers=3) as p:
        b0, b1 = list(p)
    assert np.array_equal(b0, a) and np.array_equal(b1, a[::-1])


def test_iter_returns_self_and_len_follows_source():
    """§2: iter(p) is p; len(p) when the source has a length."""
    with Prefetcher([1, 2, 3]) as p:
        assert iter(p) is p
        assert len(p) == 3
        assert list(p) == [1, 2, 3]
    with Prefetcher(iter([1])) as p:
        with pytest.raises(TypeError, match="no len"):
            len(p)


@pytest.mark.parametrize("copy", ["auto", "always"])
def test_stats_snapshot_counts_batches_bytes_and_fill(copy):
    """§2 stats(): frozen, with produced/consumed/bytes and fill never above depth; fresh
    arrays are handed over by default (§3 rule 1), copied with copy="always"."""
    n, depth = 200, 3
    with Prefetcher((np.zeros(128, np.uint8) for _ in range(n)), depth=depth, copy=copy) as p:
        for _ in p:
            pass
        s = p.stats()
    assert isinstance(s, prefetch.Stats)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.produced = 0
    assert s.produced == s.consumed == n
    handed = copy == "auto"
    assert s.bytes_copied == (0 if handed else 128 * n)
    assert s.bytes_handed_over == (128 * n if handed else 0)
    assert (s.leaves_copied, s.leaves_handed_over) == ((0, n) if handed else (n, 0))
    assert 1 <= s.peak_fill <= depth and s.fill == 0
    assert s.consumer_wait_s >= 0 and s.producer_wait_s >= 0


def test_fill_counts_batches_ready_and_never_exceeds_depth():
    """§2: fill is what is ready now; the producer stops at depth.

    The producer takes a free slot before it calls next(source), so when the
    source is asked for batch 3, batches 0-2 filled the ring (peak 3) and one
    was consumed (fill 2)."""
    from support import BlockingSource
    src = BlockingSource(ready=3, then=[np.zeros(3)])
    with Prefetcher(src, depth=3) as p:
        next(p)
        src.entered.wait()
        s = p.stats()
        assert (s.fill, s.peak_fill, s.produced, s.consumed) == (2, 3, 3, 1)
        src.release.set()
        assert len(list(p)) == 3


def test_max_bytes_bounds_buffered_bytes_but_delivers_big_batch_alone():
    """§2 max_bytes: with a cap of 2.5 batches, at most 2 are buffered; a batch
    larger than the cap still comes through."""
    small = [np.zeros(1000, np.uint8) for _ in range(20)]
    big = np.ones(10_000, np.uint8)
    with Prefetcher(small + [big] + small, depth=10, max_bytes=2500) as p:
        got = list(p)
        s = p.stats()
    assert len(got) == 41 and got[20].sum() == 10_000
    assert s.peak_fill <= 2


@pytest.mark.timeout(30)
def test_max_bytes_waits_for_room_before_it_copies_a_batch():
    """§2 max_bytes, §5: the producer waits for room for a batch's bytes before
    it copies it, so what is held ahead (the ring and the batch being copied)
    stays under the cap. With 1 MiB batches and a cap of 1.5 MiB, a consumer
    that takes nothing finds one batch copied, the second pulled and waiting,
    not copied on top (2 MiB held)."""
    mib = 1 << 20
    pulled = []

    def held(s):   # a fresh array the source keeps no reference to is handed over, not copied
        return s.bytes_copied + s.bytes_handed_over

    def source():
        for i in range(4):
            pulled.append(i)
            yield np.full(mib, i, np.uint8)

    with Prefetcher(source(), depth=4, max_bytes=mib + mib // 2) as p:
        # Until the publisher stands still: batch 2 pulled and waiting for
        # room, or (over the cap) copied.
        while held(p.stats()) <= mib and not (
                len(pulled) == 2 and "waiting for room under max_bytes" in p._core._doing_text()):
            pass
        s = p.stats()
        assert (held(s), s.fill, len(pulled)) == (mib, 1, 2), s
        got = [int(b[0]) for b in p]
    assert got == [0, 1, 2, 3]


def test_repr_shows_name_depth_fill_and_state():
    p = Prefetcher([1], depth=2, name="train")
    assert "name='train'" in repr(p) and "depth=2" in repr(p) and "state=running" in repr(p)
    p.close()
    assert "state=closed" in repr(p)


def test_two_consumer_threads_share_one_prefetcher_each_batch_once():
    """§2: consumers calling next() from several threads at once are served in
    turn (as from a queue.Queue): every batch exactly once, none lost or twice."""
    import threading

    n = 3000
    got = [[], [], []]
    errors = []

    def slow_source():
        for i in range(n):
            if i % 50 == 0:
                threading.Event().wait(0.001)   # the ring runs empty: consumers wait without the GIL
            yield np.full(4, i)

    with Prefetcher(slow_source(), depth=3) as p:
        def consume(out):
            try:
                for batch in p:
                    out.append(int(batch[0]))
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        threads = [threading.Thread(target=consume, args=(out,)) for out in got]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert sorted(sum(got, [])) == list(range(n))
    assert all(out == sorted(out) for out in got)   # each thread sees the stream in order
