"""pytest-benchmark set-up for bench/test_bench_*.py (run only with `pytest bench/`).

Options: --bench-n (tiny batches per hand-off round), --bench-sizes (copy sizes),
--bench-depths (hand-off depths). Compare runs with
`pytest bench/ --benchmark-autosave` then `pytest bench/ --benchmark-compare`.
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _util as U  # noqa: E402


def pytest_addoption(parser):
    g = parser.getgroup("prefetch bench")
    g.addoption("--bench-n", type=int, default=5000, help="tiny batches per hand-off round (default 5000)")
    g.addoption("--bench-sizes", default="1m,16m", help="copy sizes, e.g. 64k,1m,16m,256m (default 1m,16m)")
    g.addoption("--bench-depths", default="1,4,16", help="hand-off depths (default 1,4,16)")


def pytest_configure(config):
    # the project's filterwarnings=error must not turn pytest-benchmark's own
    # notices (e.g. "benchmarks are disabled under xdist") into failures
    config.addinivalue_line("filterwarnings", "default::pytest_benchmark.logger.PytestBenchmarkWarning")


def pytest_generate_tests(metafunc):
    opt = metafunc.config.getoption
    if "size" in metafunc.fixturenames:
        sizes = [U.parse_size(s) for s in opt("--bench-sizes").split(",")]
        metafunc.parametrize("size", sizes, ids=[U.human_bytes(s).replace(" ", "") for s in sizes])
    if "depth" in metafunc.fixturenames:
        depths = [int(d) for d in opt("--bench-depths").split(",")]
        metafunc.parametrize("depth", depths, ids=[f"d{d}" for d in depths])


@pytest.fixture(scope="session")
def n_batches(request):
    return request.config.getoption("--bench-n")


@pytest.fixture(scope="session")
def prefetch():
    mod, why = U.load_prefetch()
    if mod is None:
        pytest.skip(why)
    return mod


@pytest.fixture(autouse=True)
def _gc_off():
    """The cyclic GC stays off while a benchmark runs (collected once before)."""
    with U.no_gc():
        yield
