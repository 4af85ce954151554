"""torchdata's own tests of ``StatefulDataLoader`` (torchdata 0.11,
test/stateful_dataloader/test_state_dict.py), the ones a thread loader can
meet, run against ``prefetch.torch.StatefulDataLoader`` and, as the control,
against torchdata's class (issue 34 deliverable 5; SPEC §resume). Each test is
named after torchdata's; tests/pytorch/TORCHDATA_TESTS.md lists every test of
that file: ported here, or why not (a dataset drawing from torch's
process-wide generator, which threads share; torchdata's private state layout;
timing by sleeps). The datasets are written here to the same behaviour.

The control runs torchdata's worker processes (fork): a test failing only
there says the port is wrong, not the drop-in."""
import copy
import itertools
import json

import pytest

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

from torch.utils.data import Dataset, IterableDataset, RandomSampler, Sampler  # noqa: E402

import prefetch.torch  # noqa: E402
from support import CountingIterator, free_the_frames, torch_worker, worker_span  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
              # torchdata's own, from torch's DataLoader internals it calls
              pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")]
pytestmark = [*pytestmark, pytest.mark.full]  # the long tier (tests/run.sh --full)


@pytest.fixture(params=["prefetch", "torchdata"])
def SDL(request):
    """Makes a loader of the class under test ("torchdata": the control);
    the drop-ins made are closed after the test (persistent threads, which
    torch's processes would not outlive either)."""
    if request.param == "torchdata":
        yield stateful.StatefulDataLoader
        return
    made = []

    def make(*args, **kwargs):
        made.append(prefetch.torch.StatefulDataLoader(*args, **kwargs))
        return made[-1]
    yield make
    for loader in made:
        loader.close()
    made.clear()


def identity(x):
    return x


def _span(sizes):
    """This worker's range of a stream split into ``sizes`` (one worker: all of it)."""
    return worker_span(sizes, torch_worker())


class NestedCountingIterator(CountingIterator):
    """Its state nested a level down, as torchdata's tests' iterators keep it."""

    def state_dict(self):
        return {"nest": super().state_dict()}

    def load_state_dict(self, state):
        super().load_state_dict(state["nest"])


class Sharded(IterableDataset):
    """torchdata's DummyIterableDataset without its global-generator shuffle:
    each worker a range of its own, through a stateful iterator."""

    def __init__(self, sizes):
        self.sizes = sizes

    def __iter__(self):
        return NestedCountingIterator(_span(self.sizes))


class SelfIterating(IterableDataset, NestedCountingIterator):
    """torchdata's DummyIteratorIterableDataset: the dataset is its own stateful iterator."""

    def __init__(self, samples):
        NestedCountingIterator.__init__(self, samples)

    def __iter__(self):
        return self


class ResumableGenerator(IterableDataset):
    """torchdata's GeneratorIterable: a generator (no state) over a dataset
    whose own state says where it is, and, with ``increment_epoch``, which
    pass it is on (a persistent worker's replica keeps it)."""

    def __init__(self, sizes, increment_epoch=False):
        self.sizes, self.increment_epoch = sizes, increment_epoch
        self.i, self.resume, self.epoch = 0, None, 0

    def __iter__(self):
        self.i, self.resume = (self.resume or 0), None
        span = _span(self.sizes)
        for k in span[self.i:]:
            self.i += 1
            yield (k, self.epoch)
        self.i = 0
        self.epoch += self.increment_epoch

    def state_dict(self):
        return {"i": self.i, "epoch": self.epoch}

    def load_state_dict(self, state):
        self.resume, self.epoch = state["i"], state["epoch"]


class PlainGenerator(IterableDataset):
    """torchdata's GeneratorIterableNoState: no state anywhere (fast-forwarded)."""

    def __init__(self, sizes):
        self.sizes = sizes

    def __iter__(self):
        yield from _span(self.sizes)


