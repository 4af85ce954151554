"""Helpers shared by the test folders: sources that misbehave the way real
loaders do, a seeded Random, and a fresh-interpreter runner. It imports no
framework (the core's environment has none) and prefetch only where a helper
is called."""
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref

import numpy as np
import pytest


class RefillingSource:
    """Hands out the same buffer every time, refilled in place with batch i
    (SPEC §3 rule 3): the pattern of MXNet's C++ prefetcher and FFCV."""

    def __init__(self, n, shape=(64, 33)):
        self.n = n
        self.buf = np.empty(shape, dtype=np.float32)
        self.label = np.empty(shape[0], dtype=np.int64)

    def __iter__(self):
        for i in range(self.n):
            self.buf[...] = i
            self.label[...] = -i
            yield (self.buf, {"label": self.label[::2], "i": i})

    def expected(self, i):
        return np.full(self.buf.shape, i, np.float32), np.full(self.label[::2].shape, -i, np.int64)


class BlockingSource:
    """Yields `ready` batches, then blocks in next() until released."""

    def __init__(self, ready=0, then=()):
        self.ready = ready
        self.then = list(then)
        self.release = threading.Event()
        self.entered = threading.Event()

    def __iter__(self):
        for i in range(self.ready):
            yield np.full(3, i)
        self.entered.set()
        self.release.wait()
        yield from self.then


class Rand(random.Random):
    """A seeded Random whose repr shows the seed, so a failure can be replayed
    with PREFETCH_SEED=<seed>."""

    def __init__(self, seed):
        super().__init__(seed)
        self.seed_value = seed

    def __repr__(self):
        return f"Rand(seed={self.seed_value})"


def run_python(code, timeout=60, env=None):
    """Run `code` in a fresh interpreter; returns CompletedProcess (text)."""
    return run_script("-c", [code], timeout, env)


