"""Messages as a user reads them (issue 26 item 4): the public types under the
names users import, and a bad batch_size stated as a user would write it."""
import pickle
import re
import traceback

import pytest

import prefetch


@pytest.mark.parametrize("name", ["ClosedError", "Stats", "WorkerInfo"])
def test_public_types_are_shown_under_the_module_users_import_them_from(name):
    cls = getattr(prefetch, name)
    assert cls.__module__ == "prefetch"
    assert repr(cls) == f"<class 'prefetch.{name}'>"


def test_closed_error_traceback_names_prefetch_closed_error():
    p = prefetch.Prefetcher([1, 2, 3])
    p.close()
    with pytest.raises(prefetch.ClosedError) as info:
        next(p)
    text = "".join(traceback.format_exception_only(info.type, info.value))
    assert text.startswith("prefetch.ClosedError: "), text


def test_stats_pickles_under_its_public_name():
    with prefetch.Prefetcher([1, 2]) as p:
        list(p)
        stats = p.stats()
    assert b"prefetch\nStats\n" in pickle.dumps(stats, protocol=0)
    assert pickle.loads(pickle.dumps(stats)) == stats


def test_batch_size_zero_states_the_bound_and_hints_none():
    with pytest.raises(ValueError) as info:
        prefetch.Loader(list(range(4)), batch_size=0)
    message = str(info.value)
    assert message.startswith("batch_size must be an int >= 1, got 0")
    assert "batch_size=None" in message
    assert not re.search(r"\d{6,}", message), message    # no 19-digit bound


def test_batch_size_of_the_wrong_type_names_none_as_the_alternative():
    with pytest.raises(TypeError, match=r"batch_size must be an int >= 1, or None .* got '2' \(str\)"):
        prefetch.Loader(list(range(4)), batch_size="2")


def test_batch_size_past_the_limit_states_it_as_a_power_of_two():
    with pytest.raises(ValueError, match=r"at most 2\*\*62, got 4611686018427387905"):
        prefetch.Loader(list(range(4)), batch_size=(1 << 62) + 1)


def test_batch_size_none_and_numpy_ints_still_work():
    import numpy as np

    with prefetch.Loader(list(range(4)), batch_size=None, workers=1) as loader:
        assert [int(x) for x in loader] == [0, 1, 2, 3]
    with prefetch.Loader(list(range(4)), batch_size=np.int64(2), workers=1) as loader:
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