class Records(Dataset):
    """torchdata's DummyMapDataset without its global-generator draws."""

    def __init__(self, size):
        self.data = [{"id": i, "strcol": f"strcol_{i}", "listcol": [i, i + 1, i + 2]} for i in range(size)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


class IterStateSampler(Sampler):
    """torchdata's DummySampler: the sampler has no state; its iterator has."""

    def __init__(self, size):
        self.size = size

    def __iter__(self):
        return NestedCountingIterator(range(self.size))

    def __len__(self):
        return self.size


class Periodic(IterableDataset):
    """torchdata's PeriodicStateIterableDataset: a state that carries over
    from pass to pass of a persistent worker."""

    def __init__(self):
        self.state, self.step, self.limit = {0: 0, 1: 0, 2: 0, 3: 0}, 0, 100

    def __iter__(self):
        for _ in range(self.step, self.limit):
            self.step += 1
            k = self.step % len(self.state)
            self.state[k] = 1 - self.state[k]
            yield self.state[k]

    def state_dict(self):
        return {"state": self.state, "step": self.step}

    def load_state_dict(self, state):
        self.state, self.step = state["state"], state["step"]


class SplitCounter(IterableDataset):
    """torchdata's CountIterCallsIter: its own iterator, its range split evenly among the workers."""

    def __init__(self, length):
        self.length = length

    def __iter__(self):
        w, n = torch_worker()
        per = self.length // n
        self.curr, self.end = per * w, per * (w + 1)
        return self

    def __next__(self):
        if self.curr >= self.end:
            raise StopIteration
        self.curr += 1
        return self.curr - 1

    def state_dict(self):
        return {"curr": self.curr, "end": self.end}

    def load_state_dict(self, state):
        self.curr, self.end = state["curr"], state["end"]


class GrowingState(CountingIterator, IterableDataset):
    """torchdata's DynamicStateIterableDataset: its own iterator, its state
    two entries (one a tensor) longer for each sample read."""

    def state_dict(self):
        state = super().state_dict()
        for a in range(self.i):
            state[str(a)], state[f"t{a}"] = {a: list(range(a))}, torch.tensor(a, dtype=torch.int8)
        return state


def _snapshots(state, workers):
    """Each worker's part of ``state`` as torchdata names it: its worker
    snapshots, or with 0 workers the state itself."""
    if not workers:
        return [state]
    return [state["_snapshot"]["_worker_snapshots"][f"worker_{w}"] for w in range(workers)]


# -- TestStatefulDataLoaderIterable / Map / StatefulSampler / Generator(NoState) / Iterable2 --

def _resume_matches_the_rest(make, interrupt):
    """torchdata's _run_and_checkpoint: the state after ``interrupt`` batches,
    loaded into a new loader, gives what the first one gave after it."""
    dl = make()
    it = iter(dl)
    for _ in range(interrupt):
        next(it)
    state = dl.state_dict()
    expected = list(it)
    resumed = make()
    resumed.load_state_dict(state)
    assert list(resumed) == expected


def _resume_continues_a_whole_run(make, interrupt):
    """torchdata's Generator variant: the first ``interrupt`` batches, then a
    resumed loader's, are a whole run's."""
    whole = list(make())
    dl = make()
    it = iter(dl)
    got = [next(it) for _ in range(interrupt)]
    state = dl.state_dict()
    assert got == whole[:interrupt]
    resumed = make()
    resumed.load_state_dict(state)
    assert got + list(resumed) == whole


CASES = {   # torchdata's test names -> (num_workers, persistent, snapshot steps)
    "no_mp": [(0, False, 1)],
    "mp_x": [(3, False, 1)],
    "mp_pw": [(3, True, 1)],
    "mp_every_n_steps": [(3, True, 2), (3, True, 5)],
}


def _iterable(SDL, dataset, workers, pw, steps):
    return lambda: SDL(dataset=dataset(), num_workers=workers, collate_fn=identity, snapshot_every_n_steps=steps,
                       persistent_workers=pw)


# torchdata's _run_and_checkpoint gives both loaders the same dataset object
# (with 0 workers, the one the first loader iterated: a stream that is its
# own iterator resumes from the state, not from where that run left it). Its
# subtests name batch sizes None and 7 that it does not pass to the loader.
@pytest.mark.parametrize("case", sorted(CASES))
def test_stateful_dataloader_iterable(SDL, case):
    for (workers, pw, steps), interrupt in itertools.product(CASES[case], [0, 1, 10]):
        dataset = Sharded([0, 100, 37])
        _resume_matches_the_rest(_iterable(SDL, lambda dataset=dataset: dataset, workers, pw, steps), interrupt)


@pytest.mark.parametrize("case", sorted(CASES))
def test_stateful_dataloader_iterable2(SDL, case):
    for (workers, pw, steps), interrupt in itertools.product(CASES[case], [0, 1, 10]):
        dataset = SelfIterating(range(100))
        _resume_matches_the_rest(_iterable(SDL, lambda dataset=dataset: dataset, workers, pw, steps), interrupt)


@pytest.mark.parametrize("case", sorted(set(CASES) - {"no_mp"}))   # torchdata's returns at once with 0 workers
def test_stateful_dataloader_map(SDL, case):
    dataset = Records(100)
    for (workers, pw, steps), batch_size, interrupt in itertools.product(CASES[case], [None, 7], [0, 1, 10]):
        def make(workers=workers, pw=pw, steps=steps, batch_size=batch_size):
            sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(13))
            return SDL(dataset=dataset, num_workers=workers, collate_fn=identity, snapshot_every_n_steps=steps,
                       persistent_workers=pw, batch_size=batch_size, sampler=sampler)
        _resume_matches_the_rest(make, interrupt)


