"""prefetch.Loader over an iterable dataset (SPEC §9 Streams): each thread
one worker iterating its own replica, batches in turn from the workers still
running, on the map stage's epoch, error notes, stats() and state parts."""
import copy
import threading

import numpy as np
import pytest

import prefetch
from prefetch import Loader
from support import ShardedStream as Sharded

pytestmark = pytest.mark.timeout(60)


def _in_turn(spans, batch_size):
    """torch's order: one batch of each worker still running, in turn."""
    batches = [[list(s[i:i + batch_size]) for i in range(0, len(s), batch_size)] for s in spans]
    out = []
    while any(batches):
        for b in batches:
            if b:
                out.append(b.pop(0))
    return out


def test_batches_come_in_turn_from_the_workers_still_running():
    sizes = [9, 0, 21, 5]
    spans = [range(sum(sizes[:w]), sum(sizes[:w + 1])) for w in range(4)]
    with Loader(Sharded(sizes), batch_size=4, workers=4) as loader:
        for _ in range(2):   # and again the next epoch
            assert [b.tolist() for b in loader] == _in_turn(spans, 4)


def test_each_thread_iterates_a_replica_of_its_own_named_by_worker_info():
    seen = []
    lock = threading.Lock()

    class Marks:
        def __iter__(self):
            info = prefetch.worker_info()
            self.mark = info.id   # on this worker's copy alone
            with lock:
                seen.append((info.id, info.num_workers, info.dataset is self, id(self)))
            yield self.mark

    dataset = Marks()
    with Loader(dataset, batch_size=None, workers=3) as loader:
        assert sorted(loader) == [0, 1, 2]
    assert sorted(s[:3] for s in seen) == [(0, 3, True), (1, 3, True), (2, 3, True)]
    assert id(dataset) not in {s[3] for s in seen} and not hasattr(dataset, "mark")
    assert prefetch.worker_info() is None


def test_stats_count_the_batches_and_samples_handed_out_as_a_map_style_loader_does():
    """A stream's stats() counted worker tasks (12 or 13 after 10 batches of 4)."""
    stream = Loader(Sharded([20, 20]), batch_size=4, workers=2)
    mapped = Loader(np.arange(40), batch_size=4, workers=2)
    for loader in (stream, mapped):
        with loader:
            assert len(list(loader)) == 10
    s, m = stream.stats(), mapped.stats()
    assert (s.consumed, s.produced, s.samples) == (m.consumed, m.produced, m.samples) == (10, 10, 40)


def test_a_streams_error_carries_the_note_a_map_style_error_does():
    """An error from the stream's __next__ or __iter__ reached the user with no note."""

    class Breaks:
        def __init__(self, where):
            self.where = where

        def __iter__(self):
            if self.where == "iter" and prefetch.worker_info().id == 1:
                raise KeyError("no shard")
            return self._samples()

        def _samples(self):
            for i in range(6):
                if self.where == "next" and prefetch.worker_info().id == 1 and i == 4:
                    raise OSError("bad record")
                yield i

    for where, kind, batch in (("next", OSError, 3), ("iter", KeyError, 1)):
        with Loader(Breaks(where), batch_size=2, workers=2, name="s") as loader:
            with pytest.raises(kind) as caught:
                list(loader)
        assert caught.value.__notes__ == [
            f"raised in loader thread s-w1 while reading batch {batch} of worker 1's stream (counted from 1)"]


def test_a_stopiteration_from_a_streams_iter_is_an_error_not_its_end():
    class Stops:
        def __iter__(self):
            raise StopIteration

    with Loader(Stops(), workers=1) as loader, pytest.raises(RuntimeError, match="the stream raised StopIteration"):
        list(loader)


@pytest.mark.parametrize("stateful", [True, False], ids=["stateful", "fast-forwarded"])
def test_every_state_along_an_epoch_resumes_the_rest(stateful):
    """Once a worker's short last batch was handed out, a state resumed by
    reading that worker's whole shard again."""
    sizes = [9, 13, 0]

    def make():
        return Loader(Sharded(sizes, stateful), batch_size=4, workers=3, collate=list)

    with make() as loader:
        whole = list(loader)
    assert len(whole) == 7
    for k in range(len(whole) + 1):
        with make() as loader:
            it = iter(loader)
            got = [next(it) for _ in range(k)]
            state = copy.deepcopy(loader.state_dict())
        assert state["batches"] == k
        with make() as resumed:
            resumed.load_state_dict(state)
            assert got + list(resumed) == whole, k


def test_a_state_names_each_workers_position_as_of_its_last_batch_delivered():
    with Loader(Sharded([9, 13]), batch_size=4, workers=2, collate=list, depth=8) as loader:
        it = iter(loader)
        for _ in range(5):   # w0: 4, 4; w1: 4, 4; w0: its short last one (1)
            next(it)
        state = loader.state_dict()
    assert state["streams"] == {"next": 1, "workers": [
        {"batches": 3, "dataset": None, "iterator": {"i": 9}},
        {"batches": 2, "dataset": None, "iterator": {"i": 8}}]}
    assert state["dataset_length"] is None and state["batches"] == 5


