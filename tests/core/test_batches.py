"""What a batch may be: every class of container a user can build (SPEC §3),
and the hostile ones, each ending in the right batch or a clear error (§4),
never a crash, an aliased array, a silently changed value or a leak (§5).

One test per class of input found in issue 10 (cycles, over-deep nesting,
state outside the items, tuple subclasses, struct sequences, types made per
batch). The README's "What a batch may be" has one line per class.
"""
import collections
import dataclasses
import gc
import os
import time
import weakref

import numpy as np
import pytest

import prefetch
from prefetch import Prefetcher
from prefetch._core import MAX_NESTING, _kinds_size


def copy_of(batch):
    """The one batch of a one-batch stream."""
    with Prefetcher([batch]) as p:
        (out,) = list(p)
    return out


def assert_fresh_copy(out, src):
    """`out` is a copy of array `src`: equal values, no shared memory (§3 rule 1)."""
    assert type(out) is np.ndarray
    np.testing.assert_array_equal(out, src)
    assert not np.shares_memory(out, src)


def stream_ends_with(batches, exc_type, match):
    """§4: the batches before the bad one come out, then its error, then the end;
    afterwards a new prefetcher works."""
    with Prefetcher(batches) as p:
        for i in range(len(batches) - 1):
            np.testing.assert_array_equal(next(p), batches[i])
        with pytest.raises(exc_type, match=match) as info:
            next(p)
        with pytest.raises(StopIteration):
            next(p)
    assert any(f"copying batch {len(batches)} (counted from 1" in n for n in info.value.__notes__)
    x = np.arange(3)
    assert_fresh_copy(copy_of(x), x)
    return info.value


def nest(depth, wrap, leaf):
    for _ in range(depth):
        leaf = wrap(leaf)
    return leaf


def unnest(obj, depth, unwrap):
    """The leaf under `depth` levels, walked without recursion."""
    for _ in range(depth):
        obj = unwrap(obj)
    return obj


# ---------------------------------------------------------------------------
# Cycles (§3: a batch is a tree; §4: the error reaches the consumer).

@dataclasses.dataclass
class Node:
    value: object
    child: object = None


class Attrs(list):
    """A list subclass with instance attributes."""


def test_list_containing_itself_raises_naming_the_path():
    """§3/§4: `b = [x]; b.append(b)` raises ValueError naming where, after the batches
    before it; the stream ends; the process and new prefetchers work."""
    b = [np.zeros(2)]
    b.append(b)
    err = stream_ends_with([np.ones(2), b], ValueError, "contains itself")
    assert "batch[1] is the same list as batch " in str(err)


def test_dict_containing_itself_raises_naming_the_path():
    """§3/§4: a dict holding itself, below the root: the message names both places."""
    d = {"x": np.zeros(1)}
    d["me"] = d
    err = stream_ends_with([np.ones(1), [0, {"x": d}]], ValueError, "contains itself")
    assert "batch[1]['x']['me'] is the same dict as batch[1]['x'] " in str(err)


def test_cycle_through_a_dataclass_raises():
    """§3/§4: a dataclass whose field leads back to it."""
    n = Node(np.zeros(1))
    n.child = [n]
    err = stream_ends_with([np.ones(1), n], ValueError, "contains itself")
    assert "batch.child[0] is the same Node as batch " in str(err)


def test_cycle_through_an_attribute_raises():
    """§3/§4: a cycle through an instance attribute of a list subclass (state is walked)."""
    a = Attrs([np.zeros(1)])
    a.parent = {"a": a}
    err = stream_ends_with([np.ones(1), a], ValueError, "contains itself")
    assert "batch.parent['a'] is the same Attrs as batch " in str(err)


class Box:
    def __init__(self, items):
        self.items = items


prefetch.register_container(Box, lambda b: (b.items, None), lambda aux, kids: Box(kids))