@pytest.mark.parametrize("case", sorted(CASES))
def test_stateful_sampler(SDL, case):
    dataset = Records(100)
    for (workers, pw, steps), batch_size, interrupt in itertools.product(CASES[case], [None, 7], [0, 1, 10]):
        def make(workers=workers, pw=pw, steps=steps, batch_size=batch_size):
            return SDL(dataset=dataset, num_workers=workers, collate_fn=identity, snapshot_every_n_steps=steps,
                       persistent_workers=pw, batch_size=batch_size, sampler=IterStateSampler(100))
        _resume_matches_the_rest(make, interrupt)


@pytest.mark.parametrize("case", sorted(CASES) + ["random_state"])
@pytest.mark.parametrize("dataset", [ResumableGenerator, PlainGenerator])
def test_stateful_dataloader_generator(SDL, case, dataset):
    """TestStatefulDataLoaderGenerator and ...GeneratorNoState."""
    cases = CASES.get(case, [(0, False, 1), (3, False, 1)])
    for (workers, pw, steps), interrupt in itertools.product(cases, [0, 1, 10]):
        _resume_continues_a_whole_run(_iterable(SDL, lambda: dataset([0, 100, 37]), workers, pw, steps), interrupt)


# -- TestSnapshotZero / TestSnapshotEnd ---------------------------------------------------

def test_snapshot_zero_generator(SDL):
    for pw in (False, True):
        dl = SDL(dataset=ResumableGenerator([0, 100, 37]), num_workers=3, collate_fn=identity,
                 snapshot_every_n_steps=10, persistent_workers=pw)
        it = iter(dl)
        state0 = dl.state_dict()
        expected = list(it)
        dl.load_state_dict(state0)
        assert list(dl) == expected


def test_snapshot_zero_map_shuffle(SDL):
    for pw in (False, True):
        dl = SDL(dataset=Records(100), shuffle=True, num_workers=3, collate_fn=identity,
                 snapshot_every_n_steps=10, persistent_workers=pw)
        it = iter(dl)
        state0 = dl.state_dict()
        expected = list(it)
        dl.load_state_dict(state0)
        assert list(dl) == expected


@pytest.mark.parametrize("dataset", [ResumableGenerator, PlainGenerator])
def test_snapshot_end_generator(SDL, dataset):
    """test_generator and test_generator_no_state."""
    for pw, bs in itertools.product((False, True), (None, 4)):
        def make(pw=pw, bs=bs):
            return SDL(dataset=dataset([0, 100, 37]), num_workers=3, collate_fn=identity,
                       snapshot_every_n_steps=10, persistent_workers=pw, batch_size=bs)
        dl = make()
        expected = list(dl)
        state_end = dl.state_dict()
        assert list(dl) == expected   # a plain restart
        dl = make()
        it = iter(dl)
        for _ in range(2):
            next(it)
        dl.load_state_dict(state_end)
        assert list(dl) == expected


def test_snapshot_end_map_shuffle(SDL):
    for pw, bs in itertools.product((False, True), (None, 4)):
        def make(pw=pw, bs=bs):
            return SDL(dataset=Records(100), shuffle=True, num_workers=3, collate_fn=identity,
                       snapshot_every_n_steps=10, persistent_workers=pw, batch_size=bs)
        dl = make()
        list(dl)
        state_end = dl.state_dict()
        expected = list(dl)
        dl = make()
        dl.load_state_dict(state_end)
        assert list(dl) == expected


# -- TestConcurrentDataLoaders, TestJsonSerDe, TestInitialState ---------------------------

