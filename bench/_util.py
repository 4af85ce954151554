"""Shared helpers for bench/: timing, statistics, progress, and the baselines.

Everything here is measurement plumbing. The baselines are written the way a
user would write them, not tuned: the point is to show what people use today.
Optional dependencies (tqdm, prefetch_generator, mxnet, matplotlib) are
imported lazily; a missing one turns its rows into "n/a" with a reason.
"""
from __future__ import annotations

import contextlib
import gc
import os
import platform
import queue
import statistics
import sys
import threading
import time

import numpy as np

ns = time.perf_counter_ns


# --------------------------------------------------------------------- timing

@contextlib.contextmanager
def no_gc():
    """Collect once, then keep the cyclic GC off for the timed block."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def summary(xs):
    """Median and spread of repeated measurements (robust to one outlier)."""
    xs = sorted(float(x) for x in xs if x is not None)
    if not xs:
        return None
    med = statistics.median(xs)
    if len(xs) >= 4:
        q = statistics.quantiles(xs, n=4, method="inclusive")
        lo, hi = q[0], q[2]
    else:
        lo, hi = xs[0], xs[-1]
    return {
        "median": med, "lo": lo, "hi": hi, "min": xs[0], "max": xs[-1], "n": len(xs),
        # half the inter-quartile (or min-max for n<4) range, relative to the median
        "spread_pct": (100.0 * (hi - lo) / 2 / abs(med)) if med else None,
    }


def fmt(s, digits=2, pct=True):
    """'12.3 ±4%' from a summary() dict."""
    if s is None:
        return "n/a"
    m = s["median"]
    txt = f"{m:.{digits}f}"
    if pct and s.get("spread_pct") is not None and s["n"] > 1:
        txt += f" ±{s['spread_pct']:.0f}%"
    return txt


def rotate(seq, k):
    """Interleave: each repetition starts the list at a different place."""
    if not seq:
        return list(seq)
    k %= len(seq)
    return list(seq[k:]) + list(seq[:k])


# ------------------------------------------------------------- machine noise

def cpu_snapshot():
    """(wall s, machine busy s summed over CPUs, this process's CPU s incl. children)."""
    busy = None
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        hz = os.sysconf("SC_CLK_TCK")
        busy = (sum(v) - v[3] - (v[4] if len(v) > 4 else 0)) / hz  # all but idle and iowait
    except (OSError, ValueError):
        pass
    t = os.times()
    return time.perf_counter(), busy, t.user + t.system + t.children_user + t.children_system


def others_cpu(a, b):
    """Fraction of the machine's CPUs used by OTHER processes between two snapshots.

    Above ~0.1 on a 2-core machine the figures are disturbed: a section that
    needs both cores (two threads, memory bandwidth) gets fewer.
    """
    if a[1] is None or b[1] is None or b[0] <= a[0]:
        return None
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / ((b[0] - a[0]) * ncpu))


def wait_idle(max_wait_s, threshold=0.15, prog_print=None):
    """Wait (at most max_wait_s) until other processes use < threshold of the CPUs over 1 s."""
    t_end = time.perf_counter() + max_wait_s
    while True:
        a = cpu_snapshot()
        time.sleep(1.0)
        frac = others_cpu(a, cpu_snapshot())
        if frac is None or frac < threshold or time.perf_counter() >= t_end:
            return frac
        if prog_print:
            prog_print(f"machine busy: other processes use {frac:.0%} of the CPUs; waiting")


# ------------------------------------------------------------------- progress