def test_cycle_through_a_registered_container_raises():
    """§3/§4: a cycle through a container type registered with register_container."""
    b = Box([np.zeros(1)])
    b.items.append([b])
    err = stream_ends_with([np.ones(1), b], ValueError, "contains itself")
    assert "batch<child 1>[0] is the same Box as batch " in str(err)


def test_temporaries_made_by_flatten_are_not_mistaken_for_a_cycle():
    """§3: a registered flatten() that returns fresh containers (which die, freeing
    their ids, while the walk goes on) is a tree, not a cycle."""
    class Fresh:
        def __init__(self, depth):
            self.depth = depth

    prefetch.register_container(
        Fresh, lambda f: ([[Fresh(f.depth - 1)] if f.depth else np.zeros(1)], f.depth),
        lambda depth, kids: (depth, kids))
    out = copy_of(Fresh(200))
    assert unnest(out, 200, lambda o: o[1][0][0])[1][0].shape == (1,)


def test_shared_subtrees_are_not_a_cycle():
    """§3: the same sub-batch twice (a DAG) is copied twice, no error."""
    x = np.arange(3)
    s = [x]
    out = copy_of([s, s, {"a": s}])
    for part in (out[0][0], out[1][0], out[2]["a"][0]):
        assert_fresh_copy(part, x)


# ---------------------------------------------------------------------------
# Depth (§4: an over-deep batch is an error, not a crash of the fetch thread).

WRAPS = {
    "list": (lambda o: [o], lambda o: o[0]),
    "dict": (lambda o: {"k": o}, lambda o: o["k"]),
    "tuple": (lambda o: (o,), lambda o: o[0]),
    "dataclass": (Node, lambda o: o.value),
    "list subclass": (lambda o: Attrs([o]), lambda o: o[0]),
}


@pytest.mark.parametrize("kind", ["list", "dict", "tuple"])
def test_200k_levels_raise_value_error_naming_the_depth(kind):
    """§4: 200,000 levels (which overflowed the fetch thread's stack) raise ValueError
    naming MAX_NESTING in the consumer; new prefetchers work afterwards."""
    batch = nest(200_000, WRAPS[kind][0], np.zeros(1))
    err = stream_ends_with([np.ones(1), batch], ValueError, f"deeper than {MAX_NESTING} levels")
    assert f"a {kind} at depth {MAX_NESTING}" in str(err)


@pytest.mark.parametrize("kind", sorted(WRAPS))
def test_max_depth_levels_are_copied_and_dropping_the_copy_is_safe(kind):
    """§3: exactly MAX_NESTING levels come out whole (one more is the error above); dropping
    the rebuilt batch does not overflow the C stack (CPython's trashcan)."""
    wrap, unwrap = WRAPS[kind]
    x = np.arange(4)
    out = copy_of(nest(MAX_NESTING, wrap, x))
    assert_fresh_copy(unnest(out, MAX_NESTING, unwrap), x)
    del out
    gc.collect()
    with pytest.raises(ValueError, match="deeper than"):
        copy_of(nest(MAX_NESTING + 1, wrap, x))


@pytest.mark.parametrize("kind", ["list", "dict", "tuple"])
def test_10k_levels_keep_working(kind):
    """§3: 10,000 levels (deeper than copy.deepcopy or pickle take) are copied."""
    wrap, unwrap = WRAPS[kind]
    x = np.arange(2)
    batches = [nest(10_000, wrap, x) for _ in range(3)]
    with Prefetcher(batches, depth=2) as p:
        for out in p:
            assert_fresh_copy(unnest(out, 10_000, unwrap), x)


# ---------------------------------------------------------------------------
# Dataclasses: the whole instance state, no more, no less (§3).

@dataclasses.dataclass
class Lazy:
    x: object
    cache: object = dataclasses.field(init=False)      # set later, if ever


