"""The torch drop-in inside the frameworks that build loaders for the user
(issue 33): prefetch.torch.patch() and its undo; Accelerate's prepare() after
patch() loading on threads of the training process, every sample once; and
Lightning's Trainer keeping the drop-in, with one device and with DDP on 2 CPU
ranks (gloo, loopback), each rank's samples those of torch's own loader.

The frameworks are installed in the torch test environment (tests/venvs.sh,
the test-frameworks extra); where one is missing its tests skip, saying so."""
import importlib.util
import json
import os
import sys
import threading
import types

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import Dataset  # noqa: E402

import prefetch.torch  # noqa: E402
from prefetch.torch import DataLoader  # noqa: E402
from support import run_script  # noqa: E402

pytestmark = pytest.mark.full  # the long tier (tests/run.sh --full)


class Recorded(Dataset):
    """dataset[i] is a float tensor [i]; each call is recorded with the process and thread that made it."""

    def __init__(self, n):
        self.n = n
        self.calls = []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.calls.append((i, os.getpid(), threading.current_thread().name))
        return torch.tensor([float(i)])


@pytest.fixture
def patched():
    yield prefetch.torch.patch()
    prefetch.torch.unpatch()


# -- patch() and unpatch() ----------------------------------------------------------

def test_patch_replaces_torchs_class_everywhere_and_unpatch_restores_each_name_also_twice():
    """Target: patch() then unpatch() leaves torch's and torchdata's classes as
    they were (identity), also when each is called twice; a module that
    imported the class before patch() sees the drop-in (import order does not
    matter) and gets its own name back after. The module defining the class
    keeps it (pickle finds torch's class there by name)."""
    import torch.utils.data.dataloader as home
    original = torch.utils.data.DataLoader
    early = types.ModuleType("imported_before_patch")   # `from torch.utils.data import DataLoader`
    early.DataLoader = original
    sys.modules[early.__name__] = early
    try:
        stateful = pytest.importorskip("torchdata.stateful_dataloader")
        torchdata_original = stateful.StatefulDataLoader
        before = original(list(range(4)), batch_size=2)   # a loader made before the patch
        stand_in = prefetch.torch.patch()
        assert prefetch.torch.patch() is stand_in      # twice: no double wrapping
        assert torch.utils.data.DataLoader is stand_in and home.DataLoader is original
        assert early.DataLoader is stand_in
        assert stateful.StatefulDataLoader is not torchdata_original
        for cls in (stand_in, stateful.StatefulDataLoader):
            made = cls(list(range(6)), batch_size=3, num_workers=2)
            assert isinstance(made, DataLoader) and [b.tolist() for b in made] == [[0, 1, 2], [3, 4, 5]]
            made.close()
        # A library's isinstance check still knows torch's loaders (Accelerate's prepare() asks).
        assert isinstance(before, torch.utils.data.DataLoader) and isinstance(made, stateful.StatefulDataLoader)
        assert issubclass(original, torch.utils.data.DataLoader)
        assert DataLoader.__mro__[1] is original       # the drop-in itself still derives from torch's
        prefetch.torch.unpatch()
        prefetch.torch.unpatch()                       # twice: a no-op
        assert torch.utils.data.DataLoader is original and home.DataLoader is original
        assert early.DataLoader is original and stateful.StatefulDataLoader is torchdata_original
    finally:
        prefetch.torch.unpatch()
        del sys.modules[early.__name__]


def test_an_argument_the_drop_in_refuses_fails_the_frameworks_call(patched):
    """Bad input: a loader rebuilt with an argument the drop-in does not accept
    fails in that call, naming it; never a silent fall-back to processes."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    with pytest.raises(TypeError, match="snapshot_every_n_steps must be an int >= 0, got 'often'"):
        stateful.StatefulDataLoader(list(range(4)), batch_size=2, snapshot_every_n_steps="often")
    with pytest.raises(TypeError, match="sampler_every"):
        stateful.StatefulDataLoader(list(range(4)), batch_size=2, sampler_every=2)
    assert stateful.StatefulDataLoader(list(range(4)), snapshot_every_n_steps=2).snapshot_every_n_steps == 2


# -- Accelerate ------------------------------------------------------------------------
# In processes of their own, and not even imported here to see whether they are installed:
# importing Accelerate or Lightning into this process grew its heap, and every later test's
# garbage collection with it (the torch suite took 100 s longer).

_ACCELERATE = """
import json, os, sys, threading
import torch
import accelerate                      # imported first, as a script's imports are
from accelerate.utils import DataLoaderConfiguration
import prefetch.torch

class Recorded(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n, self.calls = n, []
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        self.calls.append((os.getpid(), threading.current_thread().name))
        return torch.tensor([float(i)])

def prepared(loader, **config):
    return accelerate.Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config)).prepare(loader)

def stateful(n, seed):
    torch.manual_seed(seed)
    loader = torch.utils.data.DataLoader(Recorded(n), batch_size=4, shuffle=True, num_workers=2)
    return prepared(loader, use_stateful_dataloader=True)

