"""The torch drop-in's resume state at every moment, streams that shard by
torch's own get_worker_info(), and the state's bad input (issue 34: each
defect it lists has a test named after it here; SPEC §resume)."""
import json
import threading

import pytest

import prefetch

torch = pytest.importorskip("torch")

from torch.utils.data import Dataset, IterableDataset  # noqa: E402

from prefetch.torch import DataLoader, StatefulDataLoader  # noqa: E402
from support import count_state_checks, run_script  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def flat(batches):
    return [x for b in batches for x in (b.tolist() if hasattr(b, "tolist") else b)]


# -- item 6 / deliverable 3: torch's get_worker_info answers in the threads --------

class TorchSharded(IterableDataset):
    """Shards by torch.utils.data.get_worker_info(), as streaming libraries do."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(w, self.n, k))


@pytest.mark.parametrize("workers", [2, 3])
def test_a_stream_sharding_by_torchs_get_worker_info_yields_each_sample_once(workers):
    with DataLoader(TorchSharded(20), batch_size=None, num_workers=workers) as ours:
        got = [int(x) for x in ours]
    theirs = [int(x) for x in torch.utils.data.DataLoader(TorchSharded(20), batch_size=None, num_workers=workers)]
    assert got == theirs and sorted(got) == list(range(20))
    assert torch.utils.data.get_worker_info() is None   # outside the threads, as in torch's main process


def test_torchs_get_worker_info_is_none_on_other_threads_while_workers_run():
    seen = []
    with DataLoader(TorchSharded(8), batch_size=None, num_workers=2) as loader:
        it = iter(loader)
        next(it)
        t = threading.Thread(target=lambda: seen.append(torch.utils.data.get_worker_info()))
        t.start()
        t.join(10)
    assert seen == [None]


HF_CHILD = r"""
import json, sys, warnings
import torch, datasets
from prefetch.torch import StatefulDataLoader
warnings.simplefilter("ignore")
stream = datasets.Dataset.from_dict({"x": list(range(20))}).to_iterable_dataset(num_shards=6)
with StatefulDataLoader(stream, batch_size=None, num_workers=3) as loader:
    if sys.argv[1] == "save":
        it = iter(loader)
        print(json.dumps([int(next(it)["x"]) for _ in range(7)]))
        torch.save(loader.state_dict(), sys.argv[2])
    else:
        loader.load_state_dict(torch.load(sys.argv[2], weights_only=False))
        print(json.dumps([int(r["x"]) for r in loader]))
"""


@pytest.mark.full
def test_hugging_face_datasets_stream_is_sharded_and_resumes_exactly_in_a_new_process(tmp_path):
    """Item 6 and the issue's target: num_workers=3, the same examples as
    torch's DataLoader, once each; stopped mid-epoch, saved with torch.save
    and restored in a new process, it continues exactly."""
    datasets = pytest.importorskip("datasets")
    stream = datasets.Dataset.from_dict({"x": list(range(20))}).to_iterable_dataset(num_shards=6)
    theirs = [int(r["x"]) for r in torch.utils.data.DataLoader(stream, batch_size=None, num_workers=3)]
    with StatefulDataLoader(stream, batch_size=None, num_workers=3) as loader:
        whole = [int(r["x"]) for r in loader]
    assert whole == theirs and sorted(whole) == list(range(20))
    script, path = tmp_path / "hf.py", str(tmp_path / "state.pt")
    script.write_text(HF_CHILD)
    saved = run_script(str(script), ["save", path], timeout=120)
    assert saved.returncode == 0, saved.stderr[-3000:]
    resumed = run_script(str(script), ["load", path], timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(saved.stdout) + json.loads(resumed.stdout) == whole


@pytest.mark.filterwarnings("ignore::ResourceWarning")   # webdataset leaves its tar files to the gc
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.full
def test_webdataset_shards_by_worker_like_torchs_loader(tmp_path):
    wds = pytest.importorskip("webdataset")
    urls = []
    for s in range(4):
        path = str(tmp_path / f"shard-{s}.tar")
        with wds.TarWriter(path) as sink:
            for i in range(5):
                sink.write({"__key__": f"{s}-{i}", "txt": str(s * 5 + i)})
        urls.append(path)

    def stream():
        return wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode().to_tuple("txt")
    theirs = sorted(int(t[0]) for t in torch.utils.data.DataLoader(stream(), batch_size=None, num_workers=2))
    with DataLoader(stream(), batch_size=None, num_workers=2) as loader:
        ours = sorted(int(t[0]) for t in loader)
    assert ours == theirs == list(range(20))


# -- items 1-4, 7: the state at every moment ---------------------------------------

class Squares(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return i * i


def _make(**kw):
    return DataLoader(Squares(), batch_size=3, **kw)


def test_a_state_after_break_resumes_the_rest_of_that_epoch():
    """Item 2: non-persistent workers, the for loop's iterator collected."""
    whole = flat(_make(shuffle=True, generator=torch.Generator().manual_seed(3), num_workers=2))
    loader = _make(shuffle=True, generator=torch.Generator().manual_seed(3), num_workers=2)
    head = []
    for i, batch in enumerate(loader):
        head += batch.tolist()
        if i == 2:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["batches"] == 3
    with _make(shuffle=True, generator=torch.Generator().manual_seed(3), num_workers=2) as resumed:
        resumed.load_state_dict(state)
        assert head + flat(resumed) == whole
    loader.close()


