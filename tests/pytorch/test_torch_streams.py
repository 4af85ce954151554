"""prefetch.torch.DataLoader over an IterableDataset, on the core's stream
Loader (SPEC §9 Streams): stats() as a map-style drop-in's, every state
along an epoch resuming the rest, a stream's error with the note a
map-style error carries."""
import copy

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import Dataset, IterableDataset  # noqa: E402

import prefetch.torch  # noqa: E402
from support import ShardedStream, torch_worker  # noqa: E402

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")]


class Sharded(ShardedStream, IterableDataset):
    """Worker w reads its own span of ``sizes`` (by torch's get_worker_info()) through a stateful iterator."""

    worker = staticmethod(torch_worker)


class Numbers(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return i


def test_a_streams_stats_count_batches_and_samples_as_a_map_style_drop_in():
    """They counted the worker threads' tasks: consumed=12 or 13 after 10 batches of 4."""
    with prefetch.torch.DataLoader(Sharded([20, 20]), batch_size=4, num_workers=2) as stream, \
            prefetch.torch.DataLoader(Numbers(), batch_size=4, num_workers=2) as mapped:
        assert len(list(stream)) == len(list(mapped)) == 10
        s, m = stream.stats(), mapped.stats()
    assert (s.consumed, s.samples) == (m.consumed, m.samples) == (10, 40)


def test_every_state_along_an_epoch_resumes_the_rest_after_a_workers_short_last_batch():
    """A state taken once a worker's short last batch was handed out resumed
    by reading that worker's whole shard again (6 of 8 states)."""
    def make():
        return prefetch.torch.StatefulDataLoader(Sharded([10, 13]), batch_size=4, num_workers=2)

    with make() as loader:
        whole = [b.tolist() for b in loader]
    assert len(whole) == 7
    for k in range(len(whole) + 1):
        with make() as loader:
            it = iter(loader)
            got = [next(it).tolist() for _ in range(k)]
            state = copy.deepcopy(loader.state_dict())
        with make() as resumed:
            resumed.load_state_dict(state)
            assert got + [b.tolist() for b in resumed] == whole, k


class Breaks(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(6):
            if info.id == 1 and i == 2:
                raise OSError("bad record")
            yield i


def test_a_streams_error_carries_the_note_a_map_style_error_does():
    """An error from the stream's __next__ reached the user with no note."""
    with prefetch.torch.DataLoader(Breaks(), batch_size=2, num_workers=2) as loader:
        it = iter(loader)
        assert [next(it).tolist() for _ in range(3)] == [[0, 1], [0, 1], [2, 3]]
        with pytest.raises(OSError, match="bad record") as caught:
            next(it)
        # As torch's: the epoch goes on with the workers still running.
        assert [b.tolist() for b in it] == [[4, 5]]
    assert caught.value.__notes__ == [
        "raised in loader thread torch-DataLoader-w1 while reading batch 2 of worker 1's stream (counted from 1)"]
