"""prefetch.torch.DataLoader against torch.utils.data.DataLoader in the cases
of issue 23: each test runs torch's own loader on the same input in the same
process (or, where a signal is involved, in the same subprocess) and expects
the drop-in to give what torch gives."""
import collections
import collections.abc
import threading
import warnings

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader as TorchLoader  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from prefetch.torch import DataLoader  # noqa: E402
from support import assert_same, outcomes, python_output  # noqa: E402

# -- Ctrl-C while next() waits (issue 23 item 4) -----------------------------------

_INTERRUPT = r'''
import multiprocessing, os, signal, time
import torch
from torch.utils.data import DataLoader as TorchLoader
from prefetch.torch import DataLoader

class Interrupting:
    """Index 2 (batch 1) sends SIGINT to the consumer's process once the
    consumer has its batch 0 and is about to wait for batch 1."""
    def __init__(self, go):
        self.go = go
        self.pid = os.getpid()
    def __len__(self):
        return 8
    def __getitem__(self, i):
        if i == 2:
            self.go.wait(20)
            time.sleep(0.3)
            os.kill(self.pid, signal.SIGINT)
        return i

def run(cls):
    go = multiprocessing.get_context("fork").Event()
    it = iter(cls(Interrupting(go), batch_size=2, num_workers=2))
    got = [next(it).tolist()]
    while True:
        try:
            go.set()   # inside the try: the signal may come before next() is entered
            got.append(next(it).tolist())
        except KeyboardInterrupt:
            got.append("interrupted")
        except StopIteration:
            return got

print(run(TorchLoader))
print(run(DataLoader))
'''


@pytest.mark.full
def test_ctrl_c_while_waiting_goes_on_with_the_next_batch_as_torch():
    """The KeyboardInterrupt reaches the caller of next(); the next next()
    gives the batch it waited for and the epoch runs to its end, as with
    torch's worker processes (the epoch is not silently cut short)."""
    theirs, ours = python_output(_INTERRUPT, timeout=120).splitlines()
    assert ours == theirs == str([[0, 1], "interrupted", [2, 3], [4, 5], [6, 7]])


def test_keyboard_interrupt_raised_by_the_dataset_is_that_batchs_error():
    """A dataset that raises KeyboardInterrupt itself (num_workers=0 in torch
    runs it in the consumer): the next next() gives the batch after it."""
    class RaisesOnce(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            if i == 2:
                raise KeyboardInterrupt
            return i

    def run(cls, **kw):
        it, got = iter(cls(RaisesOnce(), batch_size=2, **kw)), []
        while True:
            try:
                got.append(next(it).tolist())
            except KeyboardInterrupt:
                got.append("interrupted")
            except StopIteration:
                return got

    assert run(DataLoader, num_workers=2) == run(TorchLoader) == [[0, 1], "interrupted", [4, 5]]


# -- bulk loading: any index object goes to __getitem__ (issue 23 item 1) ------------

class BulkDataset(Dataset):
    """dataset[[i, j, ...]] gives those rows at once (torch's test_bulk_loading_nobatch)."""

    def __init__(self, n):
        self.data = torch.arange(n) * 10

    def __len__(self):
        return len(self.data)

    def __getitem__(self, indices):
        assert isinstance(indices, list), indices
        return self.data[indices]


class BulkSampler(torch.utils.data.Sampler):
    def __init__(self, n, size):
        self.n, self.size = n, size

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(3)).tolist()
        for k in range(0, self.n, self.size):
            yield order[k:k + self.size]

    def __len__(self):
        return -(-self.n // self.size)


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, False), (2, True)])
def test_bulk_loading_passes_the_sampler_s_lists_to_getitem_as_torch(num_workers, persistent):
    def batches(cls):
        loader = cls(BulkDataset(30), batch_size=None, sampler=BulkSampler(30, 4),
                     num_workers=num_workers, persistent_workers=persistent)
        return [[b.tolist() for b in loader] for _epoch in range(2)]

    ours, theirs = batches(DataLoader), batches(TorchLoader)
    assert ours == theirs and len(ours[0]) == 8 and sorted(sum(ours[0], [])) == list(range(0, 300, 10))


def test_dataset_s_own_keys_and_bad_indices_as_torch():
    """A sampler of string keys reaches a dict dataset; an out-of-range index
    raises the dataset's own error, as in torch (nothing in between checks it)."""
    data = {"a": 1, "b": 2, "c": 3}
    for cls in (DataLoader, TorchLoader):
        assert [b.tolist() for b in cls(data, batch_size=2, sampler=["c", "a", "b"])] == [[3, 1], [2]]
        with pytest.raises(IndexError, match="list index out of range"):
            list(cls([1, 2], batch_size=1, sampler=[0, 5]))


