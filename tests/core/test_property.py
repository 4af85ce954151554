"""Property-based tests (hypothesis) of SPEC §2 and §3.

For random streams of random batches (nested tuple/list/dict/namedtuple/
dataclass/subclassed containers, with instance state in attributes and slots,
dataclass variants (slots, frozen, InitVar, init=False set or not), struct
sequences, container types made per batch; array leaves of every dtype family, both byte
orders, 0-d, empty, strided, transposed, negative-stride, broadcast and
read-only layouts, from 0 B to tens of MiB; plain leaves), random depth,
workers and max_bytes, the prefetched stream equals a reference copy taken when
the source yielded each batch: in order, exactly once, same structure and
types, never sharing memory with anything the source returned, and unchanged
however long the consumer keeps it while the source scribbles over its own
buffers. Batches that contain themselves, and nesting up to and past
MAX_NESTING, end in the right batches or a ValueError in the consumer (§4).

Hypothesis shrinks and prints any failing example; replay one with
``--hypothesis-seed=N``. Deadlines are off (timings vary with the machine) and
example counts are sized so this file runs well under a minute on two cores.
"""
import collections
import dataclasses
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from prefetch import Prefetcher
from prefetch._core import MAX_NESTING

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                      HealthCheck.function_scoped_fixture])

Pair = collections.namedtuple("Pair", "first second")


pytestmark = pytest.mark.full  # the long tier (tests/run.sh --full)


@dataclasses.dataclass
class Record:
    x: object
    y: object = None


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: object


class MyList(list):
    pass


class MyDict(dict):
    pass


# Containers with state besides their items (SPEC §3: kept, arrays in it copied).

class StateList(list):
    """Attributes in an instance __dict__."""


class SlotDict(dict):
    __slots__ = ("meta",)


class Span(tuple):
    """Positional __new__ (must not be called again to rebuild)."""

    def __new__(cls, a, b):
        return super().__new__(cls, (a, b))


class LabelledPair(Pair):
    """A namedtuple subclass with a __dict__."""


@dataclasses.dataclass(slots=True)
class SlotRecord:
    x: object
    later: object = dataclasses.field(init=False)


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenSlots:
    x: object


@dataclasses.dataclass
class WithInitVar:
    x: object
    scale: dataclasses.InitVar[int] = 1
    cache: object = dataclasses.field(init=False)

    def __post_init__(self, scale):
        self.scaled = scale     # a non-field attribute


def with_state(obj, value, name="extra"):
    """`obj` with an attribute (or slot) holding `value`."""
    object.__setattr__(obj, name, value)
    return obj


def fresh_namedtuple(a, b):
    """A namedtuple of a type made for this batch alone (types made per batch, §5)."""
    return collections.namedtuple("Fresh", "a b")(a, b)


def fresh_dataclass(a):
    return dataclasses.make_dataclass("FreshRecord", ["a"])(a)


def struct_times():
    """time.struct_time with random visible and hidden fields (tm_zone, tm_gmtoff)."""
    return st.builds(lambda v, zone, off: time.struct_time(tuple(v), {"tm_zone": zone, "tm_gmtoff": off}),
                     st.lists(st.integers(-9, 3000), min_size=9, max_size=9), st.text(max_size=4),
                     st.integers(-50000, 50000))


class Tagged(np.ndarray):
    """An ndarray subclass: copies keep the type (SPEC §3)."""


# ---------------------------------------------------------------------------
# Leaves.

SCALAR_DTYPES = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="?"),
    hnp.unsigned_integer_dtypes(endianness="?"),
    hnp.floating_dtypes(endianness="?", sizes=(16, 32, 64)),
    hnp.complex_number_dtypes(endianness="?"),
    hnp.datetime64_dtypes(endianness="?"),
    hnp.timedelta64_dtypes(endianness="?"),
    hnp.byte_string_dtypes(max_len=5),
    hnp.unicode_string_dtypes(endianness="?", max_len=3),
)
DTYPES = st.one_of(
    SCALAR_DTYPES,
    hnp.array_dtypes(subtype_strategy=SCALAR_DTYPES, min_size=1, max_size=3),   # structured
    st.builds(lambda base, n: np.dtype((base, (n,))), SCALAR_DTYPES, st.integers(1, 3)).map(
        lambda d: np.dtype([("sub", d)])),                                      # sub-array field
)


