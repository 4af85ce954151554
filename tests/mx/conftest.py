import sys

import pytest


@pytest.fixture(autouse=True)
def engine_idle():
    """Before the leak check (tests/conftest.py, set up first, torn down last):
    wait for MXNet's engine, if a test imported it. Copies are engine ops, and
    a pool block behind an NDArray comes back when MXNet frees the NDArray,
    after every op on it has run (SPEC §5)."""
    yield
    mx = sys.modules.get("mxnet")
    if mx is not None:
        mx.nd.waitall()