def run_script(script, args=(), timeout=60, env=None):
    """Run the Python file ``script`` (or "-c", code) with ``args`` in a fresh
    interpreter; returns CompletedProcess (text)."""
    full_env = dict(os.environ, PYTHONFAULTHANDLER="1", **(env or {}))
    # Not the checkout: its prefetch/ has no compiled core when installed non-editable.
    # A session of its own, so a timeout kills forked grandchildren too.
    proc = subprocess.Popen([sys.executable, script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full_env, cwd=tempfile.gettempdir(), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def python_output(code, timeout=50):
    """stdout of `code` run in a fresh interpreter (which must succeed)."""
    r = run_python(code, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r.stdout


# -- datasets of the seeds' stories (the drop-in DataLoaders' tests subclass them
# with their framework's Dataset) ----------------------------------------------

class RaisingDataset:
    """Sample 6 raises KeyError."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 6:
            raise KeyError(f"no sample {i}")
        return i


class UnpicklableDataset:
    """Holds a weak reference, a lock, an open file and a generator: a process
    loader cannot pickle it."""

    def __init__(self, path):
        self.owner = weakref.ref(UnpicklableDataset)
        self.lock = threading.Lock()
        self.file = open(path, "rb")
        self.counter = iter(range(10**6))

    def __len__(self):
        return 8

    def __getitem__(self, i):
        with self.lock:
            self.file.seek(i)
            byte = self.file.read(1)
            next(self.counter)
        return byte[0]


class Sized:
    """A map-style dataset whose ``__len__`` returns ``n`` as given (a new
    user's mistake where it is no int >= 0); it counts the samples loaded."""

    def __init__(self, n=4):
        self.n = n
        self.loaded = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.loaded += 1
        return i


def a_generator():
    """A generator passed as a dataset (a new user's mistake)."""
    yield from range(4)


def outcomes(loader, errors=None):
    """What each next() of one epoch gives: a batch as a list, or the error's
    type name (each error appended to ``errors`` where given); the epoch ends
    where next() raises StopIteration."""
    it, got = iter(loader), []
    while True:
        try:
            got.append(next(it).tolist())
        except StopIteration:
            return got
        except Exception as exc:
            got.append(type(exc).__name__)
            if errors is not None:
                errors.append(exc)


def assert_refused_and_usable(call, exc, says, ds, load):
    """``call(ds)`` raises ``exc`` saying each of ``says``, at the call: before
    a thread starts or a sample of the 4-sample ``ds`` loads; then ``ds`` is
    still usable: ``load(ds)``, a loader of batch size 2, gives its 2 batches."""
    before = threading.active_count()
    with pytest.raises(exc) as info:
        call(ds)
    message = str(info.value)
    assert all(part in message for part in says), message
    assert threading.active_count() == before and ds.loaded == 0
    with load(ds) as loader:
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


class CountingIterator:
    """An iterator over ``samples`` with its own state (torchdata's Stateful
    protocol): how many it has given."""

    def __init__(self, samples):
        self.samples, self.i = list(samples), 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= len(self.samples):
            raise StopIteration
        self.i += 1
        return self.samples[self.i - 1]

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


def worker_span(sizes, worker):
    """Worker ``worker`` = (id, count)'s range of a stream split into
    ``sizes``; a lone worker reads all of it."""
    w, n = worker
    if n == 1:
        return range(sum(sizes))
    start = sum(sizes[:w])
    return range(start, start + sizes[w])


def prefetch_worker():
    """(id, count) of the prefetch loader thread calling, by prefetch's own
    worker query; (0, 1) elsewhere."""
    import prefetch

    info = prefetch.worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def torch_worker():
    """The same by torch's ``get_worker_info()`` (as a torch user shards a stream)."""
    import torch

    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class ShardedStream:
    """An iterable dataset whose worker w reads its own span of ``sizes``,
    through a stateful iterator (``stateful``) or a plain one; ``worker``:
    the query that says which worker calls (a framework's tests subclass it
    with their framework's iterable dataset and its query)."""

    worker = staticmethod(prefetch_worker)

    def __init__(self, sizes, stateful=True):
        self.sizes, self.stateful = sizes, stateful

    def __iter__(self):
        span = worker_span(self.sizes, self.worker())
        return CountingIterator(span) if self.stateful else iter(span)


class SharedDataset:
    """Counts loads in an mp.Value, admits them through an mp.Semaphore and one
    at a time through a threading.Semaphore: a pool cannot take these. The
    most loads inside at once is kept in a dict the dataset refers to, so
    that copies of it (a torch drop-in's per-worker ones) count together."""

    def __init__(self):
        import multiprocessing
        self.count = multiprocessing.Value("i", 0)
        self.admit = multiprocessing.Semaphore(2)
        self.one = threading.Semaphore(1)
        self.seen = {"inside": 0, "most": 0}

    @property
    def most(self):
        return self.seen["most"]

    def __len__(self):
        return 20

    def __getitem__(self, i):
        with self.admit, self.one:
            seen = self.seen
            seen["inside"] += 1
            seen["most"] = max(seen["most"], seen["inside"])
            with self.count.get_lock():
                self.count.value += 1
            seen["inside"] -= 1
        return i


class LazyRecords:
    """A dataset that opens its file on first use in ``__getitem__`` (the
    idiom for handles that do not pickle), then seeks and reads. Record i is
    ``RECORD`` bytes of value i % 256 (``write`` makes such a file). A sample
    is (the record is right, the handle was opened by the thread reading it),
    as ints. ``meet``: a Barrier the first four keys wait at in pairs, so two
    threads have read through the handle the dataset holds. Subclassed with a
    framework's dataset class (the drop-ins copy those per worker)."""

    RECORD = 1024

    def __init__(self, path, n, meet=None):
        self.path, self.n, self.meet = path, n, meet
        self.f = None
        self.owner = None

    @classmethod
    def write(cls, path, n):
        path.write_bytes(b"".join(bytes([i % 256]) * cls.RECORD for i in range(n)))
        return str(path)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.meet is not None and i < 4:
            self.meet.wait()
        if self.f is None:
            self.f = open(self.path, "rb")
            self.owner = threading.get_ident()
        self.f.seek(i * self.RECORD)
        right = self.f.read(self.RECORD) == bytes([i % 256]) * self.RECORD
        return int(right), int(self.owner == threading.get_ident())

    def __del__(self):   # a worker's copy goes with its worker
        if self.f is not None:
            self.f.close()


def never_started_core(source):
    """A compiled core over ``source`` whose publisher thread is never started
    (what a consumer meets when that thread is gone), built by keyword as
    Prefetcher builds it. The caller closes it; its pool closes with it."""
    from prefetch._core import _BatchCopy, _Core, _FetchStage, _Pool

    pool = _Pool()
    stage = _FetchStage(source, _BatchCopy(pool, 1, True, None, 3), "never-started")
    return _Core(stage, depth=1, max_bytes=0, name="never-started", pool=pool)


def assert_same(ours, theirs, path="batch"):
    """Same types, structure, dtypes and values (bitwise for torch tensors):
    a drop-in's batches against its framework's loader's (torch or MXNet)."""
    import collections.abc

    torch = sys.modules.get("torch")
    mx = sys.modules.get("mxnet")
    assert type(ours) is type(theirs), f"{path}: {type(ours)} != {type(theirs)}"
    if mx is not None and isinstance(theirs, mx.nd.NDArray):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, path
        assert (ours.asnumpy() == theirs.asnumpy()).all(), path
    elif torch is not None and isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, path
        # Bytes: bfloat16 and float8 have no numpy or tolist() of their own; 0-d flattened first.
        assert (ours.reshape(-1).view(torch.uint8).tolist()
                == theirs.reshape(-1).view(torch.uint8).tolist()), path
    elif isinstance(theirs, collections.abc.Mapping):
        assert list(ours) == list(theirs), path
        for k in theirs:
            assert_same(ours[k], theirs[k], f"{path}[{k!r}]")
    elif isinstance(theirs, collections.abc.Sequence) and not isinstance(theirs, (str, bytes)):
        assert len(ours) == len(theirs), path
        for k, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{path}[{k}]")
    else:
        assert ours == theirs, path


class ScriptedMeter:
    """In place of prefetch._core._METER (the GIL gauge's meter): the loader
    threads' figures grow at the rates ``figures`` gives ((busy, cpu, runq,
    others) per second of the monotonic clock; busy is the Loader's own
    measure), and a probe answers ``probe``."""

    def __init__(self, figures, probe=True, runq_known=True):
        _busy, self.cpu, self.runq, self.others = figures
        self.verdict, self.runq_known = probe, runq_known
        self.t0 = time.monotonic()
        self.probes = 0

    def read(self, clocks, tids):
        t = time.monotonic() - self.t0
        return self.cpu * t, (self.runq * t if self.runq_known else None), (self.cpu + self.others) * t

    def probe(self, clocks, tids):
        assert threading.current_thread() is not threading.main_thread()   # the publisher probes
        self.probes += 1
        return self.verdict


class ProbedBeforeFirstBatch(ScriptedMeter):
    """A scripted meter whose third probe lets WaitsForProbes's dataset[i] return (``opened``)."""

    def __init__(self, figures):
        super().__init__(figures)
        self.opened = threading.Event()

    def probe(self, clocks, tids):
        verdict = super().probe(clocks, tids)
        if self.probes == 3:
            self.opened.set()
        return verdict


class WaitsForProbes:
    """dataset[i] returns only once the gauge has probed its threads three times."""

    def __init__(self, meter):
        self.meter = meter

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if not self.meter.opened.wait(30):
            raise AssertionError("no probe while the consumer waited for the first batch")
        return np.full(2, i)


GIL_BOUND = (2.0, 0.97, 0.9, 0.05)   # ScriptedMeter's figures of a GIL-bound dataset[i] (tests/core/test_loader_gil.py)


def a_gil_notice(name):
    """The notice the core's gauge gives a loader called ``name`` for GIL-bound
    windows (ScriptedMeter's figures), to hand to a drop-in as its on_notice
    would: where the test, not the gauge's window rules, decides the batch."""
    import prefetch._core as core

    gauge = core._Gauge(name, cpus=2)
    for _ in range(3):
        gauge.window(0.1, 2, *GIL_BOUND, True)
    return gauge.take_notice()


class CountedLoads:
    """A dataset of ``n`` samples that counts its loads per index in memory
    forked workers share (each index loaded exactly once?); a framework's
    tests subclass it with their Dataset, and their ``__getitem__`` calls
    ``loaded(i)``."""

    def __init__(self, n):
        self.calls = multiprocessing.get_context("fork").Array("i", n)
        self.n = n

    def __len__(self):
        return self.n

    def loaded(self, i):
        with self.calls.get_lock():
            self.calls[i] += 1
        threading.Event().wait(0.002)   # both threads inside dataset[i] about all the time


class HeldLoads(CountedLoads):
    """CountedLoads whose last sample (``hold``), loaded in a worker process
    (not the process that made it), waits there, having said so (``held``),
    until ``release`` (60 s at most: that bounds a failure only)."""

    def __init__(self, n):
        super().__init__(n)
        ctx = multiprocessing.get_context("fork")
        self.parent, self.hold = os.getpid(), n - 1
        self.held, self.release = ctx.Event(), ctx.Event()

    def loaded(self, i):
        if i == self.hold and os.getpid() != self.parent:
            self.held.set()
            self.release.wait(60)
        super().loaded(i)


def _blocks_in_a_wait(thread, timeout):
    """Whether ``thread`` comes to sleep in a wait for data (a condition's
    or a selector's) within ``timeout`` s. A signal sent before the wait
    begins can be taken as it begins and not wake it (CPython checks for
    signals between bytecodes, and not again until the wait returns); sent
    to a thread asleep in it, it interrupts it at once. Read from the
    thread's Python frame (the wait function on top: this thread holds the
    GIL, so that one has let it go, to sleep in it) and the kernel's state
    of the thread (asleep)."""
    deadline = time.monotonic() + timeout
    stat = f"/proc/self/task/{thread.native_id}/stat"
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident)
        if frame is not None and frame.f_code.co_name in ("wait", "select"):
            with open(stat) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "S":
                    return True
        time.sleep(0.001)   # a poll of what the thread is doing, not a guess at when
    return False


def take_with_ctrl_c(it, dataset, batch_size, rows, go_on=True):
    """Batches of ``it`` (each as ``rows(batch)``), with one Ctrl-C (SIGINT
    to the main thread, sent from a thread of its own) once the consumer
    waits in next() for the batch of ``dataset``'s held sample (a
    HeldLoads; ``batch_size`` samples a batch, in order), which is then
    released. To the end of ``it``, or, without ``go_on``, to the Ctrl-C.
    Returns (the batches, how many came before the Ctrl-C, or None where
    none reached the consumer).

    The held sample is of the last batch: while the consumer waits for an
    earlier one, torch's main process takes the later batches off its
    queue, and a Ctrl-C that lands as it unpickles one loses that batch
    (torch's own DataLoader too), so its next() waits for it forever."""
    waiting_for = [0]
    changed = threading.Condition()

    def ctrl_c():
        if not dataset.held.wait(60):
            return   # nothing held: no Ctrl-C, and the caller's assertion says so
        target = dataset.hold // batch_size
        with changed:
            if not changed.wait_for(lambda: waiting_for[0] == target, 60):
                dataset.release.set()   # the consumer never waited for it: nothing to interrupt
                return
        if not _blocks_in_a_wait(threading.main_thread(), 60):
            dataset.release.set()
            return
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    thread = threading.Thread(target=ctrl_c, name="ctrl-c", daemon=True)
    thread.start()
    got, before = [], None
    try:
        while True:
            try:   # the Ctrl-C may come as soon as the consumer says what it waits for
                with changed:
                    waiting_for[0] = len(got)
                    changed.notify()
                batch = next(it)
            except StopIteration:
                break
            except KeyboardInterrupt:
                assert before is None, "a second Ctrl-C"
                before = len(got)
                if not go_on:
                    break
                dataset.release.set()
                continue
            got.append(rows(batch))
    finally:
        with changed:
            waiting_for[0] = -1   # the consumer waits for nothing more
            changed.notify()
        thread.join(120)
    return got, before


def _child_pids():
    """This process's children, zombies too (Linux's /proc: psutil is not in every environment)."""
    pids = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except FileNotFoundError:   # a thread that ended after listdir: it has no children left to us
            pass
    return pids


class NewChildren:
    """Called, the pids of this process's children started since ``mark()``:
    a test's own (a framework's workers), not those an earlier test left for
    the session (multiprocessing's resource tracker lives as long as its parent)."""

    def __init__(self):
        self.earlier = set()

    def mark(self):
        self.earlier = _child_pids()

    def __call__(self):
        return sorted(_child_pids() - self.earlier)


def count_state_checks(monkeypatch):
    """The owners named by each check of a resume state from now on
    (``prefetch._resume.Identity.check``, whichever front door calls it)."""
    import prefetch._resume

    calls = []
    check = prefetch._resume.Identity.check

    def counted(self, *args, **kwargs):
        calls.append(self.owner)
        return check(self, *args, **kwargs)

    monkeypatch.setattr(prefetch._resume.Identity, "check", counted)
    return calls


def readme_examples(framework=None):
    """The README's ```python examples that import ``framework`` ("torch",
    "mxnet"), or, with None, those that import neither: each must run as pasted."""
    readme = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
    with open(readme, encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    def uses(code, name):
        return re.search(rf"^\s*(import|from) {name}\b", code, re.M) is not None
    if framework is None:
        return [b for b in blocks if not uses(b, "torch") and not uses(b, "mxnet")]
    return [b for b in blocks if uses(b, framework)]


def free_the_frames(info):
    """Clear the frames of a caught error's traceback (``info``: pytest.raises' ExceptionInfo).
    A worker's error re-raised by torch's process loader holds the loader's iterator in a
    reference cycle (its frames and the exception refer to each other). Left to the garbage
    collector, the iterator's queues are finalized before it, so its workers never get the
    signal to stop, and its shutdown waits 5 s for each before killing it; with the frames
    cleared it is freed, and its workers stopped, at once."""
    import traceback
    traceback.clear_frames(info.tb)