@st.composite
def layouts(draw, base):
    """A view of `base` in a random memory layout (the source keeps `base`)."""
    a = base
    kind = draw(st.sampled_from(["as-is", "transpose", "step", "reverse", "fortran", "broadcast",
                                 "readonly", "subclass"]))
    if kind == "transpose" and a.ndim >= 2:
        a = a.T
    elif kind == "step" and a.ndim >= 1:
        a = a[tuple(slice(None, None, draw(st.integers(1, 3))) for _ in range(a.ndim))]
    elif kind == "reverse" and a.ndim >= 1:
        a = a[::-1]
    elif kind == "fortran":
        a = np.asfortranarray(a)
    elif kind == "broadcast":
        a = np.broadcast_to(a, (draw(st.integers(0, 3)),) + a.shape)         # 0-stride, read-only
    elif kind == "readonly":
        a = a.view()
        a.flags.writeable = False
    elif kind == "subclass":
        a = a.view(Tagged)
    return a


small_arrays = hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)).flatmap(layouts)


@st.composite
def object_arrays(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3))
    a = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        a[idx] = draw(st.one_of(st.integers(), st.text(max_size=3), st.builds(object), st.none()))
    return draw(layouts(a))


PATTERN = (np.arange(4093) % 251).astype(np.uint8)     # a prime period: offsets show


@st.composite
def large_arrays(draw, max_log2=25):
    """1 KiB .. 32 MiB (log-uniform), contiguous or strided, either byte order."""
    e = draw(st.integers(10, max_log2))
    nbytes = draw(st.integers(1 << (e - 1), 1 << e))
    dtype = np.dtype(draw(st.sampled_from(["u1", "<f4", ">f4", "<i8", ">u2"])))
    n = nbytes // dtype.itemsize
    a = np.resize(PATTERN, n * dtype.itemsize).view(dtype)
    layout = draw(st.sampled_from(["contiguous", "2-d strided", "step"]))
    if layout == "2-d strided" and n % 2 == 0:
        a = a.reshape(2, -1)[:, ::2]
    elif layout == "step":
        a = a[::3]
    return a


def big_batches():
    return st.one_of(
        large_arrays(),
        st.tuples(large_arrays(), batches(max_leaves=3)),
        st.dictionaries(st.sampled_from("abc"), large_arrays(), min_size=1, max_size=2),
    )


PLAIN = st.one_of(st.integers(), st.text(max_size=4), st.binary(max_size=4), st.none(),
                  st.builds(object), st.floats(allow_nan=False))


def leaves():
    return st.one_of(small_arrays, object_arrays(), PLAIN, struct_times())


def batches(max_leaves=8):
    def extend(children):
        return st.one_of(
            st.tuples(children, children),
            st.lists(children, max_size=3),
            st.dictionaries(st.text(max_size=3), children, max_size=3),
            st.builds(Pair, children, children),
            st.builds(Record, children, children),
            st.builds(Frozen, children),
            st.lists(children, max_size=3).map(MyList),
            st.dictionaries(st.text(max_size=2), children, max_size=2).map(MyDict),
            st.builds(with_state, st.lists(children, max_size=2).map(StateList), children),
            st.builds(with_state, st.dictionaries(st.text(max_size=2), children, max_size=2).map(SlotDict),
                      children, st.just("meta")),
            st.builds(Span, children, children),
            st.builds(with_state, st.builds(LabelledPair, children, children), children),
            st.builds(SlotRecord, children),
            st.builds(with_state, st.builds(SlotRecord, children), children, st.just("later")),
            st.builds(FrozenSlots, children),
            st.builds(WithInitVar, children, st.integers(0, 3)),
            st.builds(with_state, st.builds(WithInitVar, children), children, st.just("cache")),
            st.builds(with_state, st.builds(Record, children), children),
            st.builds(fresh_namedtuple, children, children),
            st.builds(fresh_dataclass, children),
        )
    return st.recursive(leaves(), extend, max_leaves=max_leaves)


