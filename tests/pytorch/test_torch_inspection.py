"""Code that inspects the torch drop-in cannot tell it from torch's loader
(issue 45, deliverable 2; SPEC §6): torch's get_worker_info however it was
imported, isinstance/issubclass of classes derived after patch(), pickling
while patched, patch()'s module filter, what unpatch() restores and says,
warnings at the user's line, stats() after a break; and the per-loader
choice of where loading runs (``loading=``), with torch's own class
reachable after patch(). Each test is named after the defect it pins."""
import gc
import inspect
import json
import os
import pickle
import sys
import types
import warnings

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import Dataset, IterableDataset  # noqa: E402
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter  # noqa: E402

import prefetch.torch  # noqa: E402
from prefetch.torch import DataLoader, StatefulDataLoader  # noqa: E402
from support import run_script  # noqa: E402

TORCH_DL = prefetch.torch.original("DataLoader")


def flat(batches):
    return [x for b in batches for x in b.tolist()]


@pytest.fixture
def modules():
    """Modules made for a test (as a library or a script imports), gone after it."""
    made = []

    def make(name, **names):
        module = types.ModuleType(name)
        vars(module).update(names)
        sys.modules[name] = module
        made.append(name)
        return module

    yield make
    prefetch.torch.unpatch()
    for name in made:
        del sys.modules[name]


# -- get_worker_info, however it was imported ----------------------------------------

_IMPORTED_BEFORE = """
import json, sys
import torch
from torch.utils.data import IterableDataset, get_worker_info          # before prefetch.torch
from torch.utils.data._utils.worker import get_worker_info as info_of  # another path, another name

class Sharded(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        assert all((info is None) == (f() is None) for f in (info_of, late))
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(w, 30, k))

import prefetch.torch
from torch.utils.data.dataloader import get_worker_info as late        # and after it
with prefetch.torch.DataLoader(Sharded(), batch_size=None, num_workers=3) as loader:
    seen = [int(x) for x in loader]
print(json.dumps({"seen": seen, "main": [f() is None for f in (get_worker_info, info_of, late)]}))
"""


@pytest.mark.timeout(120)
def test_get_worker_info_imported_before_prefetch_torch_answers_in_the_threads(tmp_path):
    """torch's documented sharding recipe, its function imported by name
    before prefetch.torch: every sample once (not num_workers times), and
    None outside the threads."""
    script = tmp_path / "sharded.py"
    script.write_text(_IMPORTED_BEFORE)
    r = run_script(str(script), timeout=110)   # the installed prefetch, as a user runs it
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert sorted(got["seen"]) == list(range(30))
    assert got["main"] == [True, True, True]


# -- isinstance / issubclass --------------------------------------------------------

def test_a_subclass_defined_after_patch_follows_pythons_isinstance_rules(modules):
    before = TORCH_DL(list(range(4)), batch_size=2)
    drop_in = DataLoader(list(range(4)), batch_size=2)
    stand_in = prefetch.torch.patch()

    class Mine(torch.utils.data.DataLoader):
        pass

    mine = Mine(list(range(4)), batch_size=2)
    assert not isinstance(before, Mine) and not isinstance(drop_in, Mine) and isinstance(mine, Mine)
    assert not issubclass(TORCH_DL, Mine) and not issubclass(DataLoader, Mine) and issubclass(Mine, stand_in)
    # The stand-in itself still answers for the class it replaced (Accelerate's check).
    assert isinstance(before, stand_in) and isinstance(drop_in, stand_in) and isinstance(mine, stand_in)
    assert issubclass(TORCH_DL, stand_in) and issubclass(Mine, TORCH_DL)
    assert [b.tolist() for b in mine] == [[0, 1], [2, 3]]
    del mine, Mine
    gc.collect()   # gone from the stand-in's subclasses: unpatch() has nothing to say


# -- pickling while patched ----------------------------------------------------------

