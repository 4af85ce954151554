"""The default collate's layout rules (SPEC §9, issue 22 defects 2, 9 and 12):
row 0 fixes the batch layout whichever sample finishes first, and a sample that
differs is named with row 0's layout as the expected one; ndarray subclasses
(np.memmap) are arrays; a dict's key order is not its structure."""
import threading

import numpy as np
import pytest

from prefetch import Loader


class RowZeroLast:
    """``samples[i]`` by index; ``dataset[0]`` returns only once ``dataset[release]``
    has been called. With two threads the other thread then loads rows 1 ..
    release - 1 alone, and a thread collates a sample before it loads again, so
    every one of them is collated before row 0 (no sleep decides the order)."""

    def __init__(self, samples, release):
        self.samples = samples
        self.release = release
        self.released = threading.Event()

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        if i == 0 and not self.released.wait(30):
            raise AssertionError(f"dataset[{self.release}] was never called")
        if i == self.release:
            self.released.set()
        return self.samples[i]


def the_error(dataset, batch_size, **kw):
    with Loader(dataset, batch_size=batch_size, workers=2, **kw) as loader:
        with pytest.raises(ValueError) as info:
            list(loader)
    return str(info.value), " ".join(getattr(info.value, "__notes__", []))


# -- defect 2: row 0 fixes the layout, the odd sample is named ------------------

@pytest.mark.timeout(60)
def test_defect_2_a_slow_row_0_still_fixes_the_layout_and_the_odd_sample_is_named():
    """issue 22 defect 2: row 1 finishes first with another shape; the error names
    index 1 (not row 0) and states row 0's shape as the expected one."""
    samples = [np.zeros(3, np.float32), np.zeros(4, np.float32)] + [np.zeros(3, np.float32)] * 4
    message, notes = the_error(RowZeroLast(samples, release=2), batch_size=2)
    assert "has shape (4,) and dtype float32 where the batch's first sample has shape (3,)" in message
    assert "sample 1, row 2 of batch 1" in notes


@pytest.mark.timeout(60)
@pytest.mark.parametrize("odd", [1, 2, 3])
def test_defect_2_the_odd_sample_is_named_whichever_finished_first(odd):
    """Rows 1-3 are all collated before row 0 (the first of them laid the batch
    out); whichever is odd, the error names it, with row 0's shape expected."""
    samples = [np.zeros((2, 2), np.int16) for _ in range(8)]
    samples[odd] = np.zeros((2, 5), np.int16)
    message, notes = the_error(RowZeroLast(samples, release=4), batch_size=4)
    assert "has shape (2, 5) and dtype int16 where the batch's first sample has shape (2, 2)" in message
    assert f"sample {odd}, row {odd + 1} of batch 1" in notes


@pytest.mark.timeout(60)
def test_defect_2_a_slow_odd_row_0_still_fixes_the_layout():
    """Rows 1-3 agree with each other and are collated first; row 0 differs from
    them: its layout is the batch's, so the lowest other row is named."""
    samples = [np.zeros((2, 5), np.int16)] + [np.zeros((2, 2), np.int16) for _ in range(7)]
    message, notes = the_error(RowZeroLast(samples, release=4), batch_size=4)
    assert "has shape (2, 2) and dtype int16 where the batch's first sample has shape (2, 5)" in message
    assert "sample 1, row 2 of batch 1" in notes


@pytest.mark.timeout(60)
def test_defect_2_dtype_and_structure_differences_name_the_odd_sample():
    samples = [np.zeros(3, np.float32), np.zeros(3, np.float64)] + [np.zeros(3, np.float32)] * 4
    message, notes = the_error(RowZeroLast(samples, release=2), batch_size=2)
    assert "dtype float64 where the batch's first sample has shape (3,) and dtype float32" in message
    assert "sample 1, row 2 of batch 1" in notes

    samples = [(np.zeros(3), 1), (np.zeros(3), 1, 2)] + [(np.zeros(3), 1)] * 4
    message, notes = the_error(RowZeroLast(samples, release=2), batch_size=2)
    assert "structure differs" in message
    assert "sample 1, row 2 of batch 1" in notes

    samples = [(np.zeros(3), 1), (np.zeros(3), 2.5)] + [(np.zeros(3), 1)] * 4
    message, notes = the_error(RowZeroLast(samples, release=2), batch_size=2)
    assert "sample[1] is a float where the batch's first sample has an int" in message
    assert "sample 1, row 2 of batch 1" in notes


