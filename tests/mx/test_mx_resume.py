"""prefetch.mx.DataLoader resumes a run mid-pass (issue 24 item 1, SPEC §9
Resume): state_dict()/load_state_dict() with torchdata's names; after loading
a state (through JSON) into a new loader, the batches are exactly those an
uninterrupted run delivers next, values and order, with Gluon's shuffle (numpy's
global generator), a rollover sampler and sample_rng() in the dataset; a state
that does not fit is a clear error that leaves the loader usable."""
import json
import warnings

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    mx = pytest.importorskip("mxnet")

from mxnet import gluon  # noqa: E402

import prefetch  # noqa: E402
from prefetch import ClosedError  # noqa: E402
from prefetch.mx import DataLoader  # noqa: E402
from support import count_state_checks  # noqa: E402


class Augmented(gluon.data.Dataset):
    """Each sample carries its index and a draw from its sample_rng()."""

    def __init__(self, n=23):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.array([i, prefetch.sample_rng().integers(1 << 40)], np.int64)


def rows(batch):
    return [tuple(r) for r in batch.asnumpy().tolist()]


def roundtrip(state):
    """What a checkpoint file gives back."""
    return json.loads(json.dumps(state))


def run(loader, passes, stop=None):
    """The rows of each pass; with stop=(p, k), the state after batch k of pass p too."""
    got, state = [], None
    for p in range(passes):
        batches = []
        for k, batch in enumerate(loader):
            batches.append(rows(batch))
            if stop == (p, k + 1):
                state = roundtrip(loader.state_dict())
        got.append(batches)
    return got, state


KINDS = [dict(shuffle=True), dict(shuffle=False), dict(shuffle=True, last_batch="rollover")]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", KINDS, ids=repr)
@pytest.mark.parametrize("stop", [(0, 0), (1, 2), (1, 5), (2, 6)])
def test_resume_delivers_what_an_uninterrupted_run_delivers_next(num_workers, kind, stop):
    np.random.seed(7)
    with DataLoader(Augmented(), 4, num_workers=num_workers, **kind) as loader:
        if stop == (0, 0):
            state = roundtrip(loader.state_dict())
            reference, _ = run(loader, 3)
        else:
            reference, state = run(loader, 3, stop)
    np.random.seed(12345)   # the restarted process's own global generator
    with DataLoader(Augmented(), 4, num_workers=num_workers, **kind) as loader:
        loader.load_state_dict(state)
        resumed, _ = run(loader, 3 - stop[0])
    p, k = stop
    assert resumed[0] == reference[p][k:]
    assert resumed[1:] == reference[p + 1:]
    assert reference[0] != reference[1] or not kind["shuffle"]


def test_a_state_between_passes_is_the_next_passs_start():
    np.random.seed(3)
    with DataLoader(Augmented(), 5, shuffle=True, num_workers=2, auto_reload=True) as loader:
        first = [rows(b) for b in loader]
        state = roundtrip(loader.state_dict())   # the next pass, prefetched already
        second = [rows(b) for b in loader]
    assert state["batches"] == 0 and state["epoch"] == 1
    with DataLoader(Augmented(), 5, shuffle=True, num_workers=2, auto_reload=True) as loader:
        loader.load_state_dict(state)
        assert [rows(b) for b in loader] == second != first


@pytest.mark.parametrize("auto_reload", [False, True])
def test_a_state_after_a_break_resumes_the_rest_of_that_pass(auto_reload):
    """Issue 34 item 10: the state after `break` is where the loop stopped, not the next pass."""
    np.random.seed(9)
    with DataLoader(Augmented(), 4, shuffle=True, num_workers=2, auto_reload=auto_reload) as loader:
        start = roundtrip(loader.state_dict())
        for k, batch in enumerate(loader):
            if k == 2:
                break
        state = roundtrip(loader.state_dict())
    assert (state["epoch"], state["batches"]) == (0, 3)
    np.random.seed(1)
    with DataLoader(Augmented(), 4, shuffle=True, num_workers=2, auto_reload=auto_reload) as loader:
        loader.load_state_dict(start)   # the same seed of sample_rng(): the uninterrupted pass
        reference = [rows(b) for b in loader]
    with DataLoader(Augmented(), 4, shuffle=True, num_workers=2, auto_reload=auto_reload) as loader:
        loader.load_state_dict(state)
        assert [rows(b) for b in loader] == reference[3:]