CONFIG = dict(
    depth=st.integers(1, 8),
    workers=st.integers(1, 4),
    max_bytes=st.one_of(st.none(), st.integers(1, 1 << 26)),
)


# ---------------------------------------------------------------------------
# The reference and the checks.

def is_struct_sequence(obj):
    return isinstance(obj, tuple) and hasattr(type(obj), "n_sequence_fields")


def state(obj):
    """[(name, value)]: the instance state of `obj` besides its items (its __dict__
    and every set slot), what SPEC §3 says a rebuilt container keeps."""
    out = list(vars(obj).items()) if hasattr(obj, "__dict__") else []
    for cls in type(obj).__mro__:
        names = cls.__dict__.get("__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                out.append((name, getattr(obj, name)))
    return out


def flatten(obj, path=()):
    """[(path, leaf)] in a fixed order, containers described in the path."""
    if isinstance(obj, np.ndarray) or is_struct_sequence(obj):
        return [(path, obj)]
    if isinstance(obj, (tuple, list)):
        items = list(enumerate(obj))
    elif isinstance(obj, dict):
        items = list(obj.items())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items = []
    else:
        return [(path, obj)]
    if type(obj) not in (tuple, list, dict):
        items += [("." + name, value) for name, value in state(obj)]
    out = []
    for key, value in items:
        out += flatten(value, path + ((type(obj), key),))
    return out


def snapshot(batch):
    """What the prefetched copy of `batch` must be: per leaf its path, type and, for
    arrays, a C-order copy of its contents (taken now, before the source reuses it)."""
    out = []
    for path, leaf in flatten(batch):
        if isinstance(leaf, np.ndarray):
            out.append((path, type(leaf), np.array(leaf, copy=True, order="C")))
        else:
            out.append((path, type(leaf), leaf))
    return out


def check_batch(got, want, sources):
    """`got` matches the snapshot `want` and shares no memory with any of `sources`."""
    leaves = flatten(got)
    assert [p for p, _ in leaves] == [p for p, _, _ in want]
    for (_, out), (_, typ, ref) in zip(leaves, want):
        assert type(out) is typ
        if is_struct_sequence(ref):
            assert out.__reduce__() == ref.__reduce__()   # hidden fields too, exactly
            continue
        if not isinstance(ref, np.ndarray):
            assert out is ref                       # plain leaves pass through (§3)
            continue
        assert out.dtype == ref.dtype and out.shape == ref.shape
        assert out.flags.c_contiguous
        if ref.dtype.hasobject:
            assert all(x is y for x, y in zip(out.ravel(), ref.ravel()))
        else:
            assert out.tobytes() == ref.tobytes()    # bit-exact: NaN payloads, byte order
        for src in sources:
            if np.may_share_memory(out, src):
                assert not np.shares_memory(out, src)


def source_arrays(batch):
    return [leaf for _, leaf in flatten(batch) if isinstance(leaf, np.ndarray)]


def scribble(arrays):
    """Overwrite the source's writeable buffers (what a refilling loader does)."""
    for a in arrays:
        if a.flags.writeable and a.size and not a.dtype.hasobject:
            if a.flags.c_contiguous:
                a.reshape(-1).view(np.uint8).fill(0xA5)
            else:
                np.copyto(a, np.zeros((), a.dtype), casting="unsafe")


def scribbling_source(stream, log):
    """Yields each batch of `stream`, snapshotting it first; after the consumer moved
    on (the next next()), overwrites the arrays it handed out."""
    for batch in stream:
        log.append((snapshot(batch), source_arrays(batch)))
        yield batch
        scribble(log[-1][1])


def run_and_check(stream, depth, workers, max_bytes, keep_all):
    log = []
    with Prefetcher(scribbling_source(stream, log), depth=depth, workers=workers,
                    max_bytes=max_bytes) as p:
        got = []
        for i, out in enumerate(p):
            if keep_all:
                got.append(out)                     # checked at the end: rule 2 under reuse
            else:
                check_batch(out, log[i][0], log[i][1])
        stats = p.stats()
    assert len(log) == len(stream) and stats.produced == stats.consumed == len(stream)
    if keep_all:
        assert len(got) == len(stream)
        all_sources = [a for _, arrays in log for a in arrays]
        for out, (want, _) in zip(got, log):
            check_batch(out, want, all_sources)
    return stats


# ---------------------------------------------------------------------------
# Properties.

@settings(max_examples=300, **SETTINGS)
@given(stream=st.lists(batches(), max_size=6), keep_all=st.booleans(), **CONFIG)
def test_stream_equals_reference_copies_in_order_exactly_once(stream, depth, workers, max_bytes, keep_all):
    """§2/§3: any stream of small batches comes out equal to reference copies, in order,
    exactly once, with the same containers and dtypes, sharing no memory with the source."""
    run_and_check(stream, depth, workers, max_bytes, keep_all)


@settings(max_examples=40, **SETTINGS)
@given(stream=st.lists(big_batches(), min_size=1, max_size=3), keep_all=st.booleans(),
       **CONFIG)
def test_large_batches_equal_reference_copies(stream, depth, workers, max_bytes, keep_all):
    """§3: batches up to tens of MiB, split across workers, under a byte cap."""
    run_and_check(stream, depth, workers, max_bytes, keep_all)


@settings(max_examples=80, **SETTINGS)
@given(base=large_arrays(max_log2=22), n=st.integers(1, 12), keep=st.integers(0, 12), **CONFIG)
def test_refilled_buffer_batches_are_distinct_and_held_ones_never_change(base, n, keep, depth, workers,
                                                                         max_bytes):
    """§3 rules 2 and 3: a source refilling one buffer in place; the consumer keeps some
    batches (views of them, even) while the pool recycles the rest."""
    buf = np.array(base)        # writeable, owned

    def src():
        for i in range(n):
            buf.view(np.uint8)[...] = i
            yield buf

    kept = []
    with Prefetcher(src(), depth=depth, workers=workers, max_bytes=max_bytes) as p:
        for i, out in enumerate(p):
            assert not np.shares_memory(out, buf)
            if i < keep:
                kept.append((i, out.reshape(-1)[1:]))   # a view keeps the block alive
    for i, view in kept:
        assert (view.view(np.uint8) == i).all()


@settings(max_examples=100, **SETTINGS)
@given(sizes=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=40), **CONFIG)
def test_stats_count_every_batch_and_byte(sizes, depth, workers, max_bytes):
    """§2: produced/consumed count batches, bytes_copied + bytes_handed_over their bytes
    (§3 rule 1: fresh arrays are handed over); fill and peak_fill never exceed depth."""
    with Prefetcher((np.ones(s, np.uint8) for s in sizes), depth=depth, workers=workers,
                    max_bytes=max_bytes) as p:
        for _ in p:
            s = p.stats()
            assert 0 <= s.fill <= s.peak_fill <= depth
        s = p.stats()
    assert s.produced == s.consumed == len(sizes)
    assert s.bytes_copied + s.bytes_handed_over == sum(sizes)
    assert s.leaves_copied + s.leaves_handed_over == len(sizes)
    assert s.peak_fill <= depth


