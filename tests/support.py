"""Helpers shared by the test folders: sources that misbehave the way real
loaders do, a seeded Random, and a fresh-interpreter runner."""
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import weakref

import numpy as np


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
    full_env = dict(os.environ, PYTHONFAULTHANDLER="1", **(env or {}))
    # Not the checkout: its prefetch/ has no compiled core when installed non-editable.
    # A session of its own, so a timeout kills forked grandchildren too.
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
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


class SharedDataset:
    """Counts loads in an mp.Value, admits them through an mp.Semaphore and one
    at a time through a threading.Semaphore: a pool cannot take these."""

    def __init__(self):
        import multiprocessing
        self.count = multiprocessing.Value("i", 0)
        self.admit = multiprocessing.Semaphore(2)
        self.one = threading.Semaphore(1)
        self.inside = self.most = 0

    def __len__(self):
        return 20

    def __getitem__(self, i):
        with self.admit, self.one:
            self.inside += 1
            self.most = max(self.most, self.inside)
            with self.count.get_lock():
                self.count.value += 1
            self.inside -= 1
        return i
