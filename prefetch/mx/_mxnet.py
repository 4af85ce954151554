"""The one guarded import of MXNet for the adapter: a clear ImportError, naming
what to install, instead of the deep traceback a broken MXNet gives."""
import sys
import warnings

_INSTALL = ("in a checkout of prefetch: pip install '.[mxnet]'; "
            "mxnet==1.9.1 needs numpy<1.24 and Python <= 3.11")

if sys.version_info >= (3, 12):
    raise ImportError(
        f"prefetch.mx needs MXNet, which has no release for Python "
        f"{sys.version_info.major}.{sys.version_info.minor}: {_INSTALL}")

try:
    with warnings.catch_warnings():
        # mxnet 1.9.1 touches np.bool at import: a DeprecationWarning on numpy 1.23.
        warnings.simplefilter("ignore", DeprecationWarning)
        import mxnet as mx
        from mxnet.base import _LIB, NDArrayHandle, check_call
        from mxnet.ndarray import ndarray as nd_module
except (ImportError, OSError, AttributeError) as _exc:
    # AttributeError: mxnet 1.9.1 uses aliases that numpy 1.24 removed (np.bool).
    raise ImportError(f"prefetch.mx needs MXNet: {_INSTALL}; importing mxnet failed: {_exc!r}") from _exc

__all__ = ["NDArrayHandle", "_LIB", "check_call", "mx", "nd_module"]
