"""A worker's copy of the dataset (prefetch/_replica.py, through the seam the
drop-ins use): besides the framework's datasets, the objects a drop-in names
(``along``: a file reader no two threads may share, and what holds one) are
copied by the same walk, wherever they sit, and the user's objects are left
as they are."""
import collections
import gc
import sys

import pytest

from prefetch._framework import for_processes, replica


class Dataset:
    """A framework's dataset class."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class Wrapper:
    """A user's own object (no dataset) holding what it is given."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class Reader:
    """A file reader with a position: each thread needs one of its own."""

    def __init__(self, name):
        self.name = name

    def fresh(self):
        return Reader(self.name + "'")


class Refused(Dataset):
    """A dataset that cannot be copied: its __getattr__ recurses on a bare copy."""

    def __getattr__(self, name):
        return getattr(self.inner, name)


Pair = collections.namedtuple("Pair", "reader label")


class Records(list):
    pass


class Files(dict):
    pass


def along(root):
    """``replica``'s along for ``root``: each Reader with its fresh(), each holder of one with None."""
    found, seen = {}, set()

    def search(obj):
        if id(obj) in seen:
            return id(obj) in found
        seen.add(id(obj))
        if isinstance(obj, Reader):
            found[id(obj)] = Reader.fresh
            return True
        items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) \
            else vars(obj).values() if isinstance(obj, (Dataset, Wrapper)) else ()
        if any([search(item) for item in items]):
            found[id(obj)] = None
            return True
        return False

    search(root)
    return found


def test_the_objects_along_names_are_copied_wherever_they_sit():
    labels = list(range(1000))
    root = Wrapper(pair=Pair(Reader("a"), 1), records=Records([Reader("b"), 2]), files=Files(c=Reader("c"), n=[3]),
                   long=[(i,) for i in range(1000)] + [Reader("d")], inner=Dataset(e=Reader("e")), labels=labels)
    own = replica(root, (Dataset,), along(root))
    assert type(own.pair) is Pair and own.pair.reader.name == "a'" and own.pair.label == 1
    assert type(own.records) is Records and own.records[0].name == "b'"
    assert type(own.files) is Files and own.files["c"].name == "c'" and own.files["n"] is root.files["n"]
    assert own.long[-1].name == "d'" and own.long[0] is root.long[0]
    assert own.inner is not root.inner and own.inner.e.name == "e'"
    assert own.labels is labels   # what holds no reader is shared
    # the user's objects are as they were
    assert [root.pair.reader.name, root.records[0].name, root.files["c"].name, root.long[-1].name] == list("abcd")


def test_a_reader_reached_twice_is_one_copy_and_a_cycle_leads_to_the_copy():
    reader = Reader("a")
    root = Wrapper(first=reader, again=[reader, (reader,)])
    root.me = root
    own = replica(root, (), along(root))
    assert own.first.name == "a'" and own.again[0] is own.first and own.again[1][0] is own.first
    assert own.me is own


def test_a_dataset_that_cannot_be_copied_is_shared_and_the_readers_are_still_copied():
    refused = Refused(inner=Dataset(x=1))
    root = Wrapper(reader=Reader("a"), data=refused)
    own = replica(root, (Dataset,), along(root))
    assert own.data is refused and own.reader.name == "a'"
    assert replica(refused, (Dataset,)) is refused   # nothing named: shared whole


def test_a_dataset_that_cannot_be_copied_on_the_way_to_a_reader_is_the_callers_error():
    root = Wrapper(data=Refused(inner=Dataset(), reader=Reader("a")))
    with pytest.raises(RecursionError):
        replica(root, (Dataset,), along(root))


def test_an_error_copying_a_named_object_is_the_callers():
    def broken(reader):
        raise OSError("cannot reopen " + reader.name)

    root = Wrapper(reader=Reader("a"))
    with pytest.raises(OSError, match="cannot reopen a"):
        replica(root, (Dataset,), {id(root): None, id(root.reader): broken})


class Plain:
    def __init__(self):
        self.rows, self.scale = [1, 2], 3


class OwnState(Plain):
    def __getstate__(self):
        return {"rows": self.rows}


def _has_own_dict(obj):
    """Whether ``obj``'s attributes sit in a dict of its own (gc sees that dict;
    CPython 3.11+ keeps them in the object until its ``__dict__`` is read)."""
    return any(type(r) is dict for r in gc.get_referents(obj))


def test_processes_forked_after_threads_get_the_dataset_with_its_attributes_in_place():
    """A thread's copy read the dataset's __dict__ (on CPython 3.11 its
    attributes then sit in a dict, read more slowly in every dataset[i]):
    worker processes get a shallow copy with them in the object (SPEC §9)."""
    dataset = Plain()
    replica(dataset, (Plain,))   # as a loader thread's copy is made (3.11 and 3.12: into a dict)
    fresh = for_processes(dataset, (Plain,))
    assert type(fresh) is Plain and fresh is not dataset
    assert fresh.rows is dataset.rows and fresh.scale == 3   # shallow: what it holds is shared
    assert _has_own_dict(fresh) == (sys.version_info < (3, 11))


def test_a_dataset_no_thread_copied_or_that_copies_its_own_way_goes_to_processes_as_it_is():
    """Not read at all where no thread copied it: its attributes stay in place."""
    dataset = OwnState()
    assert for_processes(dataset, (OwnState,)) is dataset
    untouched = Plain()
    assert for_processes(untouched, (OwnState,)) is untouched
    assert _has_own_dict(untouched) == (sys.version_info < (3, 11))