# -- more workers than CPUs (issue 23 item 2) ----------------------------------------

def _excess_warnings(cls, n):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = cls(list(range(4)), batch_size=2, num_workers=n)
        constructed = len(caught)
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    found = [w for w in caught if "excessive worker creation" in str(w.message)]
    return constructed, found


def test_more_workers_than_cpus_warn_as_torch():
    """torch's test_excessive_thread_creation_warning: a UserWarning at
    construction (and again at each iterator), worded as torch's but of threads."""
    from torch._utils import cpu_count
    n = cpu_count() + 1
    ours, theirs = _excess_warnings(DataLoader, n), _excess_warnings(TorchLoader, n)
    assert ours[0] == theirs[0] == 1 and len(ours[1]) == len(theirs[1]) == 2
    for a, b in zip(ours[1], theirs[1]):
        assert a.category is b.category is UserWarning
        assert str(a.message) == str(b.message).replace("worker processes", "worker threads")
        assert a.filename == __file__
    with pytest.warns(UserWarning, match="excessive worker creation might get DataLoader running slow or even freeze"):
        DataLoader(list(range(4)), batch_size=2, num_workers=1000)


def test_workers_within_the_cpus_draw_no_warning():
    assert _excess_warnings(DataLoader, 1)[1] == [] == _excess_warnings(TorchLoader, 1)[1]


# -- prefetch_factor bounds the work done ahead (issue 23 item 9) --------------------

class Counting(Dataset):
    """range(n) that checks, at every load, torch's bound on the work done
    ahead: while the consumer has begun ``given`` next() calls, a loader may
    have loaded at most ``given + ahead`` batches (torch's main process sends
    ``ahead`` batches of indices at the start, then one per batch received).
    A load past it is recorded in ``over``. ``reached`` is set once ``wait_for``
    samples are loaded. Shared memory: torch's workers are processes."""

    def __init__(self, n, bs, ahead):
        ctx = torch.multiprocessing.get_context("fork")
        self.n, self.bs, self.ahead = n, bs, ahead
        self.given = ctx.Value("i", 0)       # next() calls the consumer has begun
        self.count = ctx.Value("i", 0)       # samples loaded
        self.over = ctx.Value("i", -1)       # the first index loaded past the bound
        self.wait_for = ctx.Value("i", n + 1)
        self.reached = ctx.Event()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.count.get_lock():
            if i >= (self.given.value + self.ahead) * self.bs and self.over.value < 0:
                self.over.value = i
            self.count.value += 1
            if self.count.value >= self.wait_for.value:
                self.reached.set()
        return i

    def next(self, it):
        """next(it), counted as begun first; then waits until the loaders have
        loaded all they may (torch's bound), so that each step checks it at its fullest."""
        with self.count.get_lock():
            self.given.value += 1
            self.wait_for.value = min(self.n, (self.given.value + self.ahead) * self.bs)
            self.reached.clear()
            if self.count.value >= self.wait_for.value:
                self.reached.set()
        batch = next(it)
        assert self.reached.wait(30)
        return batch