def test_a_state_of_another_worker_count_is_refused():
    with Loader(Sharded([4, 4]), batch_size=2, workers=2) as loader:
        state = loader.state_dict()
    with Loader(Sharded([8]), batch_size=2, workers=1) as other:
        with pytest.raises(ValueError, match="saved with 2 worker"):
            other.load_state_dict(state)
        assert [b.tolist() for b in other] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_batch_size_none_hands_out_each_sample_and_drop_last_drops_a_short_batch():
    with Loader(Sharded([3, 5]), batch_size=None, workers=2) as loader:
        assert list(loader) == [0, 3, 1, 4, 2, 5, 6, 7]
    with Loader(Sharded([3, 5]), batch_size=2, drop_last=True, workers=2) as loader:
        assert [b.tolist() for b in loader] == [[0, 1], [3, 4], [5, 6]]


def test_max_bytes_bounds_what_the_workers_read_ahead():
    read = []

    class Big:
        def __iter__(self):
            for i in range(40):
                read.append(i)
                yield np.full(1 << 16, i, dtype=np.uint8)   # 64 KiB a sample

    with Loader(Big(), batch_size=2, workers=1, max_bytes=3 << 17, depth=1) as loader:
        it = iter(loader)
        first = next(it)
        # Held: the batch handed out and at most max_bytes ahead of it, a batch
        # (128 KiB) at a time: never the stream's 40 samples.
        assert first[0, 0] == 0
        seen = len(read)
        assert seen <= 2 * (1 + 3 + 1)
        assert sum(1 for _ in it) == 19


def test_bad_arguments_for_a_stream():
    with pytest.raises(ValueError, match="iterable dataset gives its samples in its own order"):
        Loader(Sharded([4]), shuffle=True)
    with pytest.raises(TypeError, match=r"__getitem__ and __len__.*for an iterable dataset, __iter__"):
        Loader(object())
    with pytest.raises(TypeError, match=r"\(generator\); .*for an iterator or generator, prefetch.map"):
        Loader(x for x in range(4))   # one-shot: every worker thread iterates the dataset every epoch
    with Loader(Sharded([4]), workers=1) as loader, pytest.raises(TypeError, match="not counted ahead"):
        len(loader)


def test_sample_rng_draws_one_stream_per_worker_batch_whatever_the_timing():
    class Draws:
        def __iter__(self):
            info = prefetch.worker_info()
            for _ in range(3 + 4 * info.id):   # worker 0 ends first
                yield int(prefetch.sample_rng().integers(1 << 40))

    runs = []
    for _ in range(3):
        with Loader(Draws(), batch_size=2, workers=2, seed=5, collate=list) as loader:
            runs.append(list(loader))
    assert runs[0] == runs[1] == runs[2]
    firsts = [batch[0] for batch in runs[0]]
    assert len(set(firsts)) == len(firsts) == 6


def test_a_state_is_given_before_the_first_batch_of_a_stream_whose_iter_makes_its_state():
    class Own:
        def __iter__(self):
            self.i = 0
            return self

        def __next__(self):
            if self.i == 3:
                raise StopIteration
            self.i += 1
            return self.i

        def state_dict(self):
            return {"i": self.i}   # only once __iter__ ran

        def load_state_dict(self, state):
            self.i = state["i"]

    with Loader(Own(), workers=1) as loader:
        assert loader.state_dict()["streams"]["workers"] == [{"batches": 0, "dataset": None, "iterator": None}]
        assert [b.tolist() for b in loader] == [[1], [2], [3]]


def test_unordered_a_worker_slow_to_read_does_not_hold_back_the_others():
    """ordered=False: a worker may have its share of the slots not filled
    (torch's per-worker bound), so one waiting inside its stream leaves the
    window to the others."""
    release = threading.Event()

    class Held:
        def __iter__(self):
            w = prefetch.worker_info().id
            for i in range(5):
                if w == 1:
                    release.wait(10)   # bounds a failure: the order is then wrong
                yield w, i

    out = []
    with Loader(Held(), batch_size=None, workers=2, ordered=False) as loader:
        for item in loader:
            out.append(tuple(item))
            if len(out) == 5:
                release.set()
    assert out == [(0, i) for i in range(5)] + [(1, i) for i in range(5)]


def test_a_fresh_state_of_a_stream_is_where_its_workers_copies_start():
    """The workers iterate copies made with the loader: a change to the
    user's object after that changes neither what they deliver nor the state
    that says where they start (SPEC §9 Streams)."""
    class Offset:
        def __init__(self):
            self.start = 0

        def __iter__(self):
            return iter(range(self.start, self.start + 3))

        def state_dict(self):
            return {"start": self.start}

        def load_state_dict(self, state):
            self.start = state["start"]

    stream = Offset()
    with Loader(stream, workers=1) as loader:
        stream.start = 10   # after the loader copied it
        assert loader.state_dict()["streams"]["workers"][0]["dataset"] == {"start": 0}
        assert [b.tolist() for b in loader] == [[0], [1], [2]]