out = {}
ds = Recorded(40)
mine = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)   # before patch()
prefetch.torch.patch()
p = prepared(mine)
out["kind"] = isinstance(p.base_dataloader, prefetch.torch.DataLoader)
out["seen"] = sorted(int(x) for b in p for x in b.flatten())
out["where"] = sorted({(pid == os.getpid(), name.rpartition("-w")[0]) for pid, name in ds.calls})
p.base_dataloader.close()
if sys.argv[1] == "stateful":
    whole = stateful(24, 7)
    out["stateful_kind"] = isinstance(whole.base_dataloader, prefetch.torch.DataLoader)
    expected = [b.flatten().tolist() for b in whole]
    first = stateful(24, 7)
    it = iter(first)
    head = [next(it).flatten().tolist() for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))   # as saved to a file
    resumed = stateful(24, 99)   # another global seed: the state restores the order
    resumed.load_state_dict(state)
    rest = [b.flatten().tolist() for b in resumed]
    out["resumed"] = [head, rest, expected]
    for q in (whole, first, resumed):
        q.base_dataloader.close()
print(json.dumps(out))
"""


def _installed(name, what):
    """Skip unless ``name`` is installed; found without importing it here (see above)."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{what} is not installed")


def _accelerate(tmp_path, what):
    _installed("accelerate", "Accelerate")
    script = tmp_path / "prepare.py"
    script.write_text(_ACCELERATE)
    r = run_script(str(script), [what], timeout=110)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.timeout(120)
def test_accelerates_prepare_after_patch_loads_on_threads_of_this_process_every_sample_once(tmp_path):
    """A torch loader made before patch(), Accelerate imported before it too:
    prepare() rebuilds it as the drop-in, which loads every sample once on
    threads of the training process."""
    got = _accelerate(tmp_path, "prepare")
    assert got["kind"] is True, got
    assert got["seen"] == list(range(40))
    assert got["where"] == [[True, "torch-DataLoader"]], got


@pytest.mark.timeout(120)
def test_accelerates_stateful_prepare_resumes_through_its_own_state_dict(tmp_path):
    """Accelerate's own save/load of a loader's state (use_stateful_dataloader,
    which builds torchdata's class: the drop-in after patch())."""
    _installed("torchdata", "torchdata")
    got = _accelerate(tmp_path, "stateful")
    assert got["stateful_kind"] is True, got
    head, rest, expected = got["resumed"]
    assert len(head) == 3 and head + rest == expected


# -- Lightning ---------------------------------------------------------------------------

_LIGHTNING = """
import json, os, sys, threading
import torch
import lightning as L
from torch.utils.data import Dataset
if sys.argv[3] == "prefetch":
    from prefetch.torch import DataLoader
    workers = 2
else:   # torch's own, for its samples (they do not depend on num_workers)
    from torch.utils.data import DataLoader
    workers = 0

class Recorded(Dataset):
    def __len__(self):
        return 24
    def __getitem__(self, i):
        return torch.tensor([float(i)]), os.getpid(), threading.current_thread().name

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen, self.where = [], set()
    def training_step(self, batch, i):
        x, pids, names = batch
        self.seen += [int(v) for v in x.flatten()]
        self.where |= {(int(p), n.rpartition("-w")[0]) for p, n in zip(pids, names)}
        return self.layer(x).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
    def train_dataloader(self):
        return DataLoader(Recorded(), batch_size=4, shuffle=True, num_workers=workers)

devices = int(sys.argv[1])
L.seed_everything(3)
trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                    max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
model = Model()
trainer.fit(model)
out = dict(rank=trainer.global_rank, seen=model.seen, kind=type(trainer.train_dataloader).__module__,
           sampler=type(trainer.train_dataloader.sampler).__name__,
           where=sorted(model.where), pid=os.getpid())
with open(os.path.join(sys.argv[2], f"{sys.argv[3]}{trainer.global_rank}.json"), "w") as f:
    json.dump(out, f)
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("devices", [1, 2])
def test_lightnings_trainer_keeps_the_drop_in_and_each_rank_gets_torchs_samples(devices, tmp_path):
    """One device, and DDP on 2 CPU ranks (gloo, loopback): Lightning
    re-instantiates the loader with a DistributedSampler; it stays the
    drop-in, loads on threads of each rank's own process, and each rank
    trains on the samples, in the order, that torch's own loader gives that
    rank in the same script."""
    _installed("lightning", "Lightning")
    script = tmp_path / "train.py"
    script.write_text(_LIGHTNING)
    for loader in ("prefetch", "torch"):
        # A script file: Lightning's DDP launcher starts rank 1 by running the same command again.
        r = run_script(str(script), [str(devices), str(tmp_path), loader], timeout=110)
        assert r.returncode == 0, r.stderr[-4000:]
    for rank in range(devices):
        ours, theirs = (json.loads((tmp_path / f"{loader}{rank}.json").read_text()) for loader in ("prefetch", "torch"))
        assert ours["kind"] == "prefetch.torch._dataloader", ours
        assert ours["where"] == [[ours["pid"], "torch-DataLoader"]], ours   # threads of the rank's process
        assert ours["sampler"] == theirs["sampler"] == ("DistributedSampler" if devices > 1 else "RandomSampler")
        assert sorted(ours["seen"]) == sorted(theirs["seen"]) and len(ours["seen"]) == 24 // devices
        assert ours["seen"] == theirs["seen"], rank
