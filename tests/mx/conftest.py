import warnings

import pytest


@pytest.fixture(autouse=True)
def engine_idle():
    """Before the leak check (tests/conftest.py, set up first, torn down last):
    wait for MXNet's engine. Copies are engine ops, and a pool block behind an
    NDArray comes back when the engine has run every op on it (SPEC §5)."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import mxnet as mx
    mx.nd.waitall()
