"""Under torch.distributed (issue 25 item 4; SPEC §9: a sampler with set_epoch
shards a data set, one Loader per rank): two ranks on this machine (gloo,
loopback only) train a small model with DistributedDataParallel, fed by torch's
DataLoader, by prefetch.torch.DataLoader and by prefetch.Loader, each with a
DistributedSampler. Each rank is a fresh interpreter with a deadline; the
rendezvous store is bound by this process on port 0 (the kernel picks a free
port, so no other process can take it between choosing and binding), and a
machine that cannot bind loopback ports skips with the reason."""

import datetime
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from support import assert_same  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEADLINE_S = 90  # for all the ranks of one run together; each rank's collectives time out sooner

# One rank: the same training run three times, each fed by one loader; it saves
# every batch it trained on and the final weights for the test to compare.
_RANK = r'''
import datetime, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data.distributed import DistributedSampler
import prefetch
import prefetch.torch

rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
N, BATCH, EPOCHS = 46, 5, 3   # 23 samples a rank: 4 batches of 5 and one of 3

class Points:
    """A linear regression set: (x, y, index) per sample, x and y tensors."""
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(N, 4, generator=g)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(N, 1, generator=g)
    def __len__(self):
        return N
    def __getitem__(self, i):
        return self.x[i], self.y[i], i

timeout = datetime.timedelta(seconds=30)
store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)

def train(make_loader):
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sampler = DistributedSampler(Points(), num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = make_loader(Points(), sampler)
    seen = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        batches = []
        for x, y, i in loader:
            batches.append((x, y, torch.as_tensor(i)))   # a Loader's numbers come as numpy
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        seen.append(batches)
    if hasattr(loader, "close"):
        loader.close()
    return {"batches": seen, "weights": [p.detach().clone() for p in model.module.parameters()]}

runs = {
    "torch": train(lambda ds, s: TorchLoader(ds, batch_size=BATCH, sampler=s)),
    "prefetch.torch": train(lambda ds, s: prefetch.torch.DataLoader(ds, batch_size=BATCH, sampler=s,
                                                                    num_workers=2)),
    "prefetch.Loader": train(lambda ds, s: prefetch.Loader(ds, BATCH, sampler=s, workers=2)),
}
torch.manual_seed(0)
runs["initial"] = [p.detach().clone() for p in torch.nn.Linear(4, 1).parameters()]
torch.save(runs, out)
dist.destroy_process_group()
'''


pytestmark = pytest.mark.full  # the long tier (tests/run.sh --full)


def _loopback_env():
    """Gloo on the loopback interface only (its own ports are bound on 0)."""
    names = [n for _, n in socket.if_nameindex() if n.startswith("lo")]
    if not names:
        pytest.skip("no loopback interface for gloo")
    return dict(os.environ, GLOO_SOCKET_IFNAME=names[0], PYTHONFAULTHANDLER="1")


def _rendezvous_store():
    """The store the ranks meet at, bound here on 127.0.0.1 port 0."""
    try:
        return dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30)
        )
    except Exception as e:  # noqa: BLE001 (any failure to bind is this machine's, not the product's)
        pytest.skip(f"cannot bind a loopback port for the rendezvous: {e!r}")


def _run_ranks(argvs, env):
    """Start one process per argv (each in a session of its own) and wait for
    all, within DEADLINE_S together; past it every group is killed and the test
    fails. Returns [(returncode, stdout, stderr)]."""
    procs = [
        subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),
            start_new_session=True,
        )
        for argv in argvs
    ]
    end = time.monotonic() + DEADLINE_S
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(0.1, end - time.monotonic()))
            results.append((p.returncode, out, err))
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
        pytest.fail(f"the ranks did not finish within {DEADLINE_S} s: {[p.args for p in procs]}")
    return results


def _indices(batches):
    return [int(i) for _, _, idx in batches for i in idx]


@pytest.mark.timeout(DEADLINE_S + 30)
def test_ddp_two_ranks_fed_by_prefetch_train_as_with_torchs_dataloader(tmp_path):
    """Issue 25 item 4, SPEC §9: each rank's batches from prefetch.torch.DataLoader
    and from prefetch.Loader equal those torch's DataLoader gives that rank (same
    DistributedSampler, same epoch); the ranks' shards are disjoint and cover the
    data set; the shuffle differs across epochs; the final weights are
    torch.equal to those of the run fed by torch's DataLoader. Equal, not close:
    the same batches in the same order on the same CPU kernels, with gloo's
    all-reduce over the same two ranks, make the same float operations, so any
    difference is a batch that differed."""
    env = _loopback_env()
    store = _rendezvous_store()
    try:
        outs = [str(tmp_path / f"rank{r}.pt") for r in range(2)]
        results = _run_ranks(
            [[sys.executable, "-c", _RANK, str(r), "2", str(store.port), outs[r]] for r in range(2)], env
        )
    finally:
        del store
    for r, (rc, out, err) in enumerate(results):
        assert rc == 0, f"rank {r} exited {rc}:\n{out}\n{err}"
    runs = [torch.load(o, weights_only=True) for o in outs]

    for r, run in enumerate(runs):
        theirs = run["torch"]["batches"]
        for name in ("prefetch.torch", "prefetch.Loader"):
            assert len(run[name]["batches"]) == len(theirs) == 3
            for epoch, (ours_e, theirs_e) in enumerate(zip(run[name]["batches"], theirs)):
                assert [len(i) for _, _, i in theirs_e] == [5, 5, 5, 5, 3]
                assert_same(ours_e, theirs_e, f"rank {r} {name} epoch {epoch}")
        orders = [_indices(e) for e in theirs]
        assert len({tuple(o) for o in orders}) == 3, f"rank {r}: an epoch repeated the shuffle: {orders}"

    for epoch in range(3):
        shards = [_indices(run["torch"]["batches"][epoch]) for run in runs]
        assert not set(shards[0]) & set(shards[1]), f"epoch {epoch}: the shards overlap: {shards}"
        assert sorted(shards[0] + shards[1]) == list(range(46)), f"epoch {epoch}: {shards}"

    theirs = runs[0]["torch"]["weights"]
    assert not all(torch.equal(a, b) for a, b in zip(theirs, runs[0]["initial"])), "nothing was trained"
    for r, run in enumerate(runs):
        for name in ("torch", "prefetch.torch", "prefetch.Loader"):
            ours = run[name]["weights"]
            assert all(torch.equal(a, b) for a, b in zip(ours, theirs)), (
                f"rank {r} {name}: {ours} != {theirs}"
            )


