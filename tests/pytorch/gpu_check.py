"""The CUDA path of prefetch.torch, on a machine with a GPU (issue 12; SPEC §2, §3, §5).

Not a pytest file (the CI machines have no GPU): run it once where one is,

    PYTHONPATH=$PWD python tests/pytorch/gpu_check.py

It prints one PASS/FAIL line per check and exits 1 if any failed; it takes a
few seconds (well under 60 s).
"""
from __future__ import annotations

import gc
import itertools
import sys
import time
import traceback

import numpy as np
import torch

import prefetch
from prefetch import Prefetcher

failed: list[str] = []


def check(name, fn):
    t0 = time.perf_counter()
    try:
        detail = fn()
    except Exception:  # noqa: BLE001  (a failed check is reported, the others still run)
        failed.append(name)
        print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
        return
    print(f"PASS {name} ({time.perf_counter() - t0:.2f} s){': ' + detail if detail else ''}", flush=True)


DEV = torch.device("cuda", 0)


def refilling(n, bufs):
    """Refills every buffer in place with batch i (SPEC §3 rule 3) and yields them all."""
    for i in range(n):
        for b in bufs.values():
            if isinstance(b, np.ndarray):
                b[...] = i
            else:
                b.fill_(i)
        yield dict(bufs)


def values_and_non_aliasing():
    bufs = {
        "f32": torch.empty(1 << 20),                                   # 4 MB
        "bf16": torch.empty(3, 257, dtype=torch.bfloat16),
        "cl": torch.empty(2, 3, 16, 16).contiguous(memory_format=torch.channels_last),
        "strided": torch.empty(64, 64, dtype=torch.int64)[:, ::3],
        "np": np.empty((5, 7), np.float32),
        "bool": torch.empty(9, dtype=torch.bool),
    }
    with Prefetcher(refilling(12, bufs), depth=3, device=DEV) as p:
        got = list(p)   # the consumer keeps every batch
    assert len(got) == 12
    ptrs = set()
    for i, b in enumerate(got):
        for k, t in b.items():
            assert type(t) is torch.Tensor and t.device == DEV, (k, type(t), getattr(t, "device", None))
            want = bufs[k] if not isinstance(bufs[k], np.ndarray) else torch.from_numpy(bufs[k])
            assert t.shape == want.shape and t.dtype == want.dtype, (k, t.shape, t.dtype)
            expected = torch.full(want.shape, i, dtype=torch.float64).to(want.dtype)
            assert torch.equal(t.cpu(), expected), (k, i)
            ptrs.add(t.data_ptr())
    assert got[0]["cl"].is_contiguous(memory_format=torch.channels_last)
    assert len(ptrs) == 12 * len(bufs), "two delivered tensors share device memory"
    return "12 kept batches, 6 leaf kinds, all distinct device memory"


def complete_at_handout():
    """Read on another stream right after next(): only a complete copy passes."""
    src = torch.arange(1 << 22, dtype=torch.float32)   # 16 MB
    other = torch.cuda.Stream(DEV)
    with Prefetcher([src + i for i in range(6)], depth=4, device=DEV) as p:
        for i, t in enumerate(p):
            with torch.cuda.stream(other):
                ok = torch.equal(t, (src + i).to(DEV))
            assert ok, i


def cuda_leaf_is_cloned():
    src = torch.arange(1000, device=DEV, dtype=torch.float32)
    with Prefetcher([src], device=DEV) as p:
        (out,) = list(p)
    assert out.data_ptr() != src.data_ptr()
    src.fill_(-1)
    assert torch.equal(out.cpu(), torch.arange(1000, dtype=torch.float32))
    with Prefetcher([src]) as p:   # no device=: cloned on its own device
        (out,) = list(p)
    assert out.device == DEV and out.data_ptr() != src.data_ptr()
    src.fill_(5)
    assert torch.all(out == -1).item()


def close_frees_device_memory():
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(DEV)
    nbytes = 8 << 20
    src = torch.ones(nbytes // 4)
    p = Prefetcher(itertools.repeat(src), depth=4, device=DEV)
    kept = next(p)
    deadline = time.monotonic() + 10
    while p.stats().fill < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    queued = torch.cuda.memory_allocated(DEV) - base
    assert queued >= 5 * nbytes, f"expected 4 queued + 1 kept batch on the device, {queued} bytes"
    p.close()
    after = torch.cuda.memory_allocated(DEV) - base
    assert after == kept.untyped_storage().nbytes(), f"{after} bytes left after close(), 1 batch held"
    assert torch.all(kept == 1).item()
    del kept
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(DEV) == base
    return f"{queued >> 20} MiB queued, {after >> 20} MiB (the held batch) after close()"


def steady_state_allocates_nothing():
    src = torch.ones(1 << 18)
    with Prefetcher(itertools.repeat(src), depth=2, device=DEV) as p:
        for i in range(300):
            if i == 100:
                host, dev = p.stats().blocks_allocated, torch.cuda.memory_reserved(DEV)
            next(p)
        assert p.stats().blocks_allocated == host, "host pool grew in steady state"
        assert torch.cuda.memory_reserved(DEV) == dev, "device cache grew in steady state"


def dropin_pins_batches():
    from prefetch.torch import DataLoader

    class Pairs:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return np.full((3, 4), i, np.float32), i

    with DataLoader(Pairs(), batch_size=4, num_workers=2, pin_memory=True) as loader:
        batches = list(loader)
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(t.is_pinned() for x, y in batches for t in (x, y)), "a batch tensor is not pinned"
    for x, y in batches:
        assert torch.equal(x.to(DEV, non_blocking=True).cpu()[:, 0, 0], y.float())

    class Stream(torch.utils.data.IterableDataset):   # an IterableDataset's batches too
        def __iter__(self):
            info = prefetch.torch.get_worker_info()
            return (Pairs()[i] for i in range(info.id, 10, info.num_workers))

    with DataLoader(Stream(), batch_size=4, num_workers=2, pin_memory=True) as loader:
        batches = list(loader)
    assert sorted(v for b in batches for v in b[1].tolist()) == list(range(10))
    assert all(t.is_pinned() for x, y in batches for t in (x, y)), "an IterableDataset batch is not pinned"


def main():
    print(f"torch {torch.__version__}, prefetch {prefetch.__version__}, "
          f"cuda available: {torch.cuda.is_available()}", flush=True)
    if not torch.cuda.is_available():
        print("FAIL no CUDA device: run this on a machine with a GPU")
        return 1
    print(f"device: {torch.cuda.get_device_name(DEV)}", flush=True)
    t0 = time.perf_counter()
    check("values, dtypes, layouts and non-aliasing on cuda", values_and_non_aliasing)
    check("a batch is complete when next() returns it", complete_at_handout)
    check("a CUDA tensor leaf is cloned, not shared", cuda_leaf_is_cloned)
    check("close() returns device memory (torch.cuda.memory_allocated)", close_frees_device_memory)
    check("steady state allocates nothing (host pool, device cache)", steady_state_allocates_nothing)
    check("prefetch.torch.DataLoader(pin_memory=True) hands out pinned batches", dropin_pins_batches)
    print(f"{'FAIL' if failed else 'PASS'} all: {len(failed)} failed, {time.perf_counter() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