@pytest.mark.parametrize("num_workers, prefetch_factor", [(2, 1), (2, 2), (3, 1)])
def test_prefetch_factor_bounds_batches_loaded_ahead_as_torch(num_workers, prefetch_factor):
    """At every next(), torch has loaded at most the batches received and
    num_workers * prefetch_factor more, and loads up to that bound; so does the
    drop-in (not the ring and the window on top)."""
    bs, n = 2, 40
    ahead = num_workers * prefetch_factor

    def loaded(cls):
        data = Counting(n, bs, ahead)
        it = iter(cls(data, batch_size=bs, num_workers=num_workers, prefetch_factor=prefetch_factor,
                      multiprocessing_context="fork"))
        batches = [data.next(it).tolist() for _batch in range(n // bs)]
        with pytest.raises(StopIteration):
            data.next(it)
        assert batches == [[k, k + 1] for k in range(0, n, bs)]
        return data.over.value, data.count.value

    assert loaded(DataLoader) == loaded(TorchLoader) == (-1, n)


def assert_loaders_agree(dataset, **kw):
    theirs = list(TorchLoader(dataset, **kw))
    for num_workers in (0, 2):
        ours = list(DataLoader(dataset, num_workers=num_workers, **kw))
        assert len(ours) == len(theirs)
        for k, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"batch {k}")
    return theirs


# -- dtypes numpy lacks (issue 23 item 6) ---------------------------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e5m2", "float8_e4m3fn", "complex32"])
def test_dtypes_numpy_lacks_collate_as_torch(dtype):
    dtype = getattr(torch, dtype)

    class Samples(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)   # complex32 is "experimental"
                values = torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.25 + i
                if dtype is torch.complex32:
                    return {"x": torch.complex(values, -values).to(dtype), "i": i}
                return {"x": values.to(dtype), "i": i}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        theirs = assert_loaders_agree(Samples(), batch_size=2)
    assert theirs[0]["x"].dtype is dtype and theirs[0]["x"].shape == (2, 2, 3)


def test_a_numpy_lacking_dtype_and_another_in_one_column_are_named():
    """bfloat16 and int16 have the same item size: they must not be stacked as one."""
    samples = [torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int16)]
    with pytest.raises(Exception, match="dtype"):
        list(DataLoader(samples, batch_size=2))


# -- Mapping samples keep their type (issue 23 item 7) --------------------------------

class ReadOnly(collections.abc.Mapping):
    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, k):
        return self._data[k]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


class Frozen(ReadOnly):
    """A read-only Mapping whose constructor takes no mapping: torch falls back to dict."""

    def __init__(self, x, y):
        super().__init__({"x": x, "y": y})


class OwnInit(dict):
    def __init__(self, x, y):
        super().__init__(x=x, y=y)


def _mapping_sample(kind, i):
    x, y = torch.full((2,), float(i)), i
    if kind == "UserDict":
        return collections.UserDict(x=x, y=y)
    if kind == "Mapping":
        return ReadOnly({"x": x, "y": y})
    if kind == "Frozen":
        return Frozen(x, y)
    if kind == "defaultdict":
        d = collections.defaultdict(list)
        d.update(x=x, y=y)
        return d
    if kind == "OrderedDict":
        return collections.OrderedDict(x=x, y=y)
    return OwnInit(x, y)


