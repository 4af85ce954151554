"""The torch drop-in inside the frameworks that build loaders for the user
(issue 33): prefetch.torch.patch() and its undo; Accelerate's prepare() after
patch() loading on threads of the training process, every sample once; and
Lightning's Trainer keeping the drop-in, with one device and with DDP on 2 CPU
ranks (gloo, loopback), each rank's samples those of torch's own loader.

The frameworks are installed in the torch test environment (tests/venvs.sh,
the test-frameworks extra); where one is missing its tests skip, saying so."""
import json
import os
import sys
import threading
import types

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader as TorchLoader  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

import prefetch.torch  # noqa: E402
from prefetch.torch import DataLoader  # noqa: E402
from support import run_script  # noqa: E402


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
    matter) and gets its own name back after."""
    import torch.utils.data.dataloader as home
    original = torch.utils.data.DataLoader
    early = types.ModuleType("imported_before_patch")   # `from torch.utils.data import DataLoader`
    early.Loader = original
    sys.modules[early.__name__] = early
    try:
        stateful = pytest.importorskip("torchdata.stateful_dataloader")
        torchdata_original = stateful.StatefulDataLoader
        assert prefetch.torch.patch() is DataLoader
        assert prefetch.torch.patch() is DataLoader   # twice: no double wrapping
        assert torch.utils.data.DataLoader is DataLoader and home.DataLoader is DataLoader
        assert early.Loader is DataLoader
        assert stateful.StatefulDataLoader is DataLoader
        assert DataLoader.__mro__[1] is original       # the drop-in itself still derives from torch's
        made = torch.utils.data.DataLoader(list(range(6)), batch_size=3, num_workers=2)
        assert type(made) is DataLoader and [b.tolist() for b in made] == [[0, 1, 2], [3, 4, 5]]
        made.close()
        prefetch.torch.unpatch()
        prefetch.torch.unpatch()                       # twice: a no-op
        assert torch.utils.data.DataLoader is original and home.DataLoader is original
        assert early.Loader is original and stateful.StatefulDataLoader is torchdata_original
    finally:
        prefetch.torch.unpatch()
        del sys.modules[early.__name__]


def test_an_argument_the_drop_in_refuses_fails_the_frameworks_call(patched):
    """Bad input: a loader rebuilt with an argument the drop-in does not accept
    fails in that call, naming it; never a silent fall-back to processes."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    with pytest.raises(TypeError, match="snapshot_every_n_steps"):
        stateful.StatefulDataLoader(list(range(4)), batch_size=2, snapshot_every_n_steps=2)


# -- Accelerate ------------------------------------------------------------------------

def test_accelerates_prepare_after_patch_loads_on_threads_of_this_process_every_sample_once(patched):
    accelerate = pytest.importorskip("accelerate", reason="Accelerate is not installed")
    ds = Recorded(40)
    loader = TorchLoader(ds, batch_size=4, shuffle=True, num_workers=2)   # a script's own loader
    prepared = accelerate.Accelerator(cpu=True).prepare(loader)
    assert isinstance(prepared.base_dataloader, DataLoader)   # Accelerate rebuilt it: the drop-in
    got = [int(x) for b in prepared for x in b.flatten()]
    assert sorted(got) == list(range(40))
    assert {pid for _, pid, _ in ds.calls} == {os.getpid()}
    assert {name.rpartition("-w")[0] for _, _, name in ds.calls} == {"torch-DataLoader"}
    prepared.base_dataloader.close()


def test_accelerates_stateful_prepare_resumes_through_its_own_state_dict(patched):
    """Accelerate's own save/load of a loader's state (use_stateful_dataloader,
    which builds torchdata's class: the drop-in after patch())."""
    accelerate = pytest.importorskip("accelerate", reason="Accelerate is not installed")
    pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    from accelerate.utils import DataLoaderConfiguration

    def prepared(seed):
        torch.manual_seed(seed)
        config = DataLoaderConfiguration(use_stateful_dataloader=True)
        acc = accelerate.Accelerator(cpu=True, dataloader_config=config)
        return acc.prepare(TorchLoader(Recorded(24), batch_size=4, shuffle=True, num_workers=2))

    whole = prepared(7)
    assert isinstance(whole.base_dataloader, DataLoader)
    expected = [b.flatten().tolist() for b in whole]
    first = prepared(7)
    it = iter(first)
    head = [next(it).flatten().tolist() for _ in range(3)]
    state = first.state_dict()
    json.dumps(state)
    resumed = prepared(99)   # another global seed: the state restores the order
    resumed.load_state_dict(state)
    rest = [b.flatten().tolist() for b in resumed]
    assert head + rest == expected
    for p in (whole, first, resumed):
        p.base_dataloader.close()


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
    pytest.importorskip("lightning", reason="Lightning is not installed")
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
