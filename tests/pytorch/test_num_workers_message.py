"""The torch drop-in checks num_workers itself, with the product's message
(issue 26 item 4): torch compares it with 0 first, so a string gave a bare
"'<' not supported between instances of 'str' and 'int'"."""
import inspect

import pytest

torch = pytest.importorskip("torch")

from prefetch.torch import DataLoader  # noqa: E402


@pytest.mark.parametrize("value", ["2", 2.0, None, True])
def test_num_workers_of_the_wrong_type_is_named_with_its_value(value):
    with pytest.raises(TypeError) as info:
        DataLoader(list(range(4)), num_workers=value)
    assert str(info.value).startswith("num_workers must be an int >= 0"), str(info.value)
    assert f"got {value!r} ({type(value).__name__})" in str(info.value)


def test_num_workers_given_positionally_is_checked_too():
    with pytest.raises(TypeError, match="num_workers must be an int >= 0"):
        DataLoader(list(range(4)), 1, False, None, None, "2")


def test_too_many_num_workers_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"num_workers must be an int >= 0 and at most 1024"):
        DataLoader(list(range(4)), num_workers=10_000)


def test_negative_num_workers_keeps_torchs_message():
    with pytest.raises(ValueError) as theirs:
        torch.utils.data.DataLoader(list(range(4)), num_workers=-1)
    with pytest.raises(ValueError) as ours:
        DataLoader(list(range(4)), num_workers=-1)
    assert str(ours.value) == str(theirs.value)


def test_the_signature_is_torchs_and_loading():
    ours, theirs = inspect.signature(DataLoader), inspect.signature(torch.utils.data.DataLoader)
    *same, loading = ours.parameters.values()
    assert same == list(theirs.parameters.values()) and ours.return_annotation == theirs.return_annotation
    assert (loading.name, loading.kind, loading.default) == ("loading", inspect.Parameter.KEYWORD_ONLY, "auto")


def test_a_valid_num_workers_loads_as_before():
    with DataLoader(list(range(6)), batch_size=3, num_workers=2) as loader:
        assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5]]
