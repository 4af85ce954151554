import gc
import sys
import threading
import time

import pytest


@pytest.fixture(autouse=True)
def engine_idle():
    """Before the leak check (tests/conftest.py, set up first, torn down last):
    wait for MXNet's engine, if a test imported it. Copies are engine ops, and
    a pool block behind an NDArray comes back when MXNet frees the NDArray,
    after every op on it has run (SPEC §5).
    The collector runs only where a test or this fixture calls it: run by
    allocation, it runs on whichever thread allocates (one of MXNet's engine
    threads, a prefetch thread), and what it frees there comes back later.
    MXNet also returns an NDArray's memory on an engine thread, at times after
    waitall() has returned, with nothing to wait on: the counts are read again
    (waitall() between) until they are the test's starting ones, for at most
    2 s; the leak check then fails if they are not."""
    from prefetch._core import _live_counts

    before = _live_counts()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
    mx = sys.modules.get("mxnet")
    if mx is None:
        return
    settled = threading.Event()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        gc.collect()
        mx.nd.waitall()
        if _live_counts() == before:
            return
        settled.wait(0.01)   # an engine thread is returning a block: look again
