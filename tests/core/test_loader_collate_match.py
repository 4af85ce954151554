"""The default collate of small samples (SPEC §9; issue 36: a dict of scalars
and short lists per sample). Each sample after a batch's first is matched
against the batch's layout leaf by leaf, and numbers are written into their
columns in place; these tests hold that to a reference collate written here,
over random layouts, and to the general walk's errors where a sample differs
(a key order, a leaf's type, a container's length or kind, a deep sample)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefetch import Loader

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])

# A layout: ("int"|"float"|"bool"|"str"|"none"|"bytes"|("array", shape)) at a leaf,
# ("tuple"|"list", [children]) or ("dict", [(key, child)]) at a container.
scalars = st.sampled_from(["int", "float", "bool", "str", "none", "bytes"])
arrays = st.tuples(st.just("array"), st.lists(st.integers(0, 3), max_size=2).map(tuple))
layouts = st.recursive(
    scalars | arrays,
    lambda kids: (st.tuples(st.sampled_from(["tuple", "list"]), st.lists(kids, max_size=4))
                  | st.tuples(st.just("dict"), st.lists(st.tuples(st.text("abcxyz", min_size=1, max_size=3), kids),
                                                        max_size=4, unique_by=lambda kv: kv[0]))),
    max_leaves=10)


def make(layout, r: np.random.Generator):
    """A sample laid out as ``layout``, with random values."""
    if layout == "int":
        return int(r.integers(-2**63, 2**63 - 1, dtype=np.int64))
    if layout == "float":
        return float(r.normal())
    if layout == "bool":
        return bool(r.integers(2))
    if layout == "str":
        return f"s{r.integers(1000)}"
    if layout == "none":
        return None
    if layout == "bytes":
        return bytes(r.integers(0, 256, 3, dtype=np.uint8))
    kind, rest = layout
    if kind == "array":
        return r.normal(size=rest).astype(np.float32)
    if kind == "dict":
        return {k: make(v, r) for k, v in rest}
    items = [make(c, r) for c in rest]
    return tuple(items) if kind == "tuple" else items


def reference(samples):
    """What the default collate gives: row 0's structure, a column per leaf."""
    first = samples[0]
    t = type(first)
    if t is dict:
        return {k: reference([s[k] for s in samples]) for k in first}
    if t in (tuple, list):
        out = [reference([s[j] for s in samples]) for j in range(len(first))]
        return tuple(out) if t is tuple else out
    if t is np.ndarray:
        return np.stack(samples)
    if t in (int, float, bool):
        return np.array(samples, {int: np.int64, float: np.float64, bool: np.bool_}[t])
    return list(samples)


def assert_same(got, want, path="batch"):
    assert type(got) is type(want), (path, type(got), type(want))
    if isinstance(want, dict):
        assert list(got) == list(want), path
        for k in want:
            assert_same(got[k], want[k], f"{path}[{k!r}]")
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want), path
        for j, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}[{j}]")
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        np.testing.assert_array_equal(got, want, err_msg=path)
    else:
        assert got == want, path


def one_batch(samples, workers=1):
    with Loader(samples, batch_size=len(samples), workers=workers) as loader:
        (batch,) = list(loader)
    return batch


@pytest.mark.timeout(120)
@settings(max_examples=150, **SETTINGS)
@given(layout=layouts, n=st.integers(1, 9), seed=st.integers(0, 2**32 - 1), workers=st.integers(1, 2))
def test_random_layouts_equal_the_reference_collate(layout, n, seed, workers):
    r = np.random.default_rng(seed)
    samples = [make(layout, r) for _ in range(n)]
    assert_same(one_batch(samples, workers), reference(samples))


@pytest.mark.timeout(60)
def test_numbers_are_written_exactly_at_their_extremes():
    rows = [{"i": v, "f": f, "b": b} for v, f, b in
            [(-2**63, -np.inf, True), (2**63 - 1, np.nan, False), (0, 5e-324, True), (-1, 1.7976931348623157e308, False)]]
    batch = one_batch(rows)
    np.testing.assert_array_equal(batch["i"], np.array([-2**63, 2**63 - 1, 0, -1], np.int64))
    np.testing.assert_array_equal(batch["f"], np.array([-np.inf, np.nan, 5e-324, 1.7976931348623157e308]))
    np.testing.assert_array_equal(batch["b"], np.array([True, False, True, False]))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("row", [0, 3])
def test_an_int_past_int64_raises_numpys_overflow_error(row):
    rows = [{"i": 1} for _ in range(4)]
    rows[row] = {"i": 2**63}
    with Loader(rows, batch_size=4, workers=1) as loader, pytest.raises(OverflowError):
        list(loader)


@pytest.mark.timeout(60)
def test_another_key_order_is_aligned_to_row_0s():
    rows = [{"a": i, "b": [i, str(i)], "c": np.full(2, i), "x": i, "y": -i} for i in range(4)]
    rows[2] = {"c": np.full(2, 2), "a": 2, "b": [2, "2"], "y": -2, "x": 2}   # x, y: the same types
    rows[3] = {"y": -3, "x": 3, "b": [3, "3"], "c": np.full(2, 3), "a": 3}
    assert_same(one_batch(rows), reference([rows[0], rows[1], {k: rows[2][k] for k in "abcxy"},
                                            {k: rows[3][k] for k in "abcxy"}]))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("odd, message", [
    ({"a": 1.5, "b": [1, "x"]}, r"sample\['a'\] is a float where the batch's first sample has an int"),
    ({"a": 1, "b": (1, "x")}, r"structure differs"),
    ({"a": 1, "b": [1, "x", 2]}, r"3 items where the batch's first sample has 2"),
    ({"a": 1, "b": [[1], "x"]}, r"structure differs"),
    ({"a": 1}, r"sample\['b'\] is missing"),
    ({"a": 1, "b": [1, "x"], "c": 2}, r"sample\['c'\] is not in the batch's first sample"),
    ({"a": 1, "d": [1, "x"]}, r"sample\['b'\] is missing"),
])
def test_a_sample_that_differs_from_row_0_is_named(odd, message):
    rows = [{"a": i, "b": [i, "x"]} for i in range(4)]
    rows[3] = odd
    with Loader(rows, batch_size=4, workers=1) as loader, pytest.raises(ValueError, match=message) as info:
        list(loader)
    assert "sample 3" in " ".join(info.value.__notes__)


@pytest.mark.timeout(60)
def test_a_sample_nested_deeper_than_the_match_goes_is_collated():
    def deep(depth, leaf):
        for _ in range(depth):
            leaf = [leaf]
        return leaf

    rows = [deep(200, i) for i in range(3)]
    batch = one_batch(rows)
    for _ in range(200):
        assert type(batch) is list and len(batch) == 1
        batch = batch[0]
    np.testing.assert_array_equal(batch, np.arange(3))