class Progress:
    """tqdm when installed, else a one-line counter on stderr."""

    def __init__(self, total, enabled=True):
        self.total = max(1, int(total))
        self.done = 0
        self._bar = None
        self.enabled = enabled and sys.stderr is not None
        if not self.enabled:
            return
        try:
            from tqdm import tqdm
            # disable=None: a bar on a terminal, silence in a CI log (run.py prints section lines)
            self._bar = tqdm(total=self.total, unit="step", dynamic_ncols=True, disable=None, mininterval=0.25,
                             bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")
        except ImportError:
            self._bar = None

    def set(self, text):
        if self._bar is not None:
            self._bar.set_postfix_str(text[:60], refresh=True)
        elif self.enabled:
            print(f"\r[{self.done}/{self.total}] {text[:60]:60s}", end="", file=sys.stderr, flush=True)

    def tick(self, n=1):
        self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def close(self):
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            print(file=sys.stderr)


class NullProgress(Progress):
    def __init__(self, *a, **k):
        super().__init__(1, enabled=False)


# ------------------------------------------------------------ optional imports

def load_prefetch():
    """(module, None) or (None, reason)."""
    try:
        import prefetch
        prefetch.Prefetcher  # noqa: B018
        return prefetch, None
    except Exception as e:  # ImportError, or a half-built package
        return None, f"prefetch not importable: {type(e).__name__}: {e}"


def load_mx():
    try:
        import mxnet as mx
        return mx, None
    except Exception as e:
        return None, f"mxnet not importable ({type(e).__name__}: {str(e)[:80]})"


def load_bg():
    try:
        from prefetch_generator import BackgroundGenerator
        return BackgroundGenerator, None
    except Exception as e:
        return None, f"prefetch_generator not importable ({type(e).__name__})"


def env_info():
    prefetch, why = load_prefetch()
    mx, _ = load_mx()
    info = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "numpy": np.__version__,
        "prefetch": getattr(prefetch, "__version__", None) if prefetch else None,
        "prefetch_file": getattr(prefetch, "__file__", None) if prefetch else why,
        "prefetch_standin": bool(getattr(prefetch, "STANDIN", False)) if prefetch else None,
        "mxnet": getattr(mx, "__version__", None) if mx else None,
        "switchinterval_s": sys.getswitchinterval(),
        "executable": sys.executable,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            info["thp"] = f.read().strip()
    except OSError:
        pass
    return info


# ------------------------------------------------------------------ baselines

def copy_tree(x):
    """What a careful user writes: np.copy every array leaf, rebuild containers."""
    if isinstance(x, np.ndarray):
        return np.copy(x)
    if isinstance(x, tuple):
        return tuple(copy_tree(v) for v in x)
    if isinstance(x, list):
        return [copy_tree(v) for v in x]
    if isinstance(x, dict):
        return {k: copy_tree(v) for k, v in x.items()}
    return x


class _Raised:
    __slots__ = ("exc",)

    def __init__(self, exc):
        self.exc = exc


_END = object()


class QueuePrefetcher:
    """threading + queue.Queue(maxsize=depth): the textbook thread prefetcher.

    copy=False hands the source's own objects through (unsafe with sources that
    refill a buffer); copy=True np.copy's every array leaf: the naive safe one.
    """

    def __init__(self, source, depth=4, copy=False):
        self._q = queue.Queue(maxsize=depth)
        self._stop = False
        self._copy = copy
        self._t = threading.Thread(target=self._run, args=(iter(source),), daemon=True,
                                   name="QueuePrefetcher")
        self._t.start()

    def _run(self, it):
        try:
            for b in it:
                if self._stop:
                    return
                self._q.put(copy_tree(b) if self._copy else b)
        except BaseException as e:  # delivered to the consumer, never lost
            self._q.put(_Raised(e))
        self._q.put(_END)

    def __iter__(self):
        return self

    def __next__(self):
        x = self._q.get()
        if x is _END:
            self._q.put(_END)
            raise StopIteration
        if type(x) is _Raised:
            raise x.exc
        return x

    def close(self):
        self._stop = True
        try:
            while True:
                self._q.get_nowait()
        except queue.Empty:
            pass
        self._t.join(2.0)


def close_quietly(it):
    """close() what has it; mx.io.PrefetchingIter only stops in __del__."""
    for name in ("close", "__del__"):
        f = getattr(it, name, None)
        if f is not None:
            try:
                f()
            except Exception:
                pass
            return


# ----------------------------------------------------------------- mx helpers

def mx_source_iter(mx, n, arrays, label=None):
    """A minimal mx.io.DataIter that hands out one pre-built DataBatch n times.

    mx.io.PrefetchingIter only accepts DataIters, so the same tiny batch is
    wrapped this way; its own plain loop is the baseline for the mx rows.
    """

    class _Src(mx.io.DataIter):
        def __init__(self):
            super().__init__(batch_size=arrays[0].shape[0])
            self._n = n
            self._i = 0
            d = [mx.nd.array(a) for a in arrays]
            lab = [mx.nd.array(label)] if label is not None else None
            self._batch = mx.io.DataBatch(data=d, label=lab, pad=0)
            self.provide_data = [mx.io.DataDesc(f"data{i}", a.shape, a.dtype) for i, a in enumerate(arrays)]
            self.provide_label = ([mx.io.DataDesc("label", label.shape, label.dtype)]
                                  if label is not None else [])

        def reset(self):
            self._i = 0

        def next(self):
            if self._i >= self._n:
                raise StopIteration
            self._i += 1
            return self._batch

    return _Src()


# --------------------------------------------------------------- memory stats

def minflt():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def rss_bytes():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def maxrss_bytes():
    """Peak RSS of this process image. VmHWM, because ru_maxrss survives exec
    and so would report the parent's peak in a child process."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def human_bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 100 or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def parse_size(s):
    s = s.strip().lower()
    mult = 1
    for suf, m in (("kib", 2**10), ("mib", 2**20), ("gib", 2**30), ("k", 2**10), ("m", 2**20), ("g", 2**30)):
        if s.endswith(suf):
            mult = m
            s = s[: -len(suf)]
            break
    return int(float(s) * mult)


def table_lines(header, rows):
    """Plain-text table with right-aligned numeric columns."""
    cols = [header] + [[str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cols) for i in range(len(header))]
    out = ["  ".join(h.ljust(w[i]) if i == 0 else h.rjust(w[i]) for i, h in enumerate(header)),
           "  ".join("-" * x for x in w)]
    for r in cols[1:]:
        out.append("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
    return out


def int_list(s):
    return [int(x) for x in s.split(",")]


def size_list(s):
    return [parse_size(x) for x in s.split(",")]


def section_main(doc, default_cfg, run, report, steps=None, options=(), argv=None, apply=None):
    """Script mode of a section (python bench/bench_X.py): --quick, --json FILE
    and the section's own options [(name, type)], each replacing the config key
    of the same name (or passed to apply(cfg, given)); then a progress bar,
    the section's tables on stdout and every figure in the JSON file."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    for name, typ in options:
        ap.add_argument(f"--{name}", type=typ)
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    cfg = default_cfg(a.quick)
    given = {name: getattr(a, name) for name, _ in options if getattr(a, name)}
    if apply is not None:
        apply(cfg, given)
    else:
        cfg.update(given)
    prog = Progress(steps(cfg)) if steps is not None else None
    res = run(cfg, prog)
    if prog is not None:
        prog.close()
    print("\n".join(report(res)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return res