def test_patched_classes_and_their_loaders_pickle_as_torchs_do(modules):
    """A torch loader made before patch(), one built by the patched name (also
    after an epoch left with a break), and the patched class itself round-trip
    through pickle (what torch.multiprocessing.spawn's args do)."""
    before = TORCH_DL(list(range(6)), batch_size=2)
    prefetch.torch.patch()
    made = torch.utils.data.DataLoader(list(range(6)), batch_size=2, num_workers=2)
    for batch in made:
        break
    del batch
    loaders = [before, made]
    if "StatefulDataLoader" in prefetch.torch._patch._installed():
        from torchdata.stateful_dataloader import StatefulDataLoader as Patched
        loaders.append(Patched(list(range(6)), batch_size=2))
    for loader in loaders:
        again = pickle.loads(pickle.dumps(loader))
        assert type(again) is type(loader)
        assert [b.tolist() for b in again] == [[0, 1], [2, 3], [4, 5]]
        if isinstance(again, DataLoader):
            again.close()
    assert pickle.loads(pickle.dumps(torch.utils.data.DataLoader)) is torch.utils.data.DataLoader
    assert pickle.loads(pickle.dumps(TORCH_DL)) is TORCH_DL
    made.close()


# -- patch()'s module filter; a user's alias; original() ------------------------------

def test_patch_rebinds_modules_whose_name_only_begins_with_prefetch(modules):
    data = modules("prefetch_data", DataLoader=TORCH_DL)
    other = modules("prefetcher", DataLoader=TORCH_DL)
    stand_in = prefetch.torch.patch()
    assert data.DataLoader is stand_in and other.DataLoader is stand_in
    prefetch.torch.unpatch()
    assert data.DataLoader is TORCH_DL and other.DataLoader is TORCH_DL


def test_patch_keeps_a_users_alias_of_torchs_class_and_original_reaches_it(modules, monkeypatch):
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "TorchDL", TORCH_DL, raising=False)
    script = modules("user_script", TorchDL=TORCH_DL, DataLoader=TORCH_DL)
    stand_in = prefetch.torch.patch()
    assert main.TorchDL is TORCH_DL and script.TorchDL is TORCH_DL and script.DataLoader is stand_in
    assert prefetch.torch.original("DataLoader") is TORCH_DL is prefetch.torch.original()
    assert type(iter(prefetch.torch.original()(list(range(4)), num_workers=1))) is _MultiProcessingDataLoaderIter
    with pytest.raises(ValueError, match="original\\(\\) gives 'DataLoader' or 'StatefulDataLoader', got name='Loader'"):
        prefetch.torch.original("Loader")


# -- unpatch() -----------------------------------------------------------------------

def test_a_name_imported_while_patched_builds_torchs_class_after_unpatch(modules):
    prefetch.torch.patch()
    late = modules("imported_while_patched", DataLoader=torch.utils.data.DataLoader, Alias=torch.utils.data.DataLoader)
    prefetch.torch.unpatch()
    assert late.DataLoader is TORCH_DL and late.Alias is TORCH_DL
    assert type(late.DataLoader(list(range(4)))) is TORCH_DL


def test_unpatch_warns_naming_a_class_derived_from_the_stand_in(modules):
    prefetch.torch.patch()

    class Derived(torch.utils.data.DataLoader):
        pass

    with pytest.warns(UserWarning, match=r"unpatch\(\): .*Derived, defined while patched, .*still build") as got:
        prefetch.torch.unpatch()
    assert got[0].filename == __file__
    assert issubclass(Derived, DataLoader)   # what it said: it cannot be undone
    del Derived
    gc.collect()


# -- warnings at the user's line -----------------------------------------------------

def _stateful_torchdata():
    return pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader


@pytest.mark.parametrize("constructor", ["DataLoader", "StatefulDataLoader", "patched DataLoader",
                                         "patched StatefulDataLoader"])
