"""Small shared helpers for bench/: the machine's description, GC-free timing, tables, sizes."""
from __future__ import annotations

import contextlib
import gc
import os
import platform
import sys
import time

import numpy as np

ns = time.perf_counter_ns


@contextlib.contextmanager
def no_gc():
    """Collect once, then keep the cyclic GC off for the timed block (a collection is not the row's cost)."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def rotate(seq, k):
    """Interleave rows: each repetition starts the list at a different place."""
    seq = list(seq)
    if not seq:
        return seq
    k %= len(seq)
    return seq[k:] + seq[:k]


def env_info():
    from _baselines import load_mx

    import prefetch
    mx, _ = load_mx()
    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "numpy": np.__version__,
        "prefetch": getattr(prefetch, "__version__", "?"),
        "mxnet": getattr(mx, "__version__", None) if mx else None,
        "cpu": platform.processor() or platform.machine(),
        "time_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "executable": sys.executable,
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def load_average():
    """1-minute load average (how busy the machine was), or None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def human_bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def parse_size(s):
    """'64k', '1m', '256MiB' -> bytes."""
    s = s.strip().lower()
    for suf, m in (("kib", 2**10), ("mib", 2**20), ("gib", 2**30), ("k", 2**10), ("m", 2**20), ("g", 2**30)):
        if s.endswith(suf):
            return int(float(s[: -len(suf)]) * m)
    return int(s)


def int_list(s):
    return [int(x) for x in s.split(",")]


def size_list(s):
    return [parse_size(x) for x in s.split(",")]


def table_lines(header, rows, indent="  "):
    """Plain-text table, first column left-aligned, the others right-aligned."""
    cols = [list(header)] + [[str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cols) for i in range(len(header))]

    def line(r):
        return indent + "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)).rstrip()
    return [line(cols[0]), indent + "  ".join("-" * x for x in w)] + [line(r) for r in cols[1:]]