@pytest.mark.parametrize("kind", ["UserDict", "Mapping", "Frozen", "defaultdict", "OrderedDict", "OwnInit"])
def test_mapping_samples_collate_and_keep_their_type_as_torch(kind):
    class Samples(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return {"m": _mapping_sample(kind, i), "nested": [_mapping_sample(kind, -i)]}

    class Top(Samples):
        def __getitem__(self, i):
            return _mapping_sample(kind, i)

    theirs = assert_loaders_agree(Samples(), batch_size=2)
    assert_loaders_agree(Top(), batch_size=2)
    expected = {"Frozen": dict}.get(kind, type(_mapping_sample(kind, 0)))
    assert type(theirs[0]["m"]) is expected and theirs[0]["m"]["x"].shape == (2, 2)
    if kind == "defaultdict":
        assert theirs[0]["m"].default_factory is list


# -- persistent workers after a worker_init_fn that fails once (issue 23 item 5) ------

class FailsOnce:
    """worker_init_fn raising ValueError the first time any worker calls it (a
    flag in shared memory: torch's workers are processes)."""

    def __init__(self):
        self.failed = torch.multiprocessing.get_context("fork").Value("i", 0)

    def __call__(self, worker_id):
        with self.failed.get_lock():
            first = not self.failed.value
            self.failed.value = 1
        if first:
            raise ValueError(f"worker_init_fn failed in worker {worker_id}")


class Sharded(torch.utils.data.IterableDataset):
    """Each worker yields its share of range(8)."""

    def __init__(self, worker_info):
        self.worker_info = worker_info

    def __iter__(self):
        info = self.worker_info()
        return iter(range(info.id, 8, info.num_workers))


@pytest.mark.parametrize("iterable", [False, True])
def test_persistent_workers_after_a_failed_worker_init_fn_as_torch(iterable):
    """The epoch of the failure raises (torch: the failed worker's batch); the
    next epochs of the same persistent workers come in full and the same as
    torch's, and nothing hangs."""
    from prefetch.torch import get_worker_info

    def epochs(cls, **kw):
        info = get_worker_info if cls is DataLoader else torch.utils.data.get_worker_info
        data = Sharded(info) if iterable else list(range(8))
        loader = cls(data, batch_size=2, num_workers=2, persistent_workers=True, worker_init_fn=FailsOnce(),
                     **kw)
        with pytest.raises(ValueError, match="worker_init_fn failed in worker"):
            for _batch in loader:
                pass
        got = [[b.tolist() for b in loader] for _epoch in range(2)]
        if cls is DataLoader:
            loader.close()
        else:
            loader._iterator._shutdown_workers()   # torch's persistent workers, with their queue threads
        return got

    ours, theirs = epochs(DataLoader), epochs(TorchLoader, multiprocessing_context="fork", timeout=30)
    assert ours == theirs
    assert len(ours[0]) == 4 and sorted(sum(ours[0], [])) == list(range(8))


# -- a seeded generator and an epoch cut short (issue 23 item 10) ---------------------

class HeldAfterFirst(Dataset):
    """range(n), whose samples after the first ``free`` loaded wait for ``go``:
    the loader threads cannot get far ahead of the consumer until released."""

    def __init__(self, n, free):
        self.n, self.free = n, free
        self.calls = 0
        self.lock = threading.Lock()
        self.go = threading.Event()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.lock:
            self.calls += 1
            held = self.calls > self.free
        if held:
            assert self.go.wait(30)
        return i


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("cut", [0, 2])
def test_a_seeded_generator_gives_the_same_epochs_after_a_break_as_torch(persistent, cut):
    """RandomSampler draws from the generator when it starts and once more when
    read to its end: torch's main process reads the sampler prefetch_factor *
    num_workers batches ahead of the consumer, so after a break the generator
    is where those reads left it, whatever the workers were doing. The
    drop-in's threads held inside the dataset (and so not reading on) must
    leave it there too: the later epochs come in torch's order, every run."""

    def epochs(cls, data, **kw):
        loader = cls(data, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(1),
                     num_workers=2, persistent_workers=persistent, **kw)
        it = iter(loader)
        got = [next(it).tolist() for _batch in range(cut + 1)]
        if isinstance(data, HeldAfterFirst):
            data.go.set()   # before the epoch cut short is dropped (non-persistent: closed)
        del it
        got += [[b.tolist() for b in loader] for _epoch in range(2)]
        if persistent and cls is TorchLoader:
            loader._iterator._shutdown_workers()
        elif cls is DataLoader:
            loader.close()
        return got

    n = 12
    theirs = epochs(TorchLoader, list(range(n)), multiprocessing_context="fork", timeout=30)
    for _run in range(3):
        assert epochs(DataLoader, HeldAfterFirst(n, free=2 * (cut + 1))) == theirs
        assert epochs(DataLoader, list(range(n))) == theirs


# -- in_order=False with an IterableDataset sharded per worker (issue 23 item 3) ------

class HalvesHeld(torch.utils.data.IterableDataset):
    """torch's TestSlowIterableDataset: worker 0 yields (0, 0..4), worker 1
    (1, 5..9); worker 1's first item waits for ``release`` (torch's test
    sleeps 1 s there), which the consumer sets once it has 5 items."""

    def __init__(self, worker_info, release):
        self.worker_info = worker_info
        self.release = release

    def __iter__(self):
        info = self.worker_info()
        for i in range(5 * info.id, 5 * info.id + 5):
            if i == 5:
                self.release.wait(10)   # bounds a failure: the order is then wrong
            yield info.id, i


def _halves(cls, worker_info, in_order, **kw):
    """(worker id, item) as they come; worker 1 is released once 5 items came
    (in order: at once, as the items alternate between the workers)."""
    release = torch.multiprocessing.get_context("fork").Event()
    if in_order:
        release.set()
    out = []
    for worker_id, i in cls(HalvesHeld(worker_info, release), num_workers=2, in_order=in_order, **kw):
        out.append((worker_id.item(), i.item()))
        if len(out) == 5:
            release.set()
    return out


def test_out_of_order_iterable_ds_a_held_worker_does_not_hold_back_the_other_as_torch():
    """torch's TestOutOfOrderDataLoader.test_out_of_order_iterable_ds, with an
    Event where torch sleeps: worker 0's five items all come while worker 1
    waits inside its first one."""
    from prefetch.torch import get_worker_info

    theirs = _halves(TorchLoader, torch.utils.data.get_worker_info, False, multiprocessing_context="fork",
                     timeout=30)
    ours = _halves(DataLoader, get_worker_info, False)
    assert ours == theirs == [(0, i) for i in range(5)] + [(1, i) for i in range(5, 10)]


def test_in_order_iterable_ds_alternates_the_workers_as_torch():
    """torch's test_in_order_iterable_ds: one item of each worker in turn."""
    from prefetch.torch import get_worker_info

    theirs = _halves(TorchLoader, torch.utils.data.get_worker_info, True, multiprocessing_context="fork",
                     timeout=30)
    assert _halves(DataLoader, get_worker_info, True) == theirs == [
        (w, i + 5 * w) for i in range(5) for w in (0, 1)]


# -- a batch's error with in_order=False (issue 23 deliverable 2: the map stage's error policy) --

class FailsAt(Dataset):
    def __len__(self):
        return 11

    def __getitem__(self, i):
        if i in (2, 7):
            raise KeyError(f"no sample {i}")
        return i


@pytest.mark.parametrize("persistent", [False, True])
def test_out_of_order_a_batch_s_error_and_then_every_other_batch_as_torch(persistent):
    """torch goes on after a batch's error with in_order=False too: each failed
    batch is one error, every other batch comes once; the next epoch is whole."""

    def epochs(cls, **kw):
        loader = cls(FailsAt(), batch_size=2, num_workers=2, in_order=False, persistent_workers=persistent,
                     **kw)
        got = []
        for _epoch in range(2):
            it, outcomes = iter(loader), []
            while True:
                try:
                    outcomes.append(next(it).tolist())
                except KeyError:
                    outcomes.append("KeyError")
                except StopIteration:
                    break
            got.append(sorted(map(str, outcomes)))
        if persistent and cls is TorchLoader:
            loader._iterator._shutdown_workers()
        elif cls is DataLoader:
            loader.close()
        return got

    theirs = epochs(TorchLoader, multiprocessing_context="fork", timeout=30)
    assert epochs(DataLoader) == theirs
    assert theirs[0].count("KeyError") == 2 and len(theirs[0]) == 6


# -- Sequence samples collate as torch's default_collate (torch's test_default_collate_*) --

class CustomList(list):
    pass


class CustomTuple(tuple):
    pass


Pair = collections.namedtuple("Pair", "x s")


@pytest.mark.parametrize("samples", [
    [CustomList([1, 2, 3]), CustomList([4, 5, 6])],          # keeps its type
    [range(2), range(2)],                                    # a Sequence that is no list: a list
    [collections.UserList([1, 2]), collections.UserList([3, 4])],
    [CustomTuple((1, "a")), CustomTuple((3, "b"))],
    [[1, "a"], [2, "b"]],                                    # strings in a sequence: a tuple
    [(1, ["a", 3]), (2, ["b", 4])],
    [Pair(1, "a"), Pair(2, "b")],
    [{"x": "a", "r": range(3)}, {"x": "b", "r": range(3)}],  # strings in a dict: a list
    [CustomList([torch.ones(2), "a"]), CustomList([torch.zeros(2), "b"])],
    [1, 2, -1], [1.1, 2.3, -0.9], [True, False], ["a", "b"],
], ids=lambda samples: type(samples[0]).__name__)
def test_sequence_samples_collate_as_torch(samples):
    theirs = assert_loaders_agree(samples, batch_size=2)
    assert [type(b) for b in theirs] == [type(b) for b in DataLoader(samples, batch_size=2)]


# -- torch's base_seed is the Loader's seed (issue 23 deliverable 2) ------------------

class Augmented(Dataset):
    """Each sample draws its augmentation from prefetch.sample_rng()."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        import prefetch
        return prefetch.sample_rng().integers(1 << 30)


@pytest.mark.parametrize("persistent", [False, True])
def test_sample_rng_follows_torch_s_seed(persistent):
    """sample_rng() is seeded from torch's base_seed: the same torch seed (a
    generator or torch.manual_seed) gives the same augmentations, epoch after
    epoch, however the threads run; another seed others."""

    def draws(seed, generator):
        with torch.random.fork_rng(devices=[]):   # the global generator as it was, after
            if generator:
                kw = dict(generator=torch.Generator().manual_seed(seed))
            else:
                torch.manual_seed(seed)
                kw = {}
            with DataLoader(Augmented(), batch_size=2, shuffle=True, num_workers=2,
                            persistent_workers=persistent, **kw) as loader:
                return [[b.tolist() for b in loader] for _epoch in range(2)]

    for generator in (True, False):
        first = draws(1, generator)
        assert draws(1, generator) == first != draws(2, generator)
        assert first[0] != first[1]   # each epoch its own


class AugmentedStream(torch.utils.data.IterableDataset):
    """Each worker's half of 8 samples, each drawing from prefetch.sample_rng()."""

    def __iter__(self):
        import prefetch
        from prefetch.torch import get_worker_info
        info = get_worker_info()
        for _ in range(4):
            yield prefetch.sample_rng().integers(1 << 30), info.id