@pytest.mark.parametrize("when", ["before", "end"])
def test_a_state_at_an_epochs_edge_with_the_global_generator_resumes_that_order(when):
    """Item 3: shuffle=True without generator=, saved before the first batch or at an epoch's end."""
    torch.manual_seed(11)
    loader = _make(shuffle=True, num_workers=2)
    if when == "end":
        flat(loader)
    state = loader.state_dict()
    expected = flat(loader)
    torch.manual_seed(999)   # another run's global generator
    with _make(shuffle=True, num_workers=2) as resumed:
        resumed.load_state_dict(state)
        assert flat(resumed) == expected
    loader.close()


class Gate(Dataset):
    """Sample 0 waits until released: later batches complete first (in_order=False)."""

    def __init__(self):
        self.release = threading.Event()

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if i == 0:
            assert self.release.wait(30), "never released"
        return i


def test_in_order_false_resumes_exactly_what_was_not_delivered():
    """Item 4: batches delivered out of order are neither lost nor repeated."""
    data = Gate()
    loader = DataLoader(data, batch_size=2, num_workers=2, in_order=False)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(3)]   # batch 0 waits: these are later ones
    assert [0, 1] not in head
    state = json.loads(json.dumps(loader.state_dict()))
    data.release.set()
    loader.close()
    assert state["batches"] == 3 and len(state["out_of_order"]) == 3
    with DataLoader(data, batch_size=2, num_workers=2, in_order=False) as resumed:
        resumed.load_state_dict(state)
        tail = [b.tolist() for b in resumed]
    assert sorted(x for b in head + tail for x in b) == list(range(16))


def test_persistent_workers_with_a_generator_resume_between_epochs_and_sample_rng():
    """Item 7: the state between epochs of persistent workers, and prefetch.sample_rng() after it."""
    import prefetch

    class Draws(Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            return i * 1000 + int(prefetch.sample_rng().integers(1000))

    def make():
        return DataLoader(Draws(), batch_size=3, shuffle=True, num_workers=2, persistent_workers=True,
                          generator=torch.Generator().manual_seed(5))
    with make() as loader:
        flat(loader)
        state = loader.state_dict()
        expected = [flat(loader), flat(loader)]
    with make() as resumed:
        resumed.load_state_dict(state)
        assert [flat(resumed), flat(resumed)] == expected


class Stateful:
    """A sampler with its own state (torchdata's Stateful): an offset into the order."""

    def __init__(self, n):
        self.n, self.offset = n, 0

    def __iter__(self):
        return iter([(i + self.offset) % self.n for i in range(self.n)])

    def __len__(self):
        return self.n

    def state_dict(self):
        return {"offset": self.offset}

    def load_state_dict(self, state):
        if not isinstance(state.get("offset"), int):
            raise ValueError(f"bad offset {state!r}")
        self.offset = state["offset"]


def test_a_samplers_own_state_is_saved_and_restored():
    """Item 8: the sampler's state at the epoch's start comes back with the state."""
    sampler = Stateful(24)
    sampler.offset = 5
    loader = DataLoader(Squares(), batch_size=3, sampler=sampler, num_workers=2)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(2)]
    state = loader.state_dict()
    rest = [b.tolist() for b in it]
    fresh = Stateful(24)   # offset 0: only the state says 5
    with DataLoader(Squares(), batch_size=3, sampler=fresh, num_workers=2) as resumed:
        resumed.load_state_dict(state)
        assert [b.tolist() for b in resumed] == rest
    assert head[0] == [25, 36, 49]
    loader.close()