def test_dataclass_with_unset_init_false_field_leaves_it_unset():
    """§3: a field(init=False) never set (a lazy cache) stays unset; the stream goes on."""
    out = copy_of(Lazy(np.zeros(2)))
    assert type(out) is Lazy and not hasattr(out, "cache")
    done = Lazy(np.zeros(2))
    done.cache = np.ones(3)
    out = copy_of(done)
    assert_fresh_copy(out.cache, done.cache)


@dataclasses.dataclass
class Derived:
    x: object

    def __post_init__(self):
        self.norm = self.x / 2          # not a field: an attribute


def test_dataclass_non_field_attribute_is_copied_not_aliased():
    """§3 rule 1: an array in a non-field attribute set in __post_init__ is copied."""
    d = Derived(np.arange(4.0))
    out = copy_of(d)
    assert_fresh_copy(out.x, d.x)
    assert_fresh_copy(out.norm, d.norm)


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenSlots:
    x: object
    y: object = dataclasses.field(init=False, default=None)
    tag: dataclasses.InitVar[str] = "t"

    def __post_init__(self, tag):
        object.__setattr__(self, "y", np.full(2, len(tag)))


@dataclasses.dataclass(slots=True)
class SlotsUnset:
    x: object
    later: object = dataclasses.field(init=False)


class SlotsChild(SlotsUnset):
    __slots__ = ("__private",)          # name-mangled slot of a subclass


@pytest.mark.parametrize("make", [
    lambda: FrozenSlots(np.arange(3), tag="four"),
    lambda: SlotsUnset(np.arange(3)),
    lambda: SlotsChild(np.arange(3)),
], ids=["frozen-slots-initvar", "slots-init-false-unset", "slots-subclass-private"])
def test_dataclass_variants_keep_every_set_slot_and_leave_unset_ones_unset(make):
    """§3: slots=True, frozen=True, InitVar and init=False dataclasses come out with the
    same type, every set field copied, unset ones unset, __init__/__post_init__ not rerun."""
    src = make()
    if isinstance(src, SlotsChild):
        src._SlotsChild__private = np.ones(2)
    out = copy_of(src)
    assert type(out) is type(src)
    assert_fresh_copy(out.x, src.x)
    for name in ("y", "later", "_SlotsChild__private"):
        if hasattr(src, name):
            assert_fresh_copy(getattr(out, name), getattr(src, name))
        else:
            assert not hasattr(out, name)


# ---------------------------------------------------------------------------
# Subclasses of list, dict and tuple: items exactly, attributes copied (§3).

class Tagged(dict):
    __slots__ = ("__dict__", "meta")

    def __setitem__(self, key, value):  # must not be rerun on the copy
        super().__setitem__(key, ("wrapped", value))


class Backwards(list):
    def __iter__(self):                 # must not be how the items are read
        return reversed(list.__iter__(self))


@pytest.mark.parametrize("make", [
    lambda: Attrs([np.zeros(2), 1]),
    lambda: Backwards([np.zeros(2), 1]),
    lambda: Tagged({"a": np.zeros(2)}),
], ids=["list-subclass", "list-subclass-own-iter", "dict-subclass-slots-and-dict"])
def test_list_and_dict_subclass_state_is_copied_not_aliased(make):
    """§3 rule 1: instance attributes (__dict__ and __slots__) of list and dict subclasses
    are walked: their arrays are copies; the items are the C-level items, unchanged."""
    src = make()
    src.meta = np.arange(3)
    src.extra = {"arr": np.ones(2)}
    out = copy_of(src)
    assert type(out) is type(src)
    assert_fresh_copy(out.meta, src.meta)
    assert_fresh_copy(out.extra["arr"], src.extra["arr"])
    items = list.__iter__(out) if isinstance(out, list) else dict.items(out)
    want = list.__iter__(src) if isinstance(src, list) else dict.items(src)
    assert [type(v) for v in items] == [type(v) for v in want]


