"""MXNet stays optional (SPEC §6, issue 3): runs with or without mxnet installed."""

import importlib.util

import pytest

from support import python_output


def test_import_prefetch_never_imports_mxnet():
    """§6: `import prefetch` and numpy batches never import mxnet."""
    out = python_output(
        "import sys, numpy as np, prefetch\n"
        "with prefetch.Prefetcher([np.ones(3), (np.zeros(2), 1)]) as p:\n"
        "    list(p)\n"
        "print('mxnet' in sys.modules)\n")
    assert out == "False\n"


def test_prefetch_mx_without_mxnet_says_what_to_install():
    """§6: without mxnet, importing prefetch.mx raises ImportError naming the extra."""
    out = python_output(
        "import sys\n"
        "sys.modules['mxnet'] = None  # as if not installed\n"
        "try:\n"
        "    import prefetch.mx\n"
        "except ImportError as exc:\n"
        "    print(exc)\n")
    assert "pip install '.[mxnet]'" in out
    assert "mxnet==1.9.1" in out and "numpy<1.24" in out


def test_ndarray_leaf_imports_prefetch_mx_on_demand():
    """§3: an NDArray leaf is copied without the user importing prefetch.mx."""
    if importlib.util.find_spec("mxnet") is None:
        pytest.skip("mxnet is not installed")
    out = python_output(
        "import sys, warnings\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "import mxnet as mx, prefetch\n"
        "src = mx.nd.ones((2, 3))\n"
        "with prefetch.Prefetcher([[src]]) as p:\n"
        "    (out,), = list(p)\n"
        "print('prefetch.mx' in sys.modules, out is not src, out.asnumpy().sum())\n")
    assert out == "True True 6.0\n"
