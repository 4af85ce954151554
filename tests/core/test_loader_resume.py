"""A Loader's epochs are the user's to set, and a run resumes mid-epoch
(SPEC §9 Resume; issue 24 items 1, 2, 4): epoch=/set_epoch(n) set where
counting starts; state_dict()/load_state_dict() continue with exactly the
batches an uninterrupted run delivers next (values, order, sample_rng()
streams; with ordered=False none lost or repeated); a state that does not
fit is a clear error that leaves the loader usable."""
import json
import signal
import threading
import time

import numpy as np
import pytest

import prefetch
from prefetch import ClosedError, Loader
from support import run_python

WORKERS = [1, 2, "auto"]


class Augmented:
    """Each sample carries its index and a draw from its sample_rng()."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.array([i, prefetch.sample_rng().integers(1 << 40)], np.int64)


def rows(batches):
    return [tuple(r) for b in batches for r in np.asarray(b).tolist()]


def epochs(loader, count):
    return [rows(list(loader)) for _ in range(count)]


def roundtrip(state):
    """What a checkpoint file gives back."""
    return json.loads(json.dumps(state))


# -- item 2: the epoch is the user's to set -------------------------------------

def test_epoch_argument_starts_counting_there():
    with Loader(Augmented(17), 4, shuffle=True, seed=3, workers=2) as loader:
        reference = epochs(loader, 7)
    with Loader(Augmented(17), 4, shuffle=True, seed=3, workers=2, epoch=5) as loader:
        assert epochs(loader, 2) == reference[5:7]


def test_set_epoch_between_epochs_sets_the_next_one():
    with Loader(Augmented(17), 4, shuffle=True, seed=3, workers=2) as loader:
        reference = epochs(loader, 4)
    with Loader(Augmented(17), 4, shuffle=True, seed=3, workers=2) as loader:
        loader.set_epoch(3)
        assert rows(list(loader)) == reference[3]
        loader.set_epoch(1)
        assert rows(list(loader)) == reference[1]
        assert rows(list(loader)) == reference[2]   # and counts on from there


def test_a_samplers_set_epoch_hears_the_loaders_epoch():
    heard = []

    class Sampler:
        def __iter__(self):
            return iter(range(6))

        def __len__(self):
            return 6

        def set_epoch(self, epoch):
            heard.append(epoch)

    with Loader(list(range(6)), 2, sampler=Sampler(), workers=1, epoch=4) as loader:
        list(loader)
        list(loader)
        loader.set_epoch(10)
        list(loader)
    assert heard == [4, 5, 10]


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (1 << 63, ValueError), (1.0, TypeError),
                                        (True, TypeError), ("3", TypeError), (None, TypeError)])
def test_a_bad_epoch_is_refused_naming_it(bad, error):
    with pytest.raises(error, match=r"epoch must be an int >= 0.*got " + repr(bad).replace("(", r"\(")):
        Loader([1, 2], epoch=bad)
    with Loader([1, 2], workers=1) as loader:
        with pytest.raises(error, match="epoch must be an int"):
            loader.set_epoch(bad)
        assert [int(b[0]) for b in loader] == [1, 2]   # still usable, epoch 0


# -- item 1: resume mid-epoch ----------------------------------------------------

@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("taken", [0, 1, 3, 5, 6])
def test_resume_delivers_what_an_uninterrupted_run_delivers_next(workers, taken):
    """Shuffle on, sample_rng() in the dataset; the state goes through JSON.
    6 batches per epoch: taken=6 is a state taken after the last batch."""
    with Loader(Augmented(23), 4, shuffle=True, seed=11, workers=workers) as loader:
        reference = epochs(loader, 3)
    with Loader(Augmented(23), 4, shuffle=True, seed=11, workers=workers) as loader:
        list(loader)
        it = iter(loader)
        got = [next(it) for _ in range(taken)]
        state = roundtrip(loader.state_dict())
    assert state["epoch"] == 1 and state["batches"] == taken
    assert rows(got) == reference[1][:4 * taken]
    # A new loader, no seed given: the state's seed is adopted.
    with Loader(Augmented(23), 4, shuffle=True, workers=workers) as resumed:
        resumed.load_state_dict(state)
        assert rows(list(resumed)) == reference[1][4 * taken:]
        assert rows(list(resumed)) == reference[2]


def test_a_state_taken_after_the_epoch_ended_is_the_next_epochs_start():
    with Loader(Augmented(10), 3, shuffle=True, seed=2, workers=2) as loader:
        reference = epochs(loader, 2)
        state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (2, 0)
    with Loader(Augmented(10), 3, shuffle=True, seed=2, workers=2) as loader:
        list(loader)
        state = roundtrip(loader.state_dict())
    assert (state["epoch"], state["batches"]) == (1, 0)
    with Loader(Augmented(10), 3, shuffle=True, workers=2) as resumed:
        resumed.load_state_dict(state)
        assert rows(list(resumed)) == reference[1]


def test_a_state_after_a_break_then_set_epoch_is_that_epochs_start():
    """Issue 34 item 10: after `break` then set_epoch(7), the state said
    "epoch 0, 2 batches" and the resume replayed epoch 0."""
    with Loader(Augmented(12), 3, shuffle=True, seed=4, workers=2) as loader:
        for k, _ in enumerate(loader):
            if k == 1:
                break
        assert (loader.state_dict()["epoch"], loader.state_dict()["batches"]) == (0, 2)
        loader.set_epoch(7)
        state = roundtrip(loader.state_dict())
        expected = rows(list(loader))
    assert (state["epoch"], state["batches"]) == (7, 0)
    with Loader(Augmented(12), 3, shuffle=True, seed=4, workers=2) as resumed:
        resumed.load_state_dict(state)
        assert rows(list(resumed)) == expected


def test_a_state_after_close_is_where_the_consumer_stopped():
    """A run that saves its checkpoint on shutdown (SPEC §resume)."""
    with Loader(Augmented(12), 3, shuffle=True, seed=4, workers=2) as loader:
        whole = rows(list(loader))
    loader = Loader(Augmented(12), 3, shuffle=True, seed=4, workers=2)
    it = iter(loader)
    head = rows([next(it) for _ in range(2)])
    loader.close()
    state = roundtrip(loader.state_dict())
    assert (state["epoch"], state["batches"]) == (0, 2)
    with Loader(Augmented(12), 3, shuffle=True, seed=4, workers=2) as resumed:
        resumed.load_state_dict(state)
        assert head + rows(list(resumed)) == whole


def test_state_before_iterating_and_after_loading():
    with Loader(Augmented(10), 3, workers=1, seed=1, epoch=7) as loader:
        state = loader.state_dict()
        assert (state["epoch"], state["batches"], state["seed"]) == (7, 0, 1)
        assert state["dataset_length"] == 10 and state["batch_size"] == 3
        edited = dict(state, epoch=2, batches=2)
        loader.load_state_dict(edited)
        assert loader.state_dict() == edited   # pending until the next epoch starts
        assert [r[0] for r in rows(list(loader))] == [6, 7, 8, 9]


def test_a_returned_state_is_the_callers_own():
    # SPEC §9: editing a state_dict() changes neither the loader nor the next state it gives.
    with Loader(Augmented(10), 3, workers=1, seed=1, shuffle=True) as loader:
        first = loader.state_dict()
        first["order"]["shuffle"] = False
        assert loader.state_dict()["order"]["shuffle"] is True


def test_resume_mid_epoch_within_one_process_between_epochs():
    """load_state_dict between epochs of the same loader (the last epoch ended)."""
    with Loader(Augmented(20), 4, shuffle=True, seed=5, workers=2) as loader:
        it = iter(loader)
        first = [next(it), next(it)]
        state = loader.state_dict()
        rest = list(it)
        list(loader)   # epoch 1
        loader.load_state_dict(state)
        assert rows(list(loader)) == rows(rest)
        assert rows(first + rest) == rows(list(Loader(Augmented(20), 4, shuffle=True, seed=5, workers=1)))


def test_state_dict_from_another_thread_while_batches_flow():
    """Taken at any moment, without pausing: each state resumes to the rest."""
    with Loader(Augmented(64), 2, shuffle=True, seed=4, workers=2) as loader:
        reference = rows(list(loader))
    states, stop = [], threading.Event()
    with Loader(Augmented(64), 2, shuffle=True, seed=4, workers=2) as loader:
        def watch():
            while not stop.is_set() and len(states) < 10_000:
                states.append(loader.state_dict())

        it = iter(loader)
        next(it)
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            list(it)
        finally:
            stop.set()
            watcher.join(10)
    counts = [s["batches"] for s in states if s["epoch"] == 0]
    assert counts == sorted(counts) and all(1 <= c <= 32 for c in counts)
    middle = states[len(states) // 2]
    with Loader(Augmented(64), 2, shuffle=True, workers=2) as resumed:
        resumed.load_state_dict(middle)
        if middle["epoch"] == 0:
            assert rows(list(resumed)) == reference[2 * middle["batches"]:]


def test_unordered_resume_loses_and_repeats_nothing():
    """ordered=False: batch 0 is held back until two later batches were
    delivered; the state names them, and the resumed run delivers exactly
    the others."""
    release = threading.Event()

    class HoldFirst(Augmented):
        def __getitem__(self, i):
            if i == 0:
                assert release.wait(20)
            return super().__getitem__(i)

    with Loader(HoldFirst(12), 1, seed=9, workers=2, ordered=False) as loader:
        it = iter(loader)
        got = [next(it), next(it)]
        state = roundtrip(loader.state_dict())
        release.set()
    assert {r[0] for r in rows(got)} == {1, 2}
    assert state["batches"] == 2 and state["out_of_order"] == [1, 2]
    with Loader(Augmented(12), 1, workers=2, ordered=False) as resumed:
        resumed.load_state_dict(state)
        rest = rows(list(resumed))
        # the state after the resumed epoch's first batches still counts the held-back ones
    assert sorted(rows(got) + rest) == rows(list(Loader(Augmented(12), 1, seed=9, workers=1)))
    with Loader(Augmented(12), 1, workers=2, ordered=False) as resumed:
        resumed.load_state_dict(state)
        it = iter(resumed)
        more = [next(it) for _ in range(3)]
        again = roundtrip(resumed.state_dict())
    assert again["batches"] == 5
    with Loader(Augmented(12), 1, workers=1) as last:
        last.load_state_dict(again)
        tail = rows(list(last))
    assert sorted(rows(got + more) + tail) == sorted(rows(got) + rest)


def test_a_sampler_with_state_is_restored_to_its_epochs_start():
    """A sampler whose order comes from its own generator, not from set_epoch."""

    class Drawing:
        def __init__(self):
            self.rng = np.random.default_rng(0)

        def __iter__(self):
            return iter(self.rng.permutation(15).tolist())

        def __len__(self):
            return 15

        def state_dict(self):
            return {"bit_generator": self.rng.bit_generator.state}

        def load_state_dict(self, state):
            self.rng.bit_generator.state = state["bit_generator"]

    with Loader(Augmented(15), 4, sampler=Drawing(), seed=1, workers=2) as loader:
        reference = epochs(loader, 3)
    assert reference[1] != reference[2]
    with Loader(Augmented(15), 4, sampler=Drawing(), seed=1, workers=2) as loader:
        list(loader)
        it = iter(loader)
        next(it)
        state = roundtrip(loader.state_dict())
    assert state["sampler"] is not None
    with Loader(Augmented(15), 4, sampler=Drawing(), workers=2) as resumed:
        resumed.load_state_dict(state)
        assert rows(list(resumed)) == reference[1][4:]
        assert rows(list(resumed)) == reference[2]


def test_a_sampler_without_state_is_replayed():
    """No state_dict: its epoch's indices are read again and the delivered batches dropped."""

    class Seeded:
        epoch = 0

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __iter__(self):
            return iter(np.random.default_rng(self.epoch).permutation(13).tolist())

        def __len__(self):
            return 13

    with Loader(Augmented(13), 2, sampler=Seeded(), seed=1, workers=2) as loader:
        reference = epochs(loader, 2)
        it = iter(loader)
        next(it)
    with Loader(Augmented(13), 2, sampler=Seeded(), seed=1, workers=2, epoch=1) as loader:
        it = iter(loader)
        next(it), next(it), next(it)
        state = roundtrip(loader.state_dict())
    assert state["sampler"] is None
    with Loader(Augmented(13), 2, sampler=Seeded(), workers=2) as resumed:
        resumed.load_state_dict(state)
        assert rows(list(resumed)) == reference[1][6:]


