"""Code the publisher thread runs for a batch (a registered container's
unflatten, a registered collate type's conversion, a device delivery) is
that batch's: an exception there comes back to the consumer in the batch's
place, as the same object with a note, after the batches before it, and the
stream ends as a source error ends it (SPEC §9 Hooks, §4). Before: the
publisher thread died, the consumer got "the publisher thread ... is not
running" and the error went to threading.excepthook."""
import threading

import numpy as np
import pytest

import prefetch
from prefetch import Loader, Prefetcher


class HookError(Exception):
    pass


@pytest.fixture
def no_thread_dies(monkeypatch):
    """Fails the test when any thread ends with an uncaught exception."""
    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    yield
    assert not died, f"a thread died: {died!r}"


def _notes(exc):
    return " ".join(getattr(exc, "__notes__", []))


class Box:
    """A user's container whose rebuild refuses one value."""

    def __init__(self, value, payload):
        self.value, self.payload = value, payload


def _unflatten_box(value, kids):
    if value == 2:
        raise HookError("cannot rebuild box 2")
    return Box(value, kids[0])


@pytest.mark.timeout(30)
def test_a_container_whose_unflatten_raises_gives_its_error_in_the_batch_place(no_thread_dies):
    prefetch.register_container(Box, lambda b: ((b.payload,), b.value), _unflatten_box)
    source = [Box(i, np.full(4, i)) for i in range(5)]
    got = []
    with Prefetcher(source, depth=2) as p:
        with pytest.raises(HookError) as info:
            for box in p:
                got.append(int(box.payload[0]))
        error = info.value
        assert "rebuilding batch 3 with a registered container's unflatten (counted from 1" in _notes(error), \
            _notes(error)
        with pytest.raises(StopIteration):   # the stream ended with it, as after a source's error
            next(p)
    assert got == [0, 1]


class Meters:
    """A user's array type, stacked by a Loader through register_collate."""

    def __init__(self, data):
        self.data = data


@pytest.mark.timeout(30)
def test_a_collate_type_whose_from_numpy_raises_gives_its_error_in_the_batch_place(no_thread_dies):
    calls = []
    refuse = [2]   # the call that raises; none once emptied
    raised = []    # what it raised (emptied at the end: the registry keeps this function)

    def from_numpy(block):
        calls.append(1)
        if len(calls) in refuse:
            raised.append(HookError("from_numpy refuses batch 2"))
            raise raised[-1]
        return Meters(block)

    prefetch.register_collate(Meters, lambda m: m.data, from_numpy)
    data = [Meters(np.full(3, i, np.float32)) for i in range(8)]
    got = []
    with Loader(data, batch_size=2, workers=2) as loader:
        with pytest.raises(HookError) as info:
            for batch in loader:
                got.append(batch.data[:, 0].tolist())
        assert raised == [info.value]
        assert "batch 2 (counted from 1" in _notes(info.value), _notes(info.value)
        assert got == [[0.0, 1.0]]
        raised.clear()
        # The loader stays usable: the next epoch runs whole.
        refuse.clear()
        assert [b.data[:, 0].tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]


class _Refusing:
    """A device delivery that refuses the third leaf it is given."""

    def __init__(self):
        self.count = 0

    def deliver(self, leaf):
        self.count += 1
        if self.count == 3:
            raise HookError("device refuses leaf 3")
        return leaf

    def ready(self):
        pass

    def close(self):
        pass


class _Device:
    pass


@pytest.mark.timeout(30)
@pytest.mark.parametrize("front", ["prefetcher", "loader"])
def test_a_delivery_that_raises_gives_its_error_in_the_batch_place(front, no_thread_dies):
    prefetch.adapters.register_device(_Device, lambda device: _Refusing())
    data = [np.full(2, i) for i in range(6)]
    if front == "prefetcher":
        p = Prefetcher(data, device=_Device(), depth=2)
    else:
        p = Loader(data, batch_size=None, workers=1, device=_Device())
    got = []
    with p:
        with pytest.raises(HookError) as info:
            for a in p:
                got.append(int(a[0]))
        assert "delivering batch 3 to the device" in _notes(info.value), _notes(info.value)
    assert got == [0, 1]


class _InnerLoader:
    """A source that is itself a prefetch consumer (as a Loader is behind
    Prefetcher(loader)): on its second batch it gives its consumer a warning,
    as the Loader gives a GILBoundWarning, through the one path they share."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        from prefetch import _warn
        for i in range(self.n):
            if i == 1:
                _warn.warn_consumer("threads take turns", prefetch.GILBoundWarning)
            yield np.full(2, i)


@pytest.mark.timeout(30)
def test_a_warning_for_the_consumer_given_on_a_prefetch_thread_reaches_the_users_line():
    """§9 (issue 32): a warning for the consumer given while the publisher
    thread consumes another prefetcher is raised on the user's thread at the
    user's line, not at threading.py on the publisher."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Prefetcher(_InnerLoader(6), depth=2) as p:
            got = [int(a[0]) for a in p]
    assert got == list(range(6))
    warned = [w for w in caught if issubclass(w.category, prefetch.GILBoundWarning)]
    assert len(warned) == 1
    assert warned[0].filename == __file__, warned[0].filename


@pytest.mark.timeout(30)
def test_a_relayed_warning_as_an_error_never_ends_the_epoch():
    """§9 (issue 32): with warnings as errors the relayed warning is raised at
    the user's next(), before a batch is taken; the next next() goes on with
    every batch. Before: it was raised inside next(source) on the publisher,
    which ended the stream as a source error."""
    import warnings
    got, raised = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("error", prefetch.GILBoundWarning)
        with Prefetcher(_InnerLoader(6), depth=2) as p:
            while True:
                try:
                    got.append(int(next(p)[0]))
                except StopIteration:
                    break
                except prefetch.GILBoundWarning as w:
                    raised.append(w)
    assert got == list(range(6))
    assert len(raised) == 1