@pytest.mark.parametrize("persistent", [False, True])
def test_sample_rng_in_an_iterable_dataset_follows_torch_s_seed(persistent):
    """In an IterableDataset, sample_rng() is seeded from torch's base_seed
    too (each batch its own stream): the same torch seed gives the same draws
    every run, another seed others, and each epoch draws anew."""

    def draws(seed):
        with DataLoader(AugmentedStream(), batch_size=2, num_workers=2, persistent_workers=persistent,
                        generator=torch.Generator().manual_seed(seed)) as loader:
            return [[[v.tolist() for v in b] for b in loader] for _epoch in range(2)]

    first = draws(1)
    assert len(first[0]) == 4
    assert draws(1) == first != draws(2)
    assert first[0] != first[1]


def test_a_seeded_generator_after_a_break_with_zero_workers():
    """num_workers=0: the same later epochs every run, and torch's
    num_workers=0 ones when the break is not within prefetch_factor batches
    of the epoch's end (torch reads none ahead then; the drop-in reads
    prefetch_factor batches ahead: documented)."""

    def epochs(cls, data):
        loader = cls(data, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(1))
        it = iter(loader)
        got = [next(it).tolist()]
        if isinstance(data, HeldAfterFirst):
            data.go.set()
        del it
        return got + [[b.tolist() for b in loader] for _epoch in range(2)]

    theirs = epochs(TorchLoader, list(range(12)))
    for _run in range(3):
        assert epochs(DataLoader, HeldAfterFirst(12, free=2)) == epochs(DataLoader, list(range(12))) == theirs