# -- bad states ------------------------------------------------------------------

def good_state():
    with Loader(Augmented(20), 4, seed=1, workers=1) as loader:
        it = iter(loader)
        next(it)
        return roundtrip(loader.state_dict())


@pytest.mark.parametrize("edit, message", [
    (dict(dataset_length=21), "dataset of length 21; this loader's has length 20"),
    (dict(batch_size=5), "batch_size=5; this loader has batch_size=4"),
    (dict(version=1), "format version 1"),
    (dict(format="torchdata"), "not a prefetch loader's state"),
    (dict(framework={"name": "torch.utils.data.DataLoader"}),
     "saved by a torch.utils.data.DataLoader drop-in; this is prefetch.Loader"),
    (dict(dataset_length=None), "saved for an iterable dataset"),
    (dict(streams={"next": 0, "workers": []}), "holds a stream's parts"),
    (dict(seed=2), "seed=2; this loader has seed=1"),
    (dict(batches=6), "6 batches of epoch 0 were delivered; this loader has 5 per epoch"),
    (dict(batches=-1), "bad value.*batches"),
    (dict(epoch="0"), "bad value.*epoch"),
    (dict(out_of_order=[0]), "do not fit together"),
    (dict(out_of_order=3), "bad value.*out_of_order"),
    (dict(sampler={"x": 1}), "sampler has no state_dict"),
    (dict(extra=1), "unknown keys 'extra'"),
])
def test_a_state_that_does_not_fit_is_a_clear_error_and_the_loader_stays_usable(edit, message):
    state = dict(good_state(), **edit)
    with Loader(Augmented(20), 4, seed=1, workers=1) as loader:
        with pytest.raises(ValueError, match=message):
            loader.load_state_dict(state)
        assert [r[0] for r in rows(list(loader))] == list(range(20))   # unchanged: epoch 0 from its start