def test_the_rendezvous_skips_with_the_reason_where_loopback_cannot_be_bound(monkeypatch):
    """Issue 25 (bad input): a machine that cannot bind a loopback port skips
    the distributed tests, saying why, rather than hanging or failing."""

    def refuse(*args, **kwargs):
        raise RuntimeError("The server socket has failed to bind.")

    monkeypatch.setattr(dist, "TCPStore", refuse)
    with pytest.raises(pytest.skip.Exception, match="cannot bind a loopback port.*failed to bind"):
        _rendezvous_store()


# -- the guide's torchrun script (docs/pytorch.md), as torchrun runs it ------------

# What the guide's script leaves to the reader (dataset, net, step), defined
# before it; after it, each rank saves which samples it trained on and its weights.
_README_BEFORE = r"""
import numpy as np
import torch

_X = np.random.default_rng(0).standard_normal((200, 4)).astype(np.float32)

class Points:
    def __len__(self):
        return len(_X)
    def __getitem__(self, i):
        return _X[i], _X[i, :1] * 2 - _X[i, 1:2]

dataset, net = Points(), torch.nn.Linear(4, 1)
_opt, _seen = None, []

def step(model, x, y):
    global _opt
    _opt = _opt or torch.optim.SGD(model.parameters(), lr=0.05)
    _seen.append(x.clone())
    _opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    _opt.step()
"""

_README_AFTER = r"""
_rows = {tuple(r.tolist()): i for i, r in enumerate(_X)}
torch.save({"indices": [[_rows[tuple(r.tolist())] for r in x] for x in _seen],
            "weights": [p.detach() for p in model.module.parameters()]},
           os.path.join(os.environ["PF_OUT"], f"rank{dist.get_rank()}.pt"))
dist.destroy_process_group()
"""


def _readme_example():
    """The first python block under docs/pytorch.md's "Several processes (torch.distributed)"
    (the README's section links to it)."""
    path = os.path.join(ROOT, "docs", "pytorch.md")
    if not os.path.exists(path):
        pytest.skip("docs/pytorch.md is not in this tree (an installed wheel)")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^## Several processes \(torch.distributed\)\n.*?^```python\n(.*?)^```", text,
                  flags=re.S | re.M)
    assert m, "docs/pytorch.md: no python example under '## Several processes (torch.distributed)'"
    return m.group(1)


@pytest.mark.timeout(DEADLINE_S + 30)
def test_the_guides_script_trains_under_torchrun(tmp_path):
    """Issue 25 item 4: the guide's script (docs/pytorch.md; the README links
    to it), run by torchrun (--standalone: its rendezvous binds port 0 on localhost) as two CPU processes on gloo: each
    epoch, the two processes' samples are disjoint and cover the data set, and
    the processes end with the same weights (DistributedDataParallel kept them
    in step)."""
    env = dict(_loopback_env(), PF_OUT=str(tmp_path), OMP_NUM_THREADS="1")
    _rendezvous_store()  # a probe, dropped at once: skips where loopback ports cannot be bound
    script = tmp_path / "train.py"
    script.write_text(_README_BEFORE + _readme_example() + _README_AFTER)
    ((rc, out, err),) = _run_ranks(
        [[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]],
        env,
    )
    assert rc == 0, f"torchrun exited {rc}:\n{out}\n{err}"
    runs = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    per_epoch = [len(run["indices"]) // 10 for run in runs]
    assert per_epoch == [2, 2] and all(len(run["indices"]) == 20 for run in runs), per_epoch
    for epoch in range(10):
        shards = [sum(run["indices"][2 * epoch : 2 * epoch + 2], []) for run in runs]
        assert not set(shards[0]) & set(shards[1]), f"epoch {epoch}: the shards overlap: {shards}"
        assert sorted(shards[0] + shards[1]) == list(range(200)), f"epoch {epoch}: {shards}"
    firsts = {tuple(runs[0]["indices"][2 * e]) for e in range(10)}
    assert len(firsts) == 10, "rank 0 had the same first batch in two epochs: no new shuffle"
    assert all(torch.equal(a, b) for a, b in zip(*(run["weights"] for run in runs)))