def test_zip_of_a_resumed_loader_pairs_the_resumed_pass_with_a_fresh_one():
    """The state goes to the next pass started; a pass after it starts afresh."""
    np.random.seed(5)
    with DataLoader(Augmented(12), 4, num_workers=2) as loader:
        reference, state = run(loader, 2, (0, 1))
    with DataLoader(Augmented(12), 4, num_workers=2) as loader:
        loader.load_state_dict(state)
        first = iter(loader)
        assert rows(next(first)) == reference[0][1]


BAD = [
    ("dataset of length 24", lambda s: s.update(dataset_length=23 + 1)),
    ("format version", lambda s: s.update(version=99)),
    ("lacks 'sampler'", lambda s: s.pop("sampler")),
    ("last_batch='discard'", lambda s: s["framework"].update(last_batch="discard")),
    ("batch_size=3", lambda s: s.update(batch_size=3)),
    ("saved by prefetch.Loader", lambda s: s.update(framework=None)),
    ("bad or missing sampler state", lambda s: s["sampler"].pop("numpy_rng")),
    ("bad or missing sampler state", lambda s: s["sampler"]["numpy_rng"].update(key="AAAA")),
    ("do not fit together", lambda s: s.update(out_of_order=[0])),
]


@pytest.mark.parametrize("message, edit", BAD, ids=[m for m, _ in BAD])
def test_a_state_that_does_not_fit_is_a_clear_error_and_the_loader_stays_usable(message, edit):
    with DataLoader(Augmented(), 4, num_workers=2) as loader:
        next(iter(loader))
        state = roundtrip(loader.state_dict())
    edit(state)
    with DataLoader(Augmented(), 4, num_workers=2) as loader:
        with pytest.raises(ValueError, match=message):
            loader.load_state_dict(state)
        assert [r[0] for b in loader for r in rows(b)] == list(range(23))


def test_another_batch_size_is_refused():
    with DataLoader(Augmented(), 4, num_workers=2) as loader:
        state = roundtrip(loader.state_dict())
    with DataLoader(Augmented(), 5, num_workers=2) as loader:
        with pytest.raises(ValueError, match="batch_size=4; this DataLoader has batch_size=5"):
            loader.load_state_dict(state)


def test_loading_during_a_pass_or_after_close_raises():
    loader = DataLoader(Augmented(), 4, num_workers=2)
    state = roundtrip(loader.state_dict())
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="while a pass over it is in progress"):
        loader.load_state_dict(state)
    assert len(list(it)) == 5   # the pass goes on
    loader.load_state_dict(state)   # once it has ended
    loader.close()
    with pytest.raises(ClosedError):
        loader.load_state_dict(state)


# -- the same top-level fields as every front door, checked once (SPEC §9 Resume) --

def test_the_state_says_the_batch_size_and_the_framework():
    with DataLoader(Augmented(), 4, num_workers=2) as loader:
        next(iter(loader))
        state = roundtrip(loader.state_dict())
    assert state["batch_size"] == 4 and state["batches"] == 1
    assert state["framework"] == {"name": "mxnet.gluon.data.DataLoader", "last_batch": "keep"}
    assert state["order"]["shuffle"] is False


def test_a_shuffled_passs_state_is_refused_by_an_unshuffled_loader():
    with DataLoader(Augmented(), 4, shuffle=True, num_workers=2) as loader:
        next(iter(loader))
        state = roundtrip(loader.state_dict())
    with DataLoader(Augmented(), 4, num_workers=2) as loader:
        with pytest.raises(ValueError, match="shuffle=True; this DataLoader has shuffle=False"):
            loader.load_state_dict(state)
        assert [r[0] for b in loader for r in rows(b)] == list(range(23))


def test_another_last_batch_is_refused_naming_it():
    with DataLoader(Augmented(), 4, num_workers=2) as loader:
        state = roundtrip(loader.state_dict())
    with DataLoader(Augmented(), 4, last_batch="discard", num_workers=2) as loader:
        with pytest.raises(ValueError, match="last_batch='keep'; this DataLoader has last_batch='discard'"):
            loader.load_state_dict(state)


def test_a_loaded_state_is_checked_once(monkeypatch):
    calls = count_state_checks(monkeypatch)
    with DataLoader(Augmented(), 4, num_workers=2) as loader:
        next(iter(loader))
        state = roundtrip(loader.state_dict())
    with DataLoader(Augmented(), 4, num_workers=2) as loader:
        loader.load_state_dict(state)
        assert len(list(loader)) == 5
    assert calls == ["DataLoader"]