def test_a_truncated_state_names_what_it_lacks():
    state = good_state()
    del state["epoch"], state["seed"]
    with Loader(Augmented(20), 4, seed=1, workers=1) as loader:
        with pytest.raises(ValueError, match="lacks 'seed', 'epoch'"):
            loader.load_state_dict(state)
        with pytest.raises(TypeError, match="state must be a dict"):
            loader.load_state_dict(json.dumps(good_state()))
        assert len(list(loader)) == 5


def test_load_state_dict_on_a_closed_loader_raises_closed_error():
    loader = Loader(Augmented(20), 4, seed=1, workers=1)
    loader.close()
    with pytest.raises(ClosedError, match="closed"):
        loader.load_state_dict(good_state())


def test_load_state_dict_during_an_epoch_in_progress_is_refused():
    state = good_state()
    with Loader(Augmented(20), 4, seed=1, workers=1) as loader:
        it = iter(loader)
        first = next(it)
        with pytest.raises(RuntimeError, match="epoch 0 is in progress"):
            loader.load_state_dict(state)
        assert rows([first] + list(it)) == rows(list(Loader(Augmented(20), 4, seed=1, workers=1)))
        loader.load_state_dict(state)   # once it has ended
        assert len(list(loader)) == 4


def test_state_dict_is_cheap():
    """The issue's target is 50 us; bounded loosely here (a shared CI machine)."""
    with Loader(Augmented(4000), 2, shuffle=True, seed=1, workers=2) as loader:
        it = iter(loader)
        for _ in range(100):
            next(it)
        t0 = time.perf_counter()
        for _ in range(1000):
            loader.state_dict()
        per_call = (time.perf_counter() - t0) / 1000
    assert per_call < 500e-6, per_call