def test_too_many_workers_warning_points_at_the_users_line_from_every_constructor(constructor, modules,
                                                                                   monkeypatch):
    monkeypatch.setattr(torch._utils, "cpu_count", lambda: 1)
    if constructor.startswith("patched"):
        prefetch.torch.patch()
        cls = torch.utils.data.DataLoader if constructor.endswith(" DataLoader") else _stateful_torchdata()
    else:
        cls = DataLoader if constructor == "DataLoader" else StatefulDataLoader
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        loader = cls(list(range(4)), num_workers=2)
        it = iter(loader)   # torch checks again for each iterator
    said = [(w.filename, w.lineno) for w in got if "worker threads in total" in str(w.message)]
    assert said == [(__file__, line), (__file__, line + 1)]
    del it
    loader.close()


def test_pin_memory_warning_points_at_the_users_line(monkeypatch):
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    loader = DataLoader(list(range(4)), pin_memory=True)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        it = iter(loader)
    assert [(w.filename, w.lineno) for w in got if "pin_memory" in str(w.message)] == [(__file__, line)]
    del it
    loader.close()


# -- stats() after a break -----------------------------------------------------------

class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(40))


@pytest.mark.parametrize("iterable", [False, True])
def test_stats_keep_the_figures_of_the_epoch_begun_last_after_a_break(iterable):
    """The GIL warning sends the user to stats().load_parallelism: after a
    break (the iterator dropped, its threads gone) it still reads that epoch."""
    loader = DataLoader(Stream() if iterable else list(range(40)), batch_size=2, num_workers=2)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    del _
    gc.collect()
    stats = loader.stats()
    assert stats.produced >= stats.consumed >= 3 and stats.samples >= 6 and stats.workers == 2
    loader.close()
    # close() keeps them too. The dropped iterator closes its threads aside, so
    # they may have produced more meanwhile: what was handed out is fixed.
    after = loader.stats()
    assert (after.consumed, after.workers) == (stats.consumed, 2) and after.produced >= stats.produced


# -- loading= : the per-loader choice --------------------------------------------------

class Pids(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.tensor([i, os.getpid()])


@pytest.mark.timeout(120)
def test_loading_processes_uses_torchs_multiprocessing_iterator_and_torchs_batches():
    def made(cls, **kw):
        return cls(Pids(), batch_size=3, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(5), **kw)

    ours = made(DataLoader, loading="processes")
    got = list(ours)
    assert ours.stats().loading == "processes"
    theirs = list(made(TORCH_DL))
    assert [b[:, 0].tolist() for b in got] == [b[:, 0].tolist() for b in theirs]
    assert os.getpid() not in {int(p) for b in got for p in b[:, 1]}   # loaded in torch's worker processes
    assert type(iter(made(DataLoader, loading="threads"))).__name__ == "_ThreadIter"


@pytest.mark.timeout(120)
def test_close_shuts_torchs_persistent_worker_processes_down():
    loader = DataLoader(Pids(), batch_size=3, num_workers=2, persistent_workers=True, loading="processes")
    assert len(list(loader)) == 4
    workers = loader._iterator._workers.it._workers   # torch's iterator's processes
    loader.close()
    assert not any(w.is_alive() for w in workers)
    with pytest.raises(prefetch.ClosedError):
        iter(loader)


@pytest.mark.parametrize("value, error, said", [
    ("thread", ValueError, "loading must be 'auto', 'threads' or 'processes', got loading='thread'"),
    (2, TypeError, r"loading must be 'auto', 'threads' or 'processes' \(a str\), got 2 \(int\)"),
])
def test_loading_must_be_auto_threads_or_processes(value, error, said):
    with pytest.raises(error, match=said):
        DataLoader(list(range(4)), loading=value)
    with pytest.raises(error, match=said):
        StatefulDataLoader(list(range(4)), loading=value)
    assert inspect.signature(DataLoader).parameters["loading"].default == "auto"
