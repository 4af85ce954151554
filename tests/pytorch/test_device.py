"""device=torch.device(...) (SPEC §2, §5, issue 12). This machine has no GPU:
the CUDA path is checked by tests/pytorch/gpu_check.py on a machine with one;
here, that it refuses clearly when CUDA is unavailable."""
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from prefetch import Prefetcher  # noqa: E402


def test_cpu_device_delivers_tensors():
    """device=cpu: tensor leaves as copied, numpy leaves as tensors over their
    fresh pool block; arrays torch cannot hold stay numpy; plain values pass."""
    src = torch.arange(6.0).reshape(2, 3)
    batch = {"t": src, "n": np.arange(4, dtype=np.int16), "s": np.array(["a", "b"]),
             "be": np.arange(3, dtype=">i4"), "k": 3}
    with Prefetcher([batch, batch], device=torch.device("cpu")) as p:
        a, b = list(p)
    for out in (a, b):
        assert type(out["t"]) is torch.Tensor and torch.equal(out["t"], src)
        assert out["t"].data_ptr() != src.data_ptr()
        assert type(out["n"]) is torch.Tensor and out["n"].dtype == torch.int16
        assert out["n"].tolist() == [0, 1, 2, 3]
        assert out["n"].data_ptr() != batch["n"].ctypes.data
        assert type(out["s"]) is np.ndarray and out["s"].tolist() == ["a", "b"]
        assert type(out["be"]) is np.ndarray and out["be"].tolist() == [0, 1, 2]
        assert out["k"] == 3
    assert a["n"].data_ptr() != b["n"].data_ptr()


def test_cpu_device_pool_reuse():
    """§5 with device=cpu: the tensors made of numpy leaves keep their blocks,
    and the pool reuses them once torch frees them."""
    src = np.ones(10_000, np.float32)
    with Prefetcher(itertools.repeat(src), depth=2, device=torch.device("cpu")) as p:
        for _ in range(130):
            assert next(p).sum().item() == 10_000
        s = p.stats()
        # Never more blocks than the batches that can be out at once (depth + the one being
        # filled + the one the loop holds, + 1 while it is being freed), however the threads
        # were scheduled: a count taken after a warm-up was not a bound (a stall later could
        # fill the ring for the first time, which CI saw once).
        assert s.blocks_allocated <= 2 + 3, s
        assert s.blocks_allocated + s.blocks_reused >= 130, s


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal when CUDA is missing")
@pytest.mark.parametrize("dev", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_fails_at_construction(dev):
    """§2: a clear ValueError in the constructor, naming the value; no thread started."""
    with pytest.raises(ValueError, match=r"device=device\(type='cuda'.*CUDA is not available"):
        Prefetcher([torch.ones(2)], device=torch.device(dev))


@pytest.mark.parametrize("dev", ["meta", "mps"])
def test_other_device_types_are_refused(dev):
    with pytest.raises(ValueError, match=rf"device=device\(type='{dev}'\).*'cpu' and 'cuda' devices only"):
        Prefetcher([torch.ones(2)], device=torch.device(dev))


def test_device_string_is_refused_naming_it():
    """device= takes a torch.device, not a string: the TypeError names the value and what
    to pass instead (issue 19)."""
    with pytest.raises(TypeError, match=r"not the string 'cuda': pass torch\.device\('cuda'\)"):
        Prefetcher([torch.ones(2)], device="cuda")
    with pytest.raises(TypeError, match=r"not the string 'cpu': pass torch\.device\('cpu'\)"):
        Prefetcher([torch.ones(2)], device="cpu")