class Span(tuple):
    """A tuple subclass whose __new__ takes its fields positionally and normalises them."""

    def __new__(cls, lo, hi):
        return super().__new__(cls, (min(lo, hi), max(lo, hi)))


Point = collections.namedtuple("Point", "x y")


class LabelledPoint(Point):
    """A namedtuple subclass with an instance __dict__."""


def test_tuple_subclass_with_positional_new_is_rebuilt_exactly():
    """§3: a tuple subclass is rebuilt from its items (its __new__ is not called again,
    which needs other arguments and would re-normalise the values)."""
    out = copy_of(Span(3, 1))
    assert type(out) is Span and tuple(out) == (1, 3)


def test_tuple_subclass_attributes_are_kept_and_copied():
    """§3 rule 1: instance attributes of a tuple subclass (a namedtuple's subclass
    here) are kept, their arrays copied."""
    p = LabelledPoint(np.zeros(2), 7)
    p.label = np.arange(3)
    out = copy_of(p)
    assert type(out) is LabelledPoint and out.y == 7
    assert_fresh_copy(out.x, p.x)
    assert_fresh_copy(out.label, p.label)


def test_stdlib_dict_subclasses_keep_their_own_state():
    """§3: OrderedDict order, defaultdict's default_factory and Counter counts survive."""
    x = np.arange(2)
    od = collections.OrderedDict([("b", x), ("a", 1)])
    dd = collections.defaultdict(list, {"k": x})
    out = copy_of((od, dd, collections.Counter("aab")))
    assert type(out[0]) is collections.OrderedDict and list(out[0]) == ["b", "a"]
    assert out[1].default_factory is list
    assert_fresh_copy(out[0]["b"], x)
    assert_fresh_copy(out[1]["k"], x)
    assert out[2] == collections.Counter("aab")


# ---------------------------------------------------------------------------
# Struct sequences: exact, hidden fields included (§3: never a changed value).

def test_struct_time_keeps_its_hidden_fields():
    """§3: time.struct_time comes out equal, tm_zone and tm_gmtoff included."""
    tm = time.localtime()
    out = copy_of([tm])[0]
    assert type(out) is time.struct_time and out == tm
    assert (out.tm_zone, out.tm_gmtoff) == (tm.tm_zone, tm.tm_gmtoff)


def test_stat_result_keeps_float_and_nanosecond_times():
    """§3: os.stat_result keeps st_mtime as the float (not the truncated int of its
    tuple view) and st_mtime_ns."""
    st = os.stat(__file__)
    out = copy_of({"st": st})["st"]
    assert type(out) is os.stat_result and out == st
    for name in ("st_mtime", "st_atime", "st_ctime", "st_mtime_ns", "st_size", "st_mode"):
        assert getattr(out, name) == getattr(st, name), name


# ---------------------------------------------------------------------------
# Types made per batch are not kept alive (§5).

def test_types_made_per_batch_are_collected_after_close():
    """§5: a source that makes a namedtuple, dataclass, list subclass and leaf class per
    batch: after close() and gc.collect() every one is collected, and the classification
    cache is back to its size before."""
    before = _kinds_size()
    refs = []

    def source():
        for i in range(40):
            nt = collections.namedtuple(f"NT{i}", "a b")
            dc = dataclasses.make_dataclass(f"DC{i}", ["x"])
            ls = type(f"LS{i}", (list,), {})
            leaf = type(f"Leaf{i}", (), {})
            refs.extend(weakref.ref(t) for t in (nt, dc, ls, leaf))
            yield nt(np.zeros(2), dc(ls([leaf()])))

    with Prefetcher(source()) as p:
        for out in p:
            assert type(out.b.x[0]).__name__.startswith("Leaf")
    del out, p
    gc.collect()
    alive = [r().__name__ for r in refs if r() is not None]
    assert not alive, f"still alive: {alive[:8]}"
    assert _kinds_size() <= before
