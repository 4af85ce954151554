"""Small shared helpers for bench/: the machine's description, GC-free timing, tables, sizes."""
from __future__ import annotations

import contextlib
import gc
import os
import platform
import sys
import time
import warnings

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


@contextlib.contextmanager
def gil_warnings():
    """Records every prefetch.GILBoundWarning given inside as (perf_counter() time, the
    warning); other warnings are shown as usual."""
    from prefetch import GILBoundWarning
    got = []
    show = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, GILBoundWarning):
            got.append((time.perf_counter(), message))
        else:
            show(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always", GILBoundWarning)
        warnings.showwarning = record
        yield got


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


class OtherCpu:
    """How much CPU other processes used while a block ran, in cores (0 to the core count).

    The machine's busy time (/proc/stat) minus this process's, its waited-for children's and its
    live descendants' (/proc/*/stat), over the wall time: the benchmark's own threads and worker
    processes do not count as load, which a load average would include. None where /proc is not
    there.
    """

    def __init__(self):
        self._t0, self._busy0, self._own0 = time.monotonic(), _machine_busy_s(), _own_cpu_s()

    def cores(self):
        busy, own = _machine_busy_s(), _own_cpu_s()
        if busy is None or own is None or self._busy0 is None or self._own0 is None:
            return None
        wall = time.monotonic() - self._t0
        return max(0.0, (busy - self._busy0) - (own - self._own0)) / wall if wall > 0 else None


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy_s():
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
    guest = sum(fields[8:10])   # guest time is counted in user time too
    return (sum(fields) - idle - guest) / _TICK


def _stat_fields(path):
    with open(path) as f:
        stat = f.read()
    return stat[stat.rindex(")") + 2:].split()   # after "pid (comm) "; comm may hold spaces


def _own_cpu_s():
    """CPU seconds of this process, its reaped children, and its live descendants (a torch
    DataLoader's worker processes, alive for the whole section, are the benchmark's own load)."""
    try:
        fields = _stat_fields("/proc/self/stat")
    except OSError:
        return None
    own = sum(int(x) for x in fields[11:15])   # utime, stime, cutime, cstime
    kids, me = {}, os.getpid()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                f = _stat_fields(f"/proc/{d}/stat")
            except (OSError, ValueError):
                continue   # gone meanwhile
            kids.setdefault(int(f[1]), []).append((int(d), int(f[11]) + int(f[12])))
    todo = [me]
    while todo:
        for pid, ticks in kids.get(todo.pop(), ()):
            own += ticks
            todo.append(pid)
    return own / _TICK


BUSY_CORES = 0.25   # other processes using more than this on average make intervals wide


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


# Memory of a process tree: what a loader with worker processes really holds is the PSS (each
# shared page divided among the processes sharing it) summed over the process and every
# descendant (a fork server's children included); RSS would count a shared page once per worker.

def tree_pids(root):
    """``root`` and every live descendant, parents first (from /proc/PID/task/TID/children, or a
    scan of /proc where the kernel lacks that file). A process gone meanwhile is left out."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo += _children(pid)
    return out


def _children(pid):
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue   # a thread that ended meanwhile
            return _children_by_scan(pid)   # no such file on this kernel
        except OSError:
            continue
    return kids


def _children_by_scan(pid):
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if int(_stat_fields(f"/proc/{d}/stat")[1]) == pid:
                    kids.append(int(d))
            except (OSError, ValueError):
                continue
    return kids


def pss_bytes(pid):
    """Proportional set size of one process in bytes (/proc/PID/smaps_rollup); None when it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def tree_pss(root):
    """(PSS of ``root`` and all its live descendants, in bytes; the number of processes counted)."""
    total = n = 0
    for pid in tree_pids(root):
        b = pss_bytes(pid)
        if b is not None:
            total += b
            n += 1
    return total, n
