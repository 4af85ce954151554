"""The options of ``Prefetcher``, ``Loader`` and ``map``, and every check of
them: one place for the bad-argument messages, whichever front door (a
drop-in's too) the value came through.
"""
from __future__ import annotations

import itertools
import math
import numbers
import os
import re
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

# Upper bounds: a ring slot per depth, a thread per worker; past these a
# value is a mistake, not a configuration.
MAX_DEPTH = 1 << 20
MAX_WORKERS = 1024   # threads (a framework's loader may ask for 1000 workers and only be warned)
MAX_BYTES = (1 << 63) - 1
MAX_SEED = (1 << 128) - 1
# Epochs are counted in a Py_ssize_t and a loader numbers the epoch after the
# one it starts: from any epoch it is given, 2**62 epochs can still be run.
MAX_EPOCH = (1 << 62) - 1
MAX_BATCH_SIZE = 1 << 62
# workers="auto" grows past the CPUs only while they stay idle (I/O-like
# samples); this bounds the threads even then.
AUTO_MAX_THREADS = 64

_names = itertools.count(1)


_AN = re.compile(r"(?:[aeio]|u(?!ni|int|s)|nd)", re.IGNORECASE)   # "an int", "an ndarray", "a uint8"


def article(noun: str) -> str:
    """``noun`` with its English article, as a message reads it: "an int",
    "an ndarray", "a float"."""
    return f"an {noun}" if _AN.match(noun) else f"a {noun}"


def kind_of(value_type: type) -> str:
    """A type as a message names a value of it: "None", "an int"."""
    return "None" if value_type is type(None) else article(value_type.__name__)


def seconds(s: float) -> str:
    """A duration as people read it: "2.0 s", not "1.999994509 s"."""
    return f"{s:.1f} s" if s >= 1 else f"{s:.2g} s"


# A framework loader's argument, as its users bring it to Loader: the name
# Loader gives it, and whose name it is.
_HABITS = {
    "num_workers": ("workers", "a DataLoader's"),
    "collate_fn": ("collate", "a DataLoader's"),
    "worker_init_fn": ("worker_init", "a DataLoader's"),
    "batchify_fn": ("collate", "Gluon's DataLoader's"),
}


def check_habits(owner: str, kwargs: dict[str, Any]) -> None:
    """TypeError for a keyword ``owner`` has under another name (a framework
    loader's): naming it, its value and the name to use instead. Other
    unknown keywords are left to Python's own message."""
    for arg, value in kwargs.items():
        if arg in _HABITS:
            ours, whose = _HABITS[arg]
            raise TypeError(f"{owner}() has no argument {arg} ({whose} name), got {arg}={value!r}: "
                            f"pass {ours}={value!r}")


def check_dataset(dataset: Any, otherwise: str) -> int:
    """A map-style dataset (``__getitem__`` and ``__len__``) and its length,
    checked where it is given: TypeError or ValueError naming its type and
    what its ``__len__`` returned (Python's own error would come at the first
    epoch, naming no dataset). ``otherwise``: what to pass for a stream."""
    cls = type(dataset)
    if not (hasattr(cls, "__getitem__") and hasattr(cls, "__len__")):
        raise TypeError(f"dataset must have __getitem__ and __len__, got {dataset!r} ({cls.__name__}); "
                        f"{otherwise}")
    n = cls.__len__(dataset)
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"len(dataset) must be an int >= 0, but {cls.__name__}.__len__ returned {n!r} "
                        f"({type(n).__name__})")
    if n < 0:
        raise ValueError(f"len(dataset) must be an int >= 0, but {cls.__name__}.__len__ returned {n!r}")
    return int(n)