@settings(max_examples=100, **SETTINGS)
@given(sizes=st.lists(st.integers(1, 1 << 20), min_size=1, max_size=30), depth=st.integers(1, 6),
       cap=st.integers(1, 1 << 21))
def test_max_bytes_bounds_what_is_buffered(sizes, depth, cap):
    """§2/§5: the batches waiting in the ring never add up to more than max_bytes, except
    a single batch larger than the cap, which is still delivered, alone."""
    with Prefetcher((np.zeros(s, np.uint8) for s in sizes), depth=depth, max_bytes=cap) as p:
        got = []
        for _ in range(len(sizes) + 1):
            fill = p.stats().fill                   # a consistent snapshot, under the GIL
            buffered = sizes[len(got):len(got) + fill]
            assert fill <= depth and (fill <= 1 or sum(buffered) <= cap), (fill, buffered, cap)
            if len(got) < len(sizes):
                got.append(next(p).size)
    assert got == sizes


# ---------------------------------------------------------------------------
# Hostile structures: cycles and depth (SPEC §4: an error in the consumer, never a crash).

def mutable_containers(obj, ancestors=()):
    """[(container, its ancestors)] of every container of `obj` that can be made to
    hold something more (list, dict, or an object with a __dict__)."""
    found = []
    if isinstance(obj, np.ndarray) or is_struct_sequence(obj):
        return found
    if isinstance(obj, (list, dict)) or (hasattr(obj, "__dict__") and not isinstance(obj, type)
                                         and (isinstance(obj, (list, dict, tuple))
                                              or dataclasses.is_dataclass(obj))):
        found.append((obj, ancestors))
    if isinstance(obj, (tuple, list)):
        kids = list(obj)
    elif isinstance(obj, dict):
        kids = list(obj.values())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        kids = []
    else:
        return found
    if type(obj) not in (tuple, list, dict):
        kids += [v for _, v in state(obj)]
    for kid in kids:
        found += mutable_containers(kid, ancestors + (obj,))
    return found