def test_bad_generator_or_sampler_state_is_refused_at_load_and_the_loader_stays_usable():
    """Item 9 and the issue's bad input."""
    sampler = Stateful(24)
    with DataLoader(Squares(), batch_size=3, sampler=sampler) as loader:
        good = loader.state_dict()
        short = json.loads(json.dumps(good))
        short["framework"]["iterator_rng"] = short["framework"]["iterator_rng"][:40]
        with pytest.raises(ValueError, match="bad torch part"):
            loader.load_state_dict(short)
        refused = json.loads(json.dumps(good))
        refused["sampler"]["samplers"] = [{"offset": "x"}]
        with pytest.raises(ValueError, match="Stateful.load_state_dict refused its state"):
            loader.load_state_dict(refused)
        sampler.load_state_dict({"offset": 0})
        assert len(list(loader)) == 8   # still usable
        with pytest.raises(ValueError, match="saved for a map-style dataset; this DataLoader's dataset is an iter"):
            DataLoader(TorchSharded(4)).load_state_dict(good)
        with pytest.raises(ValueError, match="not a prefetch loader's state"):
            loader.load_state_dict({"format": "torchdata"})


def test_a_streams_state_refuses_another_worker_count():
    with DataLoader(TorchSharded(12), batch_size=None, num_workers=2) as loader:
        state = loader.state_dict()
    with DataLoader(TorchSharded(12), batch_size=None, num_workers=3) as other:
        with pytest.raises(ValueError, match="saved with 2 worker.*this DataLoader has 3"):
            other.load_state_dict(state)


def _edited(state, edit):
    state = json.loads(json.dumps(state))
    edit(state)
    return state


def _snapshots(state):
    return state["_snapshot"]["_worker_snapshots"]


@pytest.mark.parametrize("edit, message", [
    (lambda s: _snapshots(s).pop("worker_1"), "bad stream parts.*next must be an int >= 0 and <= 0, got 1"),
    (lambda s: (_snapshots(s).pop("worker_1"), s["_snapshot"].update(next=0)), "saved with 1 worker.*has 2"),
    (lambda s: _snapshots(s).update(worker_7=_snapshots(s).pop("worker_1")), "stream parts lack 'worker_1'"),
    (lambda s: _snapshots(s)["worker_0"]["fetcher_state"].clear(), "bad stream parts.*dataset_iter_state"),
    (lambda s: _snapshots(s)["worker_0"].pop("dataset_state"), "bad stream parts.*dataset_state"),
    (lambda s: _snapshots(s)["worker_0"].update(batches=-1), "bad stream parts.*batches"),
    (lambda s: s["_snapshot"].update(next=2), "bad stream parts.*next"),
    (lambda s: s["_snapshot"].pop("next"), "bad stream parts.*_snapshot has the keys"),
    (lambda s: s.update(dataset_state=None), "unknown keys 'dataset_state'"),
])
def test_an_edited_stream_part_under_torchdatas_names_is_refused_naming_it(edit, message):
    """SPEC §9: a stream's parts are written under torchdata's names and read
    back into the one check; an edited one is a ValueError at
    load_state_dict naming it, the loader unchanged."""
    with DataLoader(TorchSharded(12), batch_size=None, num_workers=2) as loader:
        whole = [int(x) for x in loader]
        next(iter(loader))
        good = loader.state_dict()
        with pytest.raises(ValueError, match=message):
            loader.load_state_dict(_edited(good, edit))
        assert [int(x) for x in loader] == whole


def test_a_loaders_stream_state_is_refused_naming_it():
    """A prefetch.Loader's state (the core's names) is refused as the Loader's, not as an edited one."""
    with prefetch.Loader(TorchSharded(12), batch_size=2, workers=2) as loader:
        state = loader.state_dict()
    with DataLoader(TorchSharded(12), batch_size=2, num_workers=2) as ours:
        with pytest.raises(ValueError, match="saved by prefetch.Loader; this is a torch.utils.data.DataLoader"):
            ours.load_state_dict(state)


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.pop("fetcher_state"), "stream parts lack 'fetcher_state'"),
    (lambda s: s.update(fetcher_state={"iterator": None}), "bad stream parts.*dataset_iter_state"),
    (lambda s: s.update(fetcher_state=None), "bad stream parts"),
])
def test_an_edited_stream_part_with_no_workers_is_refused_naming_it(edit, message):
    """With num_workers=0 the one worker's part is at the top level, as torchdata's."""
    with DataLoader(TorchSharded(12), batch_size=None) as loader:
        next(iter(loader))
        good = loader.state_dict()
        assert good["dataset_state"] is None and good["fetcher_state"] == {"dataset_iter_state": None}
        with pytest.raises(ValueError, match=message):
            loader.load_state_dict(_edited(good, edit))
        assert [int(x) for x in loader] == list(range(12))