def check_int(arg: str, value: Any, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{arg} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    number = int(value)
    if not minimum <= number <= maximum:
        raise ValueError(f"{arg} must be an int >= {minimum} and <= {maximum}, got {value!r}")
    return number


def check_batch_size(value: Any, alone: bool = True) -> int:
    """A ``batch_size`` other than None, the bound as a user writes it.
    ``alone``: None hands out samples one by one (a Loader's), and the
    message names it; a framework loader's None is its own check."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"batch_size must be an int >= 1{', or None for samples one by one' * alone}, "
                        f"got {value!r} ({type(value).__name__})")
    number = int(value)
    if number < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {value!r}" + alone * (
            "; batch_size=None hands out each sample alone, without a batch axis"))
    if number > MAX_BATCH_SIZE:
        raise ValueError(f"batch_size must be an int >= 1 and at most 2**62, got {value!r}")
    return number


def check_num_workers(value: Any) -> None:
    """A drop-in DataLoader's ``num_workers`` (0: one thread), checked before
    the framework's own checks, which compare it with 0 first (a string would give a
    bare ``TypeError``). A negative int is left to the framework, whose
    message its users search for."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"num_workers must be an int >= 0 (the loading threads; 0: one thread, as the "
                        f"framework's main-process loading), got {value!r} ({type(value).__name__})")
    if int(value) > MAX_WORKERS:
        raise ValueError(f"num_workers must be an int >= 0 and at most {MAX_WORKERS} (threads), got {value!r}")


def check_loading(value: Any) -> str:
    """A drop-in DataLoader's ``loading=``: TypeError for a non-str, ValueError for another word."""
    if not isinstance(value, str):
        raise TypeError(f"loading must be 'auto', 'threads' or 'processes' (a str), got {value!r} "
                        f"({type(value).__name__})")
    if value not in ("auto", "threads", "processes"):
        raise ValueError(f"loading must be 'auto', 'threads' or 'processes', got loading={value!r}")
    return value


def check_bool(arg: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{arg} must be a bool, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_callable(arg: str, value: Any, optional: bool = True) -> Any:
    """``value``, a callable (or, where ``optional``, None)."""
    if not (callable(value) or (optional and value is None)):
        raise TypeError(f"{arg} must be callable{' or None' * optional}, got {value!r} ({type(value).__name__})")
    return value


def check_timeout(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {value!r} ({type(value).__name__})")
    seconds = float(value)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {value!r}")
    return seconds


def check_copy(value: Any) -> bool:
    """True when leaves may be handed over (copy="auto")."""
    if not isinstance(value, str):
        raise TypeError(f"copy must be 'auto' or 'always', got {value!r} ({type(value).__name__})")
    if value not in ("auto", "always"):
        raise ValueError(f"copy must be 'auto' or 'always', got {value!r}")
    return value == "auto"


def check_workers(value: Any, auto: bool) -> Optional[int]:
    """The thread count; None for "auto" where ``auto`` allows it."""
    if auto and isinstance(value, str):
        if value != "auto":
            raise ValueError(f"workers must be an int >= 1 or 'auto', got {value!r}")
        return None
    if auto and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise TypeError(f"workers must be an int >= 1 or 'auto', got {value!r} ({type(value).__name__})")
    return check_int("workers", value, 1, MAX_WORKERS)


def usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Options:
    """Checked options; ``Options.check`` is the one way to make them."""

    name: str
    depth: int = 4
    workers: Optional[int] = 1      # None: "auto" (a loader)
    max_bytes: int = 0              # 0: no cap
    timeout: Optional[float] = None
    handover: bool = True           # copy="auto"
    seed: Optional[int] = None
    ordered: bool = True

    @classmethod
    def check(cls, kind: str, *, name: Any = None, depth: Any = 4, workers: Any = 1,
              max_bytes: Any = None, timeout: Any = None, copy: Any = "auto", seed: Any = None,
              ordered: Any = True) -> "Options":
        """The options of a ``kind`` ("prefetch" or "loader": the default
        name's prefix, and a loader's workers may be "auto"); TypeError or
        ValueError naming the argument and the value for a bad one."""
        if name is None:
            name = f"{kind}-{next(_names)}"
        elif not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r} ({type(name).__name__})")
        return cls(
            name=name,
            depth=check_int("depth", depth, 1, MAX_DEPTH),
            workers=check_workers(workers, auto=kind == "loader"),
            max_bytes=0 if max_bytes is None else check_int("max_bytes", max_bytes, 1, MAX_BYTES),
            timeout=check_timeout(timeout),
            handover=check_copy(copy),
            seed=None if seed is None else check_int("seed", seed, 0, MAX_SEED),
            ordered=check_bool("ordered", ordered),
        )

    def core(self) -> dict[str, Any]:
        """What a _Core takes of them, by keyword."""
        return dict(depth=self.depth, max_bytes=self.max_bytes, name=self.name)