def test_two_dataloaders(SDL):
    dataset = Records(100)
    expected = list(SDL(dataset=dataset, num_workers=2, collate_fn=identity))
    assert list(torch.utils.data.DataLoader(dataset=dataset, num_workers=2, collate_fn=identity)) == expected


@pytest.mark.parametrize("workers", [0, 3], ids=["single_process", "multi_process"])
@pytest.mark.parametrize("kind", ["iterable", "map"])
def test_json_serde(SDL, workers, kind):
    if kind == "iterable":
        dataset, sampler = Sharded([0, 100, 37]), None
    else:
        dataset, sampler = Records(100), IterStateSampler(100)

    def make():
        return SDL(dataset=dataset, sampler=sampler, num_workers=workers, collate_fn=identity)
    dl = make()
    list(dl)
    it = iter(dl)
    for _ in range(4):
        next(it)
    text = json.dumps(dl.state_dict())
    expected = list(it)
    resumed = make()
    resumed.load_state_dict(json.loads(text))
    assert list(resumed) == expected


def test_initial_state(SDL):
    """Without torchdata's check of its own layout (the number of worker snapshots)."""
    for pw in (False, True):
        dl = SDL(dataset=Records(100), num_workers=4, persistent_workers=pw, collate_fn=identity)
        state = dl.state_dict()
        expected = list(dl)
        it = iter(dl)
        for _ in range(2):
            next(it)
        dl.load_state_dict(state)
        assert list(dl) == expected
        assert list(dl) == expected


def _raise_in_init(worker_id):
    raise ValueError("Worker init error")


def test_init_error(SDL):
    dl = SDL(dataset=Records(100), num_workers=4, collate_fn=identity, worker_init_fn=_raise_in_init)
    with pytest.raises(ValueError, match="Worker init error") as info:
        next(iter(dl))   # torchdata raises in iter(); the drop-in's threads start with the epoch
    free_the_frames(info)