class EagerSampler(torch.utils.data.Sampler):
    """Draws its whole order from torch's global generator when iter() is called."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n).tolist())


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_a_sampler_that_draws_in_iter_gives_torch_s_epochs(persistent, batch_size):
    """torch calls iter() on the sampler when its iterator is made and again as
    the first epoch begins: a sampler drawing there draws as often here."""

    def epochs(cls, **kw):
        torch.manual_seed(0)
        loader = cls(list(range(8)), batch_size=batch_size, sampler=EagerSampler(8), num_workers=2,
                     persistent_workers=persistent, **kw)
        got = [[torch.as_tensor(b).tolist() for b in loader] for _epoch in range(2)]
        if persistent and cls is TorchLoader:
            loader._iterator._shutdown_workers()
        elif cls is DataLoader:
            loader.close()
        return got

    assert epochs(DataLoader) == epochs(TorchLoader, multiprocessing_context="fork", timeout=30)


# -- a sampler's error is the batch it replaces --------------------------------------

class BreaksOnce(torch.utils.data.Sampler):
    """0..7, but its first epoch raises after index 3."""

    def __init__(self):
        self.epochs = 0

    def __len__(self):
        return 8

    def __iter__(self):
        self.epochs += 1
        yield from range(4)
        if self.epochs == 1:
            raise RuntimeError("sampler broke")
        yield from range(4, 8)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, False), (2, True)])
def test_a_sampler_s_error_is_the_batch_it_replaces_and_ends_the_epoch_as_torch(num_workers, persistent):
    """As torch's loader without workers gives it (torch's worker processes
    read the sampler ahead, so theirs raises before the batches it follows):
    the batches before it, then its error, then the epoch's end; the next
    epoch reads the sampler anew."""
    ds = list(range(8))
    mine = DataLoader(ds, batch_size=2, sampler=BreaksOnce(), num_workers=num_workers,
                      persistent_workers=persistent)
    errors = []
    got = [outcomes(mine, errors), outcomes(mine)]
    loader = TorchLoader(ds, batch_size=2, sampler=BreaksOnce())
    torch_epochs = [outcomes(loader), outcomes(loader)]
    assert got == torch_epochs == [[[0, 1], [2, 3], "RuntimeError"], [[0, 1], [2, 3], [4, 5], [6, 7]]]
    (error,) = errors   # the drop-in says where: the sampler, for which batch
    assert "sampler broke" in str(error)
    assert any("sampler" in n and "batch 3" in n for n in getattr(error, "__notes__", [])), error
    mine.close()
