"""The torch drop-in keeps torch's epoch idiom (SPEC §9 Resume; issue 24
item 2): the user's sampler.set_epoch(e) decides the order, whatever the
Loader underneath counts."""
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader as TorchLoader  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

from prefetch.torch import DataLoader  # noqa: E402


@pytest.mark.parametrize("persistent", [False, True])
def test_the_users_set_epoch_on_a_distributed_sampler_wins(persistent):
    data = list(range(40))
    ours = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    theirs = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    with DataLoader(data, batch_size=4, sampler=ours, num_workers=2, persistent_workers=persistent) as loader:
        reference = TorchLoader(data, batch_size=4, sampler=theirs)
        seen = []
        for epoch in (5, 6, 5):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            got = [b.tolist() for b in loader]
            assert got == [b.tolist() for b in reference]
            seen.append(got)
    assert seen[0] == seen[2] != seen[1]


# -- item 1: state_dict()/load_state_dict() with torchdata's names ------------------

import io  # noqa: E402
import json  # noqa: E402

from torch.utils.data import Dataset  # noqa: E402

from prefetch.torch import get_worker_info  # noqa: E402


class Seeds(Dataset):
    """Item i and the base seed its thread was given (torch's base_seed)."""

    def __len__(self):
        return 22

    def __getitem__(self, i):
        info = get_worker_info()
        return torch.tensor([i, info.seed - info.id])


def run(generator, persistent, epochs, state=None, stop=None, global_rng=None):
    """Batches of `epochs` epochs, as lists; with `stop` (epoch, batch): the
    state once that batch was handed out, and torch's global generator's."""
    if global_rng is None:
        torch.manual_seed(0)
    else:
        torch.set_rng_state(global_rng)
    g = None if generator is None else torch.Generator().manual_seed(generator)
    loader = DataLoader(Seeds(), batch_size=4, shuffle=True, generator=g, num_workers=2,
                        persistent_workers=persistent)
    with loader:
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for epoch in range(epochs):
            for b, batch in enumerate(loader):
                out.append(batch.tolist())
                if stop == (epoch, b):
                    return loader.state_dict(), torch.get_rng_state()
    return out


@pytest.mark.parametrize("generator", [None, 7])
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("stop", [(0, 0), (1, 2), (1, 5)])
def test_resume_hands_out_what_an_uninterrupted_run_hands_out_next(generator, persistent, stop):
    whole = run(generator, persistent, 3)
    assert whole[:6] != whole[6:12]   # shuffled per epoch
    state, global_rng = run(generator, persistent, 3, stop=stop)
    buffer = io.BytesIO()
    torch.save({"loader": state, "model": torch.zeros(2)}, buffer)   # beside a model's
    buffer.seek(0)
    state = json.loads(json.dumps(torch.load(buffer)["loader"]))
    done = stop[0] * 6 + stop[1] + 1
    rest = run(generator, persistent, 3 - stop[0], state=state, global_rng=global_rng)
    assert rest == whole[done:]


def test_a_state_that_does_not_fit_is_a_clear_error():
    state, _ = run(7, False, 1, stop=(0, 1))
    with DataLoader(list(range(30)), batch_size=4, shuffle=True) as loader:
        with pytest.raises(ValueError, match="dataset of length 22; this DataLoader's has length 30"):
            loader.load_state_dict(state)
    with DataLoader(Seeds(), batch_size=5, shuffle=True, num_workers=2, persistent_workers=True) as loader:
        check_refusals(loader, state)


def check_refusals(loader, state):
    with pytest.raises(ValueError, match="batch_size=4; this DataLoader has batch_size=5"):
        loader.load_state_dict(state)
    with pytest.raises(ValueError, match="version 1; this version of prefetch reads version 3"):
        loader.load_state_dict(dict(state, version=1))
    with pytest.raises(ValueError, match="lacks 'batches'"):
        loader.load_state_dict({k: v for k, v in state.items() if k != "batches"})
    assert len(list(loader)) == 5   # still usable


# -- item 4: killed with SIGKILL after torch.save, resumed in a new process ----------

import signal  # noqa: E402

from support import run_python  # noqa: E402

CHILD = r"""
import os, signal
import torch
from torch.utils.data import Dataset
from prefetch.torch import DataLoader, get_worker_info

state_path, log_path, kill_at = {state!r}, {log!r}, {kill_at!r}

class Seeds(Dataset):
    def __len__(self):
        return 22
    def __getitem__(self, i):
        info = get_worker_info()
        return torch.tensor([i, info.seed - info.id])

loader = DataLoader(Seeds(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7),
                    num_workers=2)
start, logged = 0, 0
if os.path.exists(state_path):
    saved = torch.load(state_path)
    loader.load_state_dict(saved["loader"])
    start, logged = saved["epoch"], saved["logged"]
log = open(log_path, "a")
for epoch in range(start, 3):
    for batch in loader:
        log.write(repr(batch.tolist()) + "\n")
        log.flush()
        logged += 1
        if logged % 4 == 0:   # a checkpoint beside a model's, written atomically
            torch.save({{"loader": loader.state_dict(), "epoch": epoch, "logged": logged,
                        "model": torch.zeros(3)}}, state_path + ".tmp")
            os.replace(state_path + ".tmp", state_path)
        if logged == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
loader.close()
"""


@pytest.mark.timeout(120)
@pytest.mark.full
def test_a_run_killed_after_torch_save_resumes_exactly_in_a_new_process(tmp_path):
    """Issue 24 item 4: 6 batches per epoch, a checkpoint every 4th batch; killed
    with SIGKILL after batch 11 (epoch 1, 5 batches in; the last checkpoint
    after batch 8): the new process delivers what the uninterrupted run
    delivered from batch 9 on, generator-drawn seeds included."""
    def child(tag, kill_at):
        code = CHILD.format(state=str(tmp_path / f"{tag}.pt"), log=str(tmp_path / f"{tag}.log"),
                            kill_at=kill_at)
        return run_python(code, timeout=50)

    def log(tag):
        return (tmp_path / f"{tag}.log").read_text().splitlines()

    whole = [repr(b) for b in run(7, False, 3)]   # the same loader, uninterrupted, here
    assert len(whole) == 18 and whole[:6] != whole[6:12]
    killed = child("run", kill_at=11)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert log("run") == whole[:11]
    # Batches 9 to 11 were delivered after the last checkpoint: the restart delivers them again.
    (tmp_path / "run.log").write_text("\n".join(log("run")[:8]) + "\n")
    restarted = child("run", kill_at=-1)
    assert restarted.returncode == 0, restarted.stderr
    assert log("run") == whole
