"""Messages as a user reads them (SPEC §2, §4): the public types under the
names users import, a bad batch_size stated as a user would write it, and
MISTAKES, the table of what a new user gets wrong at a Loader's constructor,
each refused there, naming the argument, its value and the fix. The same
mistakes at the drop-ins' constructors: tests/pytorch/test_torch_dataloader.py
(MISTAKES there) and tests/mx/test_mx_dataloader.py (MISTAKES there);
prefetch.Prefetcher's bad arguments: BAD_ARGS in test_bad_input.py."""
import pickle
import re
import traceback

import pytest

import prefetch
from support import Sized, a_generator, assert_refused_and_usable


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


# (what the user wrote, the call on a Sized() dataset, exception, what the
# message must say: the argument or the dataset's type, the value, the fix).
MISTAKES = [
    ("Loader(ds, num_workers=2)", lambda ds: prefetch.Loader(ds, num_workers=2), TypeError,
     ["num_workers", "got num_workers=2", "pass workers=2"]),
    ("Loader(ds, collate_fn=list)", lambda ds: prefetch.Loader(ds, collate_fn=list), TypeError,
     ["collate_fn", "got collate_fn=<class 'list'>", "pass collate=<class 'list'>"]),
    ("Loader(ds, worker_init_fn=print)", lambda ds: prefetch.Loader(ds, worker_init_fn=print), TypeError,
     ["worker_init_fn", "pass worker_init=<built-in function print>"]),
    ("Loader(ds, batchify_fn=list)", lambda ds: prefetch.Loader(ds, batchify_fn=list), TypeError,
     ["batchify_fn", "Gluon", "pass collate=<class 'list'>"]),
    ("__len__ returns -1", lambda ds: prefetch.Loader(Sized(-1)), ValueError,
     ["len(dataset) must be an int >= 0", "Sized.__len__ returned -1"]),
    ("__len__ returns 10.0", lambda ds: prefetch.Loader(Sized(10.0)), TypeError,
     ["len(dataset) must be an int >= 0", "Sized.__len__ returned 10.0 (float)"]),
    ("Loader(generator)", lambda ds: prefetch.Loader(a_generator()), TypeError,
     ["dataset must have __getitem__ and __len__", "(generator)", "prefetch.map(fn, iterable)"]),
    ("map(fn, it, num_workers=2)", lambda ds: prefetch.map(abs, range(4), num_workers=2), TypeError,
     ["map() has no argument num_workers", "got num_workers=2", "pass workers=2"]),
    ("map(fn, it, worker_init_fn=print)", lambda ds: prefetch.map(abs, range(4), worker_init_fn=print), TypeError,
     ["map() has no argument worker_init_fn", "pass worker_init=<built-in function print>"]),
]


@pytest.mark.parametrize("call, exc, says", [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_a_constructor_mistake_is_refused_there_naming_it_and_the_fix(call, exc, says):
    """Refused at the call, before a thread starts or a sample loads; the
    dataset stays usable (the mistake was only an argument)."""
    assert_refused_and_usable(call, exc, says, Sized(), lambda ds: prefetch.Loader(ds, batch_size=2, workers=2))


def test_an_unknown_keyword_of_no_framework_keeps_pythons_message():
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        prefetch.Loader(Sized(), bogus=1)
    with pytest.raises(TypeError, match=r"^map\(\) got an unexpected keyword argument 'bogus'$"):
        prefetch.map(abs, range(4), bogus=1)


@pytest.mark.parametrize("noun, said", [("int", "an int"), ("ndarray", "an ndarray"), ("NDArray", "an NDArray"),
                                        ("float", "a float"), ("uint8", "a uint8"), ("object", "an object"),
                                        ("UserDict", "a UserDict")])
def test_a_type_is_named_with_its_english_article(noun, said):
    from prefetch._options import article

    assert article(noun) == said


@pytest.mark.parametrize("s, said", [(1.999994509, "2.0 s"), (2.0, "2.0 s"), (12.345, "12.3 s"), (0.25, "0.25 s")])
def test_a_duration_is_rounded_as_people_read_it(s, said):
    from prefetch._options import seconds

    assert seconds(s) == said