def close_the_loop(container, target):
    """Make `container` reach `target` (itself or one of its ancestors)."""
    if isinstance(container, list):
        list.append(container, target)
    elif isinstance(container, dict):
        dict.__setitem__(container, "loop", target)
    else:
        object.__setattr__(container, "loop", target)


@settings(max_examples=150, **SETTINGS)
@given(stream=st.lists(batches(), min_size=1, max_size=4), data=st.data(), depth=st.integers(1, 4))
def test_batch_containing_itself_raises_after_the_batches_before_it(stream, data, depth):
    """§3/§4: a cycle anywhere (through items, attributes, subclasses or dataclasses)
    raises ValueError in the consumer after the batches before it; the stream ends."""
    k = data.draw(st.integers(0, len(stream) - 1), label="cyclic batch")
    want = [snapshot(b) for b in stream[:k]]
    places = mutable_containers(stream[k])
    if not places:
        stream[k] = [stream[k]]
        places = [(stream[k], ())]
    container, ancestors = data.draw(st.sampled_from(places), label="container")
    close_the_loop(container, data.draw(st.sampled_from(ancestors + (container,)), label="target"))
    with Prefetcher(stream, depth=depth) as p:
        for i in range(k):
            check_batch(next(p), want[i], source_arrays(stream[i]))
        with pytest.raises(ValueError, match="the batch contains itself: batch"):
            next(p)
        with pytest.raises(StopIteration):
            next(p)


WRAPS = [
    (lambda o: [o], lambda o: o[0], list),
    (lambda o: {"k": o}, lambda o: o["k"], dict),
    (lambda o: (o,), lambda o: o[0], tuple),
    (lambda o: Record(o), lambda o: o.x, Record),
    (lambda o: with_state(StateList(), o), lambda o: o.extra, StateList),
    (lambda o: Span(o, 1), lambda o: o[0], Span),
]


# The three bounds are explicit examples, every kind in turn: each run checks each of them
# once (a batch of 10^5 levels is most of this test's time), and the drawn examples mix
# the kinds at depths up to 3,000 (issue 19: the suite's time).
@settings(max_examples=40, **SETTINGS)
@example(kinds=list(range(len(WRAPS))), levels=MAX_NESTING - 1)
@example(kinds=list(range(len(WRAPS))), levels=MAX_NESTING)
@example(kinds=list(reversed(range(len(WRAPS)))), levels=MAX_NESTING + 1)
@given(kinds=st.lists(st.integers(0, len(WRAPS) - 1), min_size=1, max_size=8),
       levels=st.integers(0, 3000))
def test_deep_batches_come_out_whole_up_to_max_depth_and_raise_past_it(kinds, levels):
    """§3/§4: nesting of mixed container kinds is copied whole up to MAX_NESTING levels
    and raises ValueError naming the bound past it; the stream ends either way."""
    x = np.arange(3)
    batch = x
    for i in range(levels):
        batch = WRAPS[kinds[i % len(kinds)]][0](batch)
    with Prefetcher([batch]) as p:
        if levels > MAX_NESTING:
            with pytest.raises(ValueError, match=f"deeper than {MAX_NESTING} levels"):
                next(p)
        else:
            out = next(p)
            for i in reversed(range(levels)):
                _, unwrap, typ = WRAPS[kinds[i % len(kinds)]]
                assert type(out) is typ
                out = unwrap(out)
            assert type(out) is np.ndarray and (out == x).all() and not np.shares_memory(out, x)
        with pytest.raises(StopIteration):
            next(p)