@pytest.mark.timeout(60)
def test_defect_2_a_slow_row_0_that_agrees_gives_the_right_batches():
    samples = [np.full((2, 3), i, np.float32) for i in range(8)]
    with Loader(RowZeroLast(samples, release=4), batch_size=4, workers=2) as loader:
        got = list(loader)
    assert [b.tolist() for b in got] == [np.stack(samples[:4]).tolist(), np.stack(samples[4:]).tolist()]


# -- defect 9: ndarray subclasses are arrays ------------------------------------

@pytest.fixture
def mapped(tmp_path):
    data = np.arange(6 * 3 * 2, dtype=np.float32).reshape(6, 3, 2)
    np.save(tmp_path / "data.npy", data)
    mm = np.load(tmp_path / "data.npy", mmap_mode="r")
    assert type(mm) is np.memmap and type(mm[0]) is np.memmap
    return data, mm


def test_defect_9_a_memmapped_array_is_a_dataset(mapped):
    """issue 22 defect 9: np.load(mmap_mode="r") as the dataset; its rows are
    np.memmap, stacked into plain ndarray batches."""
    data, mm = mapped
    with Loader(mm, batch_size=4, workers=2) as loader:
        got = list(loader)
    assert [type(b) for b in got] == [np.ndarray, np.ndarray]
    assert got[0].tolist() == data[:4].tolist() and got[1].tolist() == data[4:].tolist()


def test_defect_9_memmap_rows_inside_samples_and_mixed_with_plain_arrays(mapped):
    data, mm = mapped

    class Pairs:
        def __len__(self):
            return 6

        def __getitem__(self, i):   # odd rows plain ndarrays, even rows memmaps
            return {"x": mm[i] if i % 2 == 0 else np.array(data[i]), "i": i}

    with Loader(Pairs(), batch_size=3, workers=2) as loader:
        got = list(loader)
    assert [type(b["x"]) for b in got] == [np.ndarray, np.ndarray]
    assert np.concatenate([b["x"] for b in got]).tolist() == data.tolist()
    assert np.concatenate([b["i"] for b in got]).tolist() == list(range(6))


def test_defect_9_batch_size_none_and_a_custom_collate_take_memmaps(mapped):
    data, mm = mapped
    with Loader(mm, batch_size=None, workers=2) as loader:
        got = list(loader)
    assert len(got) == 6 and all(isinstance(g, np.ndarray) for g in got)
    assert [g.tolist() for g in got] == data.tolist()
    with Loader(mm, batch_size=3, workers=2, collate=np.stack) as loader:
        got = list(loader)
    assert [g.tolist() for g in got] == [data[:3].tolist(), data[3:].tolist()]


def test_a_masked_array_is_refused_rather_than_losing_its_mask():
    """Stacking a masked array into a plain block would drop its mask: refused."""
    data = [np.ma.masked_array(np.zeros(2), mask=[True, False])] * 2
    with Loader(data, batch_size=2, workers=1) as loader:
        with pytest.raises(TypeError, match="MaskedArray .*collate="):
            list(loader)


# -- defect 12: a dict's key order is not its structure -------------------------

def test_defect_12_dicts_with_the_same_keys_in_another_order_are_stacked():
    """issue 22 defect 12: the batch keeps row 0's key order, each key its values."""
    data = [{"a": np.full(2, i), "b": i, "c": {"p": np.full(3, -i), "q": str(i)}} if i % 2 == 0
            else {"c": {"q": str(i), "p": np.full(3, -i)}, "b": i, "a": np.full(2, i)}
            for i in range(6)]
    with Loader(data, batch_size=3, workers=2) as loader:
        got = list(loader)
    for k, b in enumerate(got):
        rows = range(3 * k, 3 * k + 3)
        first = data[3 * k]
        assert list(b) == list(first) and list(b["c"]) == list(first["c"])
        assert b["a"].tolist() == [[i, i] for i in rows]
        assert b["b"].tolist() == list(rows)
        assert b["c"]["p"].tolist() == [[-i] * 3 for i in rows]
        assert b["c"]["q"] == [str(i) for i in rows]


