"""Helpers shared by the test folders: sources that misbehave the way real
loaders do, a seeded Random, and a fresh-interpreter runner."""
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading

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