class Failing(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        raise ValueError("Iteration error")


def test_iteration_error(SDL):
    with pytest.raises(ValueError, match="Iteration error") as info:
        # no local holds the loader or its iterator: the error's traceback refers to this
        # frame, and free_the_frames cannot clear a frame that is still running
        next(iter(SDL(dataset=Failing(), num_workers=4, collate_fn=identity)))
    free_the_frames(info)


# -- TestDynamicStateIterableDataset, TestDatasetIteratorStateDuplication --------------------

def _first_iter_state(state):
    """Worker 0's iterator state, of a loader with 2 workers."""
    return _snapshots(state, 2)[0]["fetcher_state"]["dataset_iter_state"]


def test_dynamic_state_iterable_dataset(SDL):
    """A state that grows as the stream is read, under torchdata's names
    (SPEC §9: each worker's iterator's own state, as of its last batch)."""
    dataset = GrowingState(list(range(100)))
    dl = SDL(dataset=dataset, num_workers=2, collate_fn=identity)
    it = iter(dl)
    for _ in range(6):   # a batch from each worker at least
        next(it)
    state = dl.state_dict()
    assert len(_first_iter_state(state)) == 7
    saved = copy.deepcopy(state)
    for _ in range(4):
        next(it)
    later = dl.state_dict()
    assert state == saved and state != later   # the state given is not changed by what comes after it
    assert len(_first_iter_state(later)) == 11
    dl = SDL(dataset=dataset, num_workers=2, collate_fn=identity)
    dl.load_state_dict(state)
    it = iter(dl)
    assert [x for _ in range(2) for x in next(it)] == [3, 3]
    assert len(_first_iter_state(dl.state_dict())) == 9


def test_dataset_iterator_state_duplication(SDL):
    """A dataset that is its own iterator: its state is saved once, as the
    iterator's, and ``dataset_state`` is None (with 0 workers at the top level)."""
    dataset = SelfIterating(range(100))
    for workers in (0, 2):
        dl = SDL(dataset=dataset, num_workers=workers, collate_fn=identity)
        it = iter(dl)
        for _ in range(workers + 1):   # a batch from each worker
            next(it)
        for snapshot in _snapshots(dl.state_dict(), workers):
            assert snapshot["dataset_state"] is None
            assert snapshot["fetcher_state"]["dataset_iter_state"]


# -- TestFastStateDictRequestRoundRobin ---------------------------------------------------

@pytest.mark.parametrize("steps, interrupt", [(1, 15), (17, 19)], ids=["", "skip_steps"])
def test_fast_state_dict_request_round_robin(SDL, steps, interrupt):
    def make():
        return SDL(dataset=Periodic(), num_workers=4, batch_size=1, collate_fn=identity, persistent_workers=True,
                   snapshot_every_n_steps=steps)
    dl = make()
    it = iter(dl)
    for _ in range(interrupt):
        next(it)
    state = dl.state_dict()
    for _ in range(2):
        next(it)
    expected_state = dl.state_dict()
    expected = list(it)
    dl.load_state_dict(state)
    it = iter(dl)   # asked for a state before every worker has delivered a batch
    for _ in range(2):
        next(it)
    state2 = dl.state_dict()
    resumed = make()
    resumed.load_state_dict(state2)
    assert list(resumed) == expected
    again = make()
    again.load_state_dict(state)
    it = iter(again)
    for _ in range(2):
        next(it)
    assert again.state_dict() == expected_state


# -- TestMultiEpochSDL, TestEndOfEpochBehavior, TestNotStatefulSamplerSDL -----------------

@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_multi_epoch_sdl(SDL, workers, shuffle):
    def make():
        return SDL(dataset=Records(100), num_workers=workers, batch_size=1, shuffle=shuffle)
    torch.manual_seed(0)
    dl = make()
    items = [b for _ in range(2) for b in dl]
    state = dl.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    items += [b for _ in range(2) for b in resumed]
    torch.manual_seed(0)
    whole = make()
    assert items == [b for _ in range(4) for b in whole]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_end_of_epoch_behavior(SDL, workers, shuffle):
    def make():
        return SDL(dataset=Records(100), num_workers=workers, batch_size=1, shuffle=shuffle)
    dl = make()
    n = 0
    for _ in dl:
        n += 1
        inside = dl.state_dict()
    after = dl.state_dict()
    assert n == 100
    resumed = make()
    resumed.load_state_dict(inside)
    assert len(list(resumed)) == 0   # saved after the last batch, before the end was met
    resumed = make()
    resumed.load_state_dict(after)
    assert len(list(resumed)) == 100


@pytest.mark.parametrize("interrupt", [10, 50, 80])
@pytest.mark.parametrize("sampler_cls", [RandomSampler, torch.utils.data.SequentialSampler])
def test_notstateful_sdl(SDL, interrupt, sampler_cls):
    """As torchdata's runs it: 0 workers, batch size 1."""
    def make():
        dataset = Records(100)
        return SDL(dataset=dataset, num_workers=0, batch_size=1, sampler=sampler_cls(dataset))
    torch.manual_seed(0)
    got = []
    dl = make()
    for i, batch in enumerate(dl):
        got.append(batch)
        if i == interrupt:
            break
    state = dl.state_dict()
    torch.manual_seed(0)
    resumed = make()
    resumed.load_state_dict(state)
    got += list(resumed)
    torch.manual_seed(0)
    assert got == list(make())


# -- TestMultiEpochState, TestStateInitializationDataset ----------------------------------

@pytest.mark.parametrize("pw, workers", [(False, 0), (True, 4)], ids=["inline", "pw"])
def test_multi_epoch_state(SDL, pw, workers):
    def make():
        sizes = [25, 50, 100, 75] if workers else [250]
        return SDL(dataset=ResumableGenerator(sizes, True), num_workers=workers, persistent_workers=pw,
                   collate_fn=identity)
    dl = make()
    exp0 = list(dl)
    state1 = dl.state_dict()
    exp1, exp2 = list(dl), list(dl)
    assert exp0 == [[(x[0][0], x[0][1] - 1)] for x in exp1]
    assert exp0 == [[(x[0][0], x[0][1] - 2)] for x in exp2]
    dl = make()
    it = iter(dl)
    for _ in range(2):
        next(it)
    dl.load_state_dict(state1)
    assert list(iter(dl)) == exp1
    assert list(dl) == exp2


@pytest.mark.parametrize("workers", [0, 2], ids=["inline", "mp"])
def test_state_initialization_dataset(SDL, workers):
    dataset = SplitCounter(100)
    dl = SDL(dataset=dataset, num_workers=workers, collate_fn=identity)
    it = iter(dl)
    data = []
    for _ in range(100 - 30):
        data.extend(next(it))
    state = dl.state_dict()
    resumed = SDL(dataset=dataset, num_workers=workers, collate_fn=identity)
    resumed.load_state_dict(state)
    it = iter(resumed)
    for _ in range(30):
        data.extend(next(it))
    assert sorted(data) == list(range(100))