# -- item 4: killed with SIGKILL mid-epoch, restarted from the saved state ----------

CHILD = r"""
import json, os, signal, sys
import numpy as np
import prefetch
from prefetch import Loader

workers = {workers!r}
state_path, log_path, kill_at = {state!r}, {log!r}, {kill_at!r}

class Augmented:
    def __len__(self):
        return 30
    def __getitem__(self, i):
        return np.array([i, prefetch.sample_rng().integers(1 << 40)], np.int64)

loader = Loader(Augmented(), 4, shuffle=True, seed=None if os.path.exists(state_path) else 1234,
                workers=workers)
start, logged = 0, 0
if os.path.exists(state_path):
    with open(state_path) as f:
        saved = json.load(f)
    loader.load_state_dict(saved["loader"])
    start, logged = saved["loader"]["epoch"], saved["logged"]
log = open(log_path, "a")
for epoch in range(start, 3):
    for batch in loader:
        log.write(json.dumps(np.asarray(batch).tolist()) + "\n")
        log.flush()
        logged += 1
        if logged % 3 == 0:   # a checkpoint every third batch, written atomically
            with open(state_path + ".tmp", "w") as f:
                json.dump({{"loader": loader.state_dict(), "logged": logged}}, f)
            os.replace(state_path + ".tmp", state_path)
        if logged == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
loader.close()
print("done", logged)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", WORKERS)
def test_a_run_killed_mid_epoch_resumes_from_its_saved_state(tmp_path, workers):
    """8 batches per epoch; killed after batch 13 (epoch 1, 5 batches in), the
    last checkpoint after batch 12: the restarted run delivers exactly what
    the uninterrupted run delivered from batch 13 on."""
    def child(tag, kill_at):
        code = CHILD.format(workers=workers, state=str(tmp_path / f"{tag}.json"),
                            log=str(tmp_path / f"{tag}.log"), kill_at=kill_at)
        return run_python(code, timeout=50)

    def log(tag):
        return (tmp_path / f"{tag}.log").read_text().splitlines()

    whole = child("whole", kill_at=-1)
    assert whole.returncode == 0, whole.stderr
    assert len(log("whole")) == 24

    killed = child("run", kill_at=13)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert log("run") == log("whole")[:13]
    saved = json.loads((tmp_path / "run.json").read_text())
    assert saved["logged"] == 12 and saved["loader"]["epoch"] == 1 and saved["loader"]["batches"] == 4
    # The log has batch 13 too (delivered after the checkpoint): the restart delivers it again.
    (tmp_path / "run.log").write_text("\n".join(log("run")[:12]) + "\n")
    restarted = child("run", kill_at=-1)
    assert restarted.returncode == 0, restarted.stderr
    assert log("run") == log("whole")


# -- a state loaded after a break out of the epoch's loop ------------------------------

def taken_by_next(loader):
    """next(loader) until the epoch ends."""
    got = []
    while True:
        try:
            got.append(next(loader))
        except StopIteration:
            return got


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("taken_after, via_next", [(0, False), (2, False), (2, True)])
def test_load_state_dict_after_a_break_continues_exactly(workers, taken_after, via_next):
    """Issue 24 items 1 and 4 (the brief's item 2): a state taken mid-epoch, a
    break out of the loop (with `taken_after` more batches taken first), the
    state loaded into the same loader: the next loop delivers what an
    uninterrupted run delivered after the state, then the epochs after it;
    next(loader) (`via_next`) starts the resumed epoch too."""
    kwargs = dict(batch_size=4, shuffle=True, seed=5, workers=workers)
    with Loader(Augmented(30), **kwargs) as uninterrupted:
        whole = epochs(uninterrupted, 2)
    with Loader(Augmented(30), **kwargs) as loader:
        got = []
        for k, batch in enumerate(loader):
            got.append(batch)
            if k == 2:
                state = roundtrip(loader.state_dict())
            if k == 2 + taken_after:
                break
        del batch
        loader.load_state_dict(state)
        resumed = rows(taken_by_next(loader) if via_next else list(loader))
        following = rows(list(loader))
    assert rows(got[:3]) + resumed == whole[0]
    assert following == whole[1]


# -- a state records what decides the order, and is checked once, at load (SPEC §9) --

def state_after_one_batch(**kw):
    with Loader(Augmented(20), 4, seed=1, workers=1, **kw) as loader:
        it = iter(loader)
        next(it)
        return roundtrip(loader.state_dict())


@pytest.mark.parametrize("saved, loading, message", [
    (dict(shuffle=True), dict(), "shuffle=True; this loader has shuffle=False"),
    (dict(), dict(shuffle=True), "shuffle=False; this loader has shuffle=True"),
    (dict(), dict(sampler=range(20)), "sampler=None; this loader has sampler='builtins.range'"),
])
def test_a_state_of_another_order_is_refused_naming_the_difference(saved, loading, message):
    """A shuffled run's state would resume an unshuffled loader by skipping
    batches the saved run never delivered."""
    state = state_after_one_batch(**saved)
    with Loader(Augmented(20), 4, seed=1, workers=1, **loading) as loader:
        with pytest.raises(ValueError, match=message):
            loader.load_state_dict(state)
        assert len(rows(list(loader))) == 20   # unchanged and usable


def test_a_state_listing_a_batch_past_the_epochs_end_is_refused():
    state = dict(state_after_one_batch(), batches=2, out_of_order=[7])
    with Loader(Augmented(20), 4, seed=1, workers=1) as loader:
        with pytest.raises(ValueError, match="batch 7 of epoch 0.*this loader has 5 per epoch"):
            loader.load_state_dict(state)
        assert [r[0] for r in rows(list(loader))] == list(range(20))


class Refusing:
    """A sampler with a state of its own, which refuses a state it did not write."""

    def __init__(self):
        self.offset = 0

    def __iter__(self):
        return iter([(i + self.offset) % 20 for i in range(20)])

    def __len__(self):
        return 20

    def state_dict(self):
        return {"offset": self.offset}

    def load_state_dict(self, state):
        if not isinstance(state.get("offset"), int):
            raise KeyError(f"no offset in {state!r}")
        self.offset = state["offset"]


def test_a_state_the_sampler_refuses_is_refused_at_load_and_the_loader_stays_usable():
    sampler = Refusing()
    sampler.offset = 3
    state = dict(state_after_one_batch(sampler=Refusing()), sampler={"offset": "x"})
    with Loader(Augmented(20), 4, seed=1, workers=1, sampler=sampler) as loader:
        with pytest.raises(ValueError, match="Refusing.load_state_dict refused.*no offset"):
            loader.load_state_dict(state)
        assert sampler.offset == 3   # the check changed nothing
        assert [r[0] for r in rows(list(loader))] == [(i + 3) % 20 for i in range(20)]


def test_a_state_whose_epoch_cannot_be_run_is_refused_at_load():
    """The epoch after a state's is counted too: one past what the loader
    can count is refused where the state is loaded, not at a later for."""
    state = dict(state_after_one_batch(), epoch=2**63 - 2)
    with Loader(Augmented(20), 4, seed=1, workers=1) as loader:
        with pytest.raises(ValueError, match="bad value.*epoch must be an int"):
            loader.load_state_dict(state)
        assert len(list(loader)) == 5 and len(list(loader)) == 5


def test_the_largest_epoch_a_state_may_name_runs_and_the_epochs_after_it():
    from prefetch._options import MAX_EPOCH
    state = dict(state_after_one_batch(), epoch=MAX_EPOCH, batches=0)
    with Loader(Augmented(20), 4, seed=1, workers=1) as loader:
        loader.load_state_dict(state)
        assert [len(list(loader)) for _ in range(3)] == [5, 5, 5]