class EpochCounted(IterableDataset):
    """A stream whose __iter__ advances its own epoch, which decides its
    samples (as a dataset reshuffling per epoch does)."""

    def __init__(self):
        self.epoch = 0

    def __iter__(self):
        self.epoch += 1
        info = torch.utils.data.get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        return iter([self.epoch * 100 + i for i in range(w, 8, k)])

    def state_dict(self):
        return {"epoch": self.epoch}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_taken_at_iter_resumes_a_stream_whose_iter_advances_its_epoch(workers):
    """A state taken before any batch holds each worker's dataset state from
    before its __iter__ (restored, then iterated once): the resumed run gives
    the samples the uninterrupted one did, not those of the epoch after
    (torchdata's TestSingleIterCalled asks for the state after __iter__;
    TORCHDATA_TESTS.md; SPEC §9 Streams)."""
    loader = StatefulDataLoader(EpochCounted(), batch_size=None, num_workers=workers)
    it = iter(loader)
    state = loader.state_dict()
    expected = [int(x) for x in it]
    assert sorted(expected) == [100 + i for i in range(8)]
    resumed = StatefulDataLoader(EpochCounted(), batch_size=None, num_workers=workers)
    resumed.load_state_dict(state)
    assert [int(x) for x in resumed] == expected


def test_a_state_after_close_is_where_the_consumer_stopped():
    whole = flat(_make(num_workers=2))
    loader = _make(num_workers=2)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(4)]
    loader.close()
    state = loader.state_dict()
    assert state["batches"] == 4
    with _make(num_workers=2) as resumed:
        resumed.load_state_dict(state)
        assert flat(head) + flat(resumed) == whole


def test_a_returned_state_is_the_callers_own():
    # SPEC §9: editing a state_dict() changes neither the drop-in nor the next state it gives.
    with _make(num_workers=2) as loader:
        it = iter(loader)
        next(it)
        first = loader.state_dict()
        first["order"]["sampler"], first["framework"]["name"] = "edited", "edited"
        again = loader.state_dict()
        assert "edited" not in (again["order"]["sampler"], again["framework"]["name"])


def test_a_stateful_loader_accepts_snapshot_every_n_steps_and_checks_it():
    """Item 5."""
    with StatefulDataLoader(Squares(), batch_size=3, snapshot_every_n_steps=4) as loader:
        assert loader.snapshot_every_n_steps == 4 and len(list(loader)) == 8
    with pytest.raises(ValueError, match="snapshot_every_n_steps must be an int >= 0"):
        StatefulDataLoader(Squares(), snapshot_every_n_steps=-1)


# -- one check, at load; the order's parts recorded (SPEC §9 Resume) ---------------

def test_a_shuffled_runs_state_is_refused_by_an_unshuffled_loader():
    """Else the resumed run skips batches the saved run never delivered."""
    loader = _make(shuffle=True, num_workers=2)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    with _make(num_workers=2) as other:
        with pytest.raises(ValueError, match="shuffle=True; this DataLoader has shuffle=False"):
            other.load_state_dict(state)
        assert flat(other) == [i * i for i in range(24)]   # unchanged and usable


@pytest.mark.parametrize("kind", ["weighted", "subset"])
def test_a_samplers_own_generator_resumes_its_epoch(kind):
    """A WeightedRandomSampler's or SubsetRandomSampler's generator= is
    saved as the epoch begins: a state taken in epoch 2 resumes that epoch."""
    from torch.utils.data import SubsetRandomSampler, WeightedRandomSampler

    def sampler():
        g = torch.Generator().manual_seed(11)
        if kind == "weighted":
            return WeightedRandomSampler([1.0] * 24, 24, generator=g)
        return SubsetRandomSampler(list(range(0, 24, 2)), generator=g)

    with _make(sampler=sampler(), num_workers=2) as loader:
        whole = [flat(loader), flat(loader)]
    assert whole[0] != whole[1]
    loader = _make(sampler=sampler(), num_workers=2)
    flat(loader)
    it = iter(loader)
    head = flat([next(it), next(it)])
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    with _make(sampler=sampler(), num_workers=2) as resumed:   # its generator back at its seed
        resumed.load_state_dict(state)
        assert head + flat(resumed) == whole[1]