@pytest.mark.timeout(60)
def test_defect_12_a_slow_row_0_still_gives_its_key_order():
    """Row 1 (other key order) lays the batch out; row 0's order is the batch's."""
    samples = [{"a": np.full(2, i), "b": float(i)} if i % 2 == 0 else {"b": float(i), "a": np.full(2, i)}
               for i in range(8)]
    with Loader(RowZeroLast(samples, release=4), batch_size=4, workers=2) as loader:
        got = list(loader)
    assert [list(b) for b in got] == [["a", "b"], ["a", "b"]]
    assert np.concatenate([b["a"] for b in got]).tolist() == [[i, i] for i in range(8)]
    assert np.concatenate([b["b"] for b in got]).tolist() == [float(i) for i in range(8)]


def test_defect_12_dicts_whose_keys_differ_name_the_key():
    data = [{"x": {"a": 1, "b": 2}}, {"x": {"a": 1, "c": 2}}]
    with Loader(data, batch_size=2, workers=1) as loader:
        with pytest.raises(ValueError, match="structure differs") as info:
            list(loader)
    message = str(info.value)
    assert "sample['x']['c']" in message and "'b'" in message
    data = [{"a": 1, "b": 2}, {"a": 1}]
    with Loader(data, batch_size=2, workers=1) as loader:
        with pytest.raises(ValueError, match=r"sample\['b'\] is missing") as info:
            list(loader)
    assert "sample 1" in " ".join(info.value.__notes__)


def one_thread_error(samples, batch_size):
    """The error and notes of a one-thread Loader over ``samples``: rows are
    collated in order, row 0 first."""
    with Loader(samples, batch_size=batch_size, workers=1) as loader:
        with pytest.raises(ValueError) as info:
            list(loader)
    return str(info.value), " ".join(getattr(info.value, "__notes__", []))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("order", ["row 0 first", "row 0 last"])
def test_a_batch_whose_first_sample_is_none_names_that_sample_not_the_next(order):
    """dataset[4] returned None, the first sample of batch 2: the error names
    sample 4, row 1 (and its path), never sample 5, the good one compared
    with it; whichever row is collated first."""
    samples = [np.zeros(2)] * 4 + [None] + [np.zeros(2)] * 3
    if order == "row 0 first":
        message, notes = one_thread_error(samples, batch_size=4)
    else:
        message, notes = the_error(RowZeroLast(samples[4:], release=2), batch_size=4)
    assert message.startswith("sample is None, where row"), message
    assert "of the batch has an ndarray" in message
    want = "sample 4, row 1 of batch 2" if order == "row 0 first" else "sample 0, row 1 of batch 1"
    assert want in notes, notes


@pytest.mark.timeout(60)
def test_a_none_field_of_the_first_sample_is_named_by_its_path():
    samples = [{"x": None, "y": 1}] + [{"x": np.zeros(2), "y": 1}] * 3
    message, notes = one_thread_error(samples, batch_size=4)
    assert message == "sample['x'] is None, where row 2 of the batch has an ndarray"
    assert "sample 0, row 1 of batch 1" in notes


@pytest.mark.timeout(60)
def test_a_none_later_in_the_batch_is_still_that_samples_error():
    samples = [np.zeros(2), None, np.zeros(2), np.zeros(2)]
    message, notes = one_thread_error(samples, batch_size=4)
    assert message == "sample is None where the batch's first sample has an ndarray"
    assert "sample 1, row 2 of batch 1" in notes


@pytest.mark.timeout(60)
def test_a_structure_that_differs_at_the_root_names_no_empty_path():
    message, _ = one_thread_error([(1, 2), (1, 2, 3)], batch_size=2)
    assert "at sample:" not in message
    assert message.startswith("the sample's structure differs from the batch's first sample: 3 items where")