def test_a_state_listing_a_batch_past_the_epochs_end_is_refused():
    with _make(num_workers=2) as loader:
        state = dict(loader.state_dict(), batches=2, out_of_order=[9])
        with pytest.raises(ValueError, match="batch 9 of epoch 0 as delivered; this DataLoader has 8"):
            loader.load_state_dict(state)
        assert flat(loader) == [i * i for i in range(24)]


def test_a_state_whose_epoch_cannot_be_run_is_refused_at_load():
    with _make(num_workers=2, persistent_workers=True) as loader:
        state = dict(loader.state_dict(), epoch=2**63 - 2)
        with pytest.raises(ValueError, match="bad value.*epoch must be an int"):
            loader.load_state_dict(state)
        assert flat(loader) == flat(loader) == [i * i for i in range(24)]


class HalfLoading(Stateful):
    """Sets what it reads as it reads it: a state it refuses half-loaded."""

    def state_dict(self):
        return {"offset": self.offset, "check": 1}

    def load_state_dict(self, state):
        self.offset = state.get("offset", 0)
        if not isinstance(state.get("check"), int):
            raise ValueError(f"no check in {state!r}")


def test_a_refused_sampler_state_changes_nothing():
    """The check of a state's sampler part leaves the sampler as it was, and
    the loader usable."""
    sampler = HalfLoading(24)
    with DataLoader(Squares(), batch_size=3, sampler=sampler) as loader:
        state = json.loads(json.dumps(loader.state_dict()))
        state["sampler"]["samplers"] = [{"offset": 7}]
        with pytest.raises(ValueError, match="HalfLoading.load_state_dict refused its state"):
            loader.load_state_dict(state)
        assert sampler.offset == 0
        assert flat(loader) == [i * i for i in range(24)]


def test_a_loaded_state_is_checked_once(monkeypatch):
    """Where it is loaded; the epoch it starts takes it as checked."""
    calls = count_state_checks(monkeypatch)
    loader = _make(num_workers=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    loader.close()
    with _make(num_workers=2) as resumed:
        resumed.load_state_dict(state)
        assert len(flat(resumed)) == 21
    assert calls == ["DataLoader"]


def held_after_load(cls, persistent):
    """A held iterator's batches after a state is loaded mid-epoch, then the next iter()'s."""
    loader = cls(list(range(24)), batch_size=4, num_workers=2, persistent_workers=persistent)
    state = loader.state_dict()
    it = iter(loader)
    next(it)
    loader.load_state_dict(state)
    held, following = flat(it), flat(loader)
    if hasattr(loader, "close"):
        loader.close()
    return held, following


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")   # torchdata's workers
@pytest.mark.parametrize("persistent", [False, True])
def test_load_state_dict_mid_epoch_leaves_the_held_iterator_going_as_torchdatas(persistent):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    expected = (list(range(4, 24)), list(range(24)))
    assert held_after_load(stateful.StatefulDataLoader, persistent) == expected   # the control
    assert held_after_load(DataLoader, persistent) == expected


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")   # torchdata's own
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_checkpoint_torchdatas_own_class_saved_is_refused_naming_it(num_workers):
    """torchdata's StatefulDataLoader state (its own keys; with workers, its
    snapshot) was refused as "not a prefetch loader's state (its format is
    None)": now a ValueError saying whose checkpoint it is, and the loader
    stays usable."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    theirs = stateful.StatefulDataLoader(list(range(12)), batch_size=3, num_workers=num_workers)
    it = iter(theirs)
    next(it)
    state = theirs.state_dict()
    del it
    with StatefulDataLoader(list(range(12)), batch_size=3, num_workers=num_workers) as ours:
        with pytest.raises(ValueError, match=r"^state is a checkpoint of torchdata's own StatefulDataLoader "
                                             r"\(keys \[.*\]\), which prefetch\.torch's loaders cannot load"):
            ours.load_state_dict(state)
        assert flat(ours) == list(range(12))
