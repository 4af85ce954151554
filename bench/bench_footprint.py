"""Section: memory and first batch over a dataset of Python objects (threads against worker processes).

The dataset is what an annotation list looks like in memory: a torch Dataset holding a list
of small dicts {"path": str, "label": int, "box": [4 ints]} (--quick: 100 000 of them, about
40 MiB of PSS; a full run: 1 000 000, about 390 MiB). A worker process shares it with the
main process copy-on-write, but reading a record writes its reference counts, so the
pages it touches are copied into the worker: memory grows towards (1 + workers) x the
dataset. Threads share one copy. Batches of 256, shuffled, one epoch, then the first batch
of 2 more epochs of the same (non-persistent) loader.

Each row runs in a fresh process (python bench/bench_footprint.py --child ...), in a
session of its own: its whole process tree (worker processes, a fork server and its
children) is killed when the row ends, fails or times out. This process samples the PSS
(/proc/PID/smaps_rollup: a shared page divided among its sharers) of that tree every
50 ms. Rows, interleaved within each repetition:

    plain loop                    default_collate over a shuffled index, on the main thread
    prefetch.Loader(workers=2, 4)  the Loader, shuffle=True
    prefetch.torch.DataLoader(num_workers=2, 4)  the drop-in, torch's arguments, on threads
    torch DataLoader(num_workers=2, 4)  with multiprocessing_context "fork" (Linux's default
                                  before Python 3.14) and "forkserver" (3.14's default)
    SPDL, torchdata.nodes, Grain  the thread loaders of bench/_peers.py, 2 threads, as set up
                                  there (in order) over a shuffled view of the dataset (a fixed
                                  permutation), default_collate

--quick runs the 4-worker torch rows, the peers and (in the training loop) forkserver and the
Loader in its first repetition only: they would take most of its time (SPDL's per-sample
tasks run at about 13 batches/s here). Their figures then have no interval, and the targets
that compare them are left to a full run. Repetitions added while an interval straddles its
target run only the rows it compares (--quick: only where they are all core rows).

Columns: peak PSS of the tree during the epoch; its growth over the tree's PSS just before
the loader was made (the dataset built); the peak's excess over the plain loop's peak in the
same repetition; time to the first batch (loader made, iter(), next()); batches/s over the
whole epoch (its start-up included); the first batch of epochs 2 and 3 (a non-persistent
loader starts its workers again; a torch iterator dropped mid-epoch shuts its workers down).
Then: each row over a dataset holding a threading.Lock (it cannot be pickled), and a training
loop that runs a short evaluation epoch with a fresh loader after every training epoch.
"""
from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import _peers as P
import _stats as S
import _util as U

TITLE = "Memory and first batch over a dataset of Python objects (threads against worker processes)"

BATCH = 256
PLAIN = "plain loop"
LOADER2 = "prefetch.Loader(workers=2)"
LOADER4 = "prefetch.Loader(workers=4)"
DROPIN2 = "prefetch.torch.DataLoader(num_workers=2)"
DROPIN4 = "prefetch.torch.DataLoader(num_workers=4)"
FORK2 = 'torch DataLoader(num_workers=2), "fork"'
FORK4 = 'torch DataLoader(num_workers=4), "fork"'
FS2 = 'torch DataLoader(num_workers=2), "forkserver"'
FS4 = 'torch DataLoader(num_workers=4), "forkserver"'
TORCH_ROWS = {FORK2: (2, "fork"), FORK4: (4, "fork"), FS2: (2, "forkserver"), FS4: (4, "forkserver")}
OURS = (LOADER2, LOADER4, DROPIN2, DROPIN4)
# CORE rows run in every repetition; EXTRA rows in the first cfg["extra_reps"] (all of them in a
# full run; one in --quick, where forkserver's 4 workers and SPDL's per-sample tasks would
# take most of the section's time).
CORE = [PLAIN, LOADER2, LOADER4, DROPIN2, DROPIN4, FORK2, FS2]
EXTRA = [FORK4, FS4, *P.PEERS]
ROWS = [PLAIN, LOADER2, LOADER4, DROPIN2, DROPIN4, FORK2, FORK4, FS2, FS4, *P.PEERS]
LOCK_ROWS = [LOADER2, DROPIN2, FORK2, FS2, *P.PEERS]
VALIDATE_CORE = [DROPIN2, FORK2]
VALIDATE_EXTRA = [FS2, LOADER2]
VALIDATE_ROWS = [DROPIN2, FORK2, FS2, LOADER2]

MEM_GOAL = 0.10     # peak growth / the dataset's own PSS, for ours at 2 and 4 workers
# The memory target is set for a dataset of hundreds of MB (1 000 000 records: about 390 MiB).
# Below this size the threads' fixed few MiB (their stacks, the batches in flight, the modules
# a first epoch imports) weigh more than the target allows for: --quick's 100 000 records (about
# 38 MiB) judge it only where it is met anyway.
MEM_MIN_DATASET = 100 * 2**20
SPEED_GOAL = 3.0    # Loader(workers=2) batches/s over torch's DataLoader(num_workers=2), fork
FIRST_FS = 0.1      # first batch, ours / torch's with forkserver (time: lower is better)
FIRST_FORK = 0.5    # first batch, ours / torch's with fork
VALIDATE_GOAL = 0.8  # the training+evaluation loop's wall time, the drop-in's / torch's
SAMPLE_S = 0.05


def add_arguments(g):
    g.add_argument("--footprint-records", type=int, help="records in the dataset (default 1000000; quick 100000)")
    g.add_argument("--footprint-epochs", type=int, help="epochs per row: one whole, then the "
                   "first batch of each further one (default 3; quick 2)")


def config(a):
    reps = a.reps or 6
    return {"reps": reps, "quick": a.quick, "extra_reps": 1 if a.quick else reps, "records": a.footprint_records or (100_000 if a.quick else 1_000_000),
            "epochs": max(1, a.footprint_epochs or (2 if a.quick else 3)), "lock_records": 20_000,
            "validate": {"train": 25_600 if a.quick else 102_400, "eval": 40 * BATCH,
                         "epochs": 2 if a.quick else 3, "step_s": 0.002},
            "timeout_s": 600}


# ---- the child: one row in a process of its own ----

_Base: type = object
if __name__ in ("__main__", "__mp_main__"):   # a row's process, or a fork server's worker: torch is there
    with contextlib.suppress(ImportError):
        from torch.utils.data import Dataset as _Base


class Records(_Base):
    """A torch map-style dataset over a list of small dicts."""

    def __init__(self, n, lock=False):
        self.rows = [{"path": f"train/{i % 1000:04d}/{i:09d}.jpg", "label": i % 1000,
                      "box": [i % 97, i % 89, i % 83 + 16, i % 79 + 16]} for i in range(n)]
        if lock:
            self.lock = threading.Lock()   # cannot be pickled: a process loader must fork to use it

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class Plain:
    """A shuffled epoch of default_collate batches on the calling thread."""

    def __init__(self, ds, collate):
        self.ds, self.collate = ds, collate

    def __iter__(self):
        import numpy as np
        order = np.random.default_rng().permutation(len(self.ds))
        for s in range(0, len(order), BATCH):
            yield self.collate([self.ds[i] for i in order[s:s + BATCH].tolist()])


class Shuffled:
    """The dataset seen through a fixed permutation: bench/_peers.py sets the peers up in order,
    and a shuffled epoch reads the records in random order (a cache miss per record here)."""

    def __init__(self, ds):
        import numpy as np
        self.ds, self.order = ds, np.random.default_rng().permutation(len(ds))

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return self.ds[int(self.order[i])]


def _make(row, ds, workers_default=2, shuffle=True):
    """(loader: an iterable of epochs, close or None)."""
    import torch
    from torch.utils.data import default_collate

    import prefetch
    import prefetch.torch
    if row == PLAIN:
        return Plain(ds, default_collate), None
    if row in (LOADER2, LOADER4):
        ld = prefetch.Loader(ds, batch_size=BATCH, shuffle=shuffle, workers=2 if row == LOADER2 else 4)
        return ld, ld.close
    if row in (DROPIN2, DROPIN4):
        ld = prefetch.torch.DataLoader(ds, batch_size=BATCH, shuffle=shuffle,
                                       num_workers=2 if row == DROPIN2 else 4)
        return ld, ld.close
    if row in TORCH_ROWS:
        workers, method = TORCH_ROWS[row]
        return torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=shuffle, num_workers=workers,
                                           multiprocessing_context=method), None
    if shuffle:
        ds = Shuffled(ds)
    rows, missing = P.rows(ds, BATCH, default_collate, workers=workers_default)
    if row not in rows:
        raise RuntimeError(missing.get(row, f"unknown row {row!r}"))
    return rows[row]()


def _drop(it):
    close = getattr(it, "close", None)   # a generator's (SPDL's epoch); torch's iterator has none
    if callable(close):
        close()
    del it
    gc.collect()


def _child_epochs(row, n, epochs):
    import prefetch.torch  # noqa: F401 - every row pays the same imports before the baseline
    P.rows(Records(0), BATCH, None)   # imports the peers too (their import is not the loader's memory)
    before = U.tree_pss(os.getpid())[0]
    ds = Records(n)
    gc.collect()
    ready = U.tree_pss(os.getpid())[0]
    t0 = time.monotonic()
    loader, close = _make(row, ds)
    it = iter(loader)
    next(it)
    t_first = time.monotonic()
    count = 1 + sum(1 for _ in it)
    t_end = time.monotonic()
    _drop(it)
    firsts = []
    for _ in range(epochs - 1):
        t = time.monotonic()
        it = iter(loader)
        next(it)
        firsts.append(time.monotonic() - t)
        _drop(it)
    if close is not None:
        close()
    return {"dataset_bytes": ready - before, "ready_bytes": ready, "t0": t0, "t_first": t_first, "t_end": t_end,
            "batches": count, "later_first_s": firsts}


def _child_lock(row, n):
    ds = Records(n, lock=True)
    loader, close = _make(row, ds)
    try:
        got = sum(1 for _ in loader)
    except Exception as e:  # noqa: BLE001 - the error is the row's result
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:90] if str(e).strip() else ''}"}
    finally:
        if close is not None:
            close()
    return {"batches": got}


def _child_validate(row, train, evaluate, epochs, step_s):
    ds, held_out = Records(train), Records(evaluate)
    t0 = time.monotonic()
    loader, close = _make(row, ds)
    evals = []
    for _ in range(epochs):
        for _batch in loader:
            time.sleep(step_s)   # the step: a GIL-free wait, as a GPU step looks to the host
        t = time.monotonic()
        ev, ev_close = _make(row, held_out, shuffle=False)   # a fresh evaluation loader, as scripts write it
        for _batch in ev:
            pass
        if ev_close is not None:
            ev_close()
        del ev
        evals.append(time.monotonic() - t)
    if close is not None:
        close()
    return {"total_s": time.monotonic() - t0, "eval_s": evals}


def _child(argv):
    mode, row = argv[0], argv[1]
    args = [float(x) if "." in x else int(x) for x in argv[2:]]
    with contextlib.redirect_stdout(sys.stderr):   # stdout carries the one JSON line
        try:
            if mode == "epochs":
                r = _child_epochs(row, *args)
            elif mode == "lock":
                r = _child_lock(row, *args)
            else:
                r = _child_validate(row, *args)
        except Exception as e:  # noqa: BLE001 - reported as the row's error
            r = {"error": f"{type(e).__name__}: {str(e).strip()[:200]}"}
    print(json.dumps(r), flush=True)


# ---- the parent: a row's process tree, sampled ----

def run_tree(cmd, timeout_s, sample_s=SAMPLE_S):
    """Runs ``cmd`` in a session of its own, sampling its process tree's PSS every ``sample_s``;
    returns (the child's JSON result or {"error": ...}, [(monotonic time, PSS bytes, processes)]).
    The whole process group is killed when it ends, fails, times out or this is interrupted."""
    samples = []
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while p.poll() is None:
                now = time.monotonic()
                if now > deadline:
                    return {"error": f"timed out after {timeout_s} s"}, samples
                pss, procs = U.tree_pss(p.pid)
                samples.append((now, pss, procs))
                time.sleep(sample_s)
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)   # its workers, a fork server and its children too
            p.wait()
            _wait_gone(p.pid, 10.0)   # a dying tree must not weigh on the next row
        out.seek(0)
        lines = out.read().strip().splitlines()
        err.seek(0)
        tail = (err.read().strip().splitlines()[-1:] or [""])[0][:200]
        if not lines:
            return {"error": f"exit {p.returncode}: {tail}"}, samples
        try:
            r = json.loads(lines[-1])
        except ValueError:
            return {"error": f"exit {p.returncode}, no result: {lines[-1][:100]}"}, samples
        if p.returncode != 0:   # after its result: at the interpreter's exit (a peer's threads)
            r["exit"] = f"exit {p.returncode} after its result: {tail}"
        return r, samples


def _group(pgid):
    """Live (not zombie) processes of process group ``pgid``."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                f = U._stat_fields(f"/proc/{d}/stat")
            except (OSError, ValueError):
                continue
            if f[0] != "Z" and int(f[2]) == pgid:
                out.append(int(d))
    return out


def _wait_gone(pgid, limit_s):
    end = time.monotonic() + limit_s
    while _group(pgid) and time.monotonic() < end:
        time.sleep(0.02)


def _cmd(*args):
    return [sys.executable, os.path.abspath(__file__), "--child", *map(str, args)]


def _epoch_row(row, cfg):
    r, samples = run_tree(_cmd("epochs", row, cfg["records"], cfg["epochs"]), cfg["timeout_s"])
    if "error" in r:
        return r
    exit_note = {"exit": r["exit"]} if "exit" in r else {}
    during = [pss for t, pss, _ in samples if r["t0"] <= t <= r["t_end"]]
    peak = max(during + [r["ready_bytes"]])
    procs = max([k for t, _, k in samples if r["t0"] <= t <= r["t_end"]] + [1])
    epoch_s = r["t_end"] - r["t0"]
    return {"peak": peak, "growth": peak - r["ready_bytes"], "dataset": r["dataset_bytes"],
            "first_s": r["t_first"] - r["t0"], "bps": r["batches"] / epoch_s, "later_first_s": r["later_first_s"],
            "processes": procs, "samples": len(during), **exit_note}


MiB = 2**20


def _med(xs):
    return S.interval(xs).median if xs else math.nan


def _fmt_ms(xs):
    iv = S.interval([x * 1e3 for x in xs])
    return "n/a" if iv.n == 0 else (f"{iv.median:.0f}" if math.isnan(iv.lo) else f"{iv.median:.0f} [{iv.lo:.0f}, {iv.hi:.0f}]")


def _fmt_mib(xs):
    iv = S.interval([x / MiB for x in xs])
    return "n/a" if iv.n == 0 else (f"{iv.median:.0f}" if math.isnan(iv.lo) else f"{iv.median:.0f} [{iv.lo:.0f}, {iv.hi:.0f}]")


def _verdict(rows, *args):
    """A Verdict that knows the rows it compares (``unresolved`` asks whether they all repeat)."""
    v = S.Verdict(*args)
    v.rows = rows
    return v


def _paired(xs, ys, f):
    """f(x, y) for each repetition in which both rows were measured (each result has its "rep":
    the repetitions added for an open verdict run only the rows it compares)."""
    by_rep = {y["rep"]: y for y in ys if "error" not in y}
    return [f(x, by_rep[x["rep"]]) for x in xs if "error" not in x and x["rep"] in by_rep]


def _verdicts(res, cfg):
    """The targets over what was measured: res[row] is a list of per-repetition dicts."""
    def ok(row):
        return [x for x in res.get(row, []) if "error" not in x]

    def paired(a, b, f):
        return _paired(res.get(a, []), res.get(b, []), f)

    out = []
    mem = {row: S.interval([x["growth"] / x["dataset"] for x in ok(row)]) for row in OURS}
    st = {row: S.judge(iv, MEM_GOAL, higher_is_better=False) for row, iv in mem.items()}
    worst = max(OURS, key=lambda r: mem[r].median if mem[r].n else -1)
    status = S.combine(st.values())
    detail = "; ".join(f"{r}: {mem[r].text(3)}" for r in OURS)
    size = S.interval([x["dataset"] for row in OURS for x in ok(row)])
    if size.n and size.median < MEM_MIN_DATASET and status not in (S.MET, S.NOT_RUN):
        status = S.NOT_RESOLVED
        detail += (f" (the dataset is {size.median / MiB:.0f} MiB, under the {MEM_MIN_DATASET // MiB} MiB this target "
                   f"is set for, where the threads' fixed few MiB weigh more: judged by a full run's 1 000 000 records)")
    out.append(_verdict(OURS, f"memory: ours grow <= {MEM_GOAL:.0%} of the dataset's PSS (Loader, drop-in; 2 and 4 workers)",
                         f"worst {worst}: {mem[worst].text(3)}", status, detail))
    speed = S.interval(paired(LOADER2, FORK2, lambda x, y: x["bps"] / y["bps"]))
    out.append(_verdict((LOADER2, FORK2), f"tiny samples: Loader(workers=2) loads >= {SPEED_GOAL:g} x the batches/s of torch's "
                         "DataLoader(num_workers=2)", speed.text(2), S.judge(speed, SPEED_GOAL, True)))
    peers = [p for p in P.PEERS if ok(p)]
    if peers:
        vs = {p: S.interval(paired(LOADER2, p, lambda x, y: x["bps"] / y["bps"])) for p in peers}
        best = min(peers, key=lambda p: vs[p].median)
        # More repetitions run the Loader and the peers still in doubt (SPDL's epoch takes minutes).
        doubt = [p for p in peers if S.judge(vs[p], 1.0, True) == S.INCONCLUSIVE] or peers
        out.append(_verdict((LOADER2, *doubt), "tiny samples: Loader(workers=2) ahead of every thread peer (batches/s ratio > 1)",
                             f"closest {best}: {vs[best].text(2)}",
                             S.combine(S.judge(iv, 1.0, True) for iv in vs.values()),
                             "; ".join(f"{p}: {iv.text(2)}" for p, iv in vs.items())))
    for other, goal in ((FS2, FIRST_FS), (FORK2, FIRST_FORK)):
        ivs = {r: S.interval(paired(r, other, lambda x, y: x["first_s"] / y["first_s"])) for r in (LOADER2, DROPIN2)}
        out.append(_verdict((LOADER2, DROPIN2, other), f"first batch of a fresh loader <= {goal:g} x torch's DataLoader(num_workers=2) "
                             f"with {'forkserver' if other == FS2 else 'fork'} (time; Loader and drop-in, 2 workers)",
                             "; ".join(f"{r.split('(')[0]}: {iv.text(3)}" for r, iv in ivs.items()),
                             S.combine(S.judge(iv, goal, False) for iv in ivs.values())))
    return out


def _validate_verdicts(val):
    out = []
    for other in (FORK2, FS2):
        iv = S.interval(_paired(val.get(DROPIN2, []), val.get(other, []), lambda x, y: x["total_s"] / y["total_s"]))
        out.append(_verdict((DROPIN2, other), f"training + evaluation loop: the drop-in's wall time <= {VALIDATE_GOAL:g} x torch's "
                             f"({'forkserver' if other == FS2 else 'fork'}, the same arguments)", iv.text(2),
                             S.judge(iv, VALIDATE_GOAL, False)))
    return out


def run(cfg, say):
    try:
        import torch  # noqa: F401
    except ImportError as e:
        return {"tables": [], "verdicts": [], "data": {}, "skipped": f"torch does not import ({e})"}
    res = {row: [] for row in ROWS}
    val = {row: [] for row in VALIDATE_ROWS}
    v = cfg["validate"]

    def open_rows(verdicts, core):
        """The rows compared by the verdicts still open that more repetitions can settle: --quick
        adds repetitions of its core rows only (SPDL's epoch alone would take minutes)."""
        vs = [x for x in verdicts if x.status == S.INCONCLUSIVE and (not cfg["quick"] or set(x.rows) <= set(core))]
        return {row for x in vs for row in x.rows}

    def added():   # (epoch rows, training + evaluation rows) for a repetition after the planned ones
        return open_rows(_verdicts(res, cfg), CORE), open_rows(_validate_verdicts(val), VALIDATE_CORE)

    for rep in S.repetitions(cfg, lambda: any(added()), say):
        if rep < cfg["reps"]:
            extra = rep < cfg["extra_reps"]
            rows, val_rows = CORE + EXTRA * extra, VALIDATE_CORE + VALIDATE_EXTRA * extra
        else:
            wanted, val_wanted = added()
            rows, val_rows = [r for r in ROWS if r in wanted], [r for r in VALIDATE_ROWS if r in val_wanted]
        for row in U.rotate(rows, rep):
            say(f"repetition {rep + 1}: {row}")
            res[row].append({**_epoch_row(row, cfg), "rep": rep})
        for row in U.rotate(val_rows, rep):
            say(f"repetition {rep + 1}: training + evaluation, {row}")
            val[row].append({**run_tree(_cmd("validate", row, v["train"], v["eval"], v["epochs"], v["step_s"]),
                                        cfg["timeout_s"])[0], "rep": rep})
    say("a dataset holding a lock")
    locked = {row: run_tree(_cmd("lock", row, cfg["lock_records"]), cfg["timeout_s"])[0] for row in LOCK_ROWS}
    verdicts = _verdicts(res, cfg) + _validate_verdicts(val)
    return {"tables": _tables(res, val, locked, cfg), "verdicts": verdicts,
            "data": {"results": res, "validate": val, "locked": locked, "records": cfg["records"]}}


def _tables(res, val, locked, cfg):
    data_b = [x["dataset"] for rows in res.values() for x in rows if "error" not in x]
    lines = [f"  dataset: {cfg['records']:,} records, {_med(data_b) / MiB:.0f} MiB of PSS (median); "
             f"batches of {BATCH}, shuffled; median [95% interval] over repetitions", ""]
    plain = {x["rep"]: x for x in res[PLAIN] if "error" not in x}
    tab, notes = [], []
    for row in ROWS:
        xs = [x for x in res[row] if "error" not in x]
        errs = [x["error"] for x in res[row] if "error" in x]
        notes += [f"  {row}: {e}" for e in dict.fromkeys(errs)]
        notes += [f"  {row}: {e}" for e in dict.fromkeys(x["exit"] for x in xs if "exit" in x)]
        if not xs:
            tab.append([row, "failed"] + [""] * 6 + [f"0 ({len(errs)} failed)"])
            continue
        over = [x["peak"] - plain[x["rep"]]["peak"] for x in xs if x["rep"] in plain]
        later = [t for x in xs for t in x["later_first_s"]]
        tab.append([row, _fmt_mib([x["peak"] for x in xs]), _fmt_mib([x["growth"] for x in xs]),
                    "-" if row == PLAIN else _fmt_mib(over), _fmt_ms([x["first_s"] for x in xs]),
                    f"{_med([x['bps'] for x in xs]):.0f}", _fmt_ms(later) if later else "-",
                    str(max(x["processes"] for x in xs)), str(len(xs)) + (f" ({len(errs)} failed)" if errs else "")])
    lines += U.table_lines(["row", "peak PSS MiB", "growth MiB", "over plain MiB", "first batch ms",
                            "batches/s", "later epochs' first ms", "processes", "runs"], tab)
    lines += notes
    lines += ["", "  growth: the tree's peak PSS during the epoch minus its PSS before the loader was made;",
              "  over plain: the peak minus the plain loop's in the same repetition; processes: the most seen at once.",
              "", "  A dataset holding a threading.Lock (cannot be pickled), "
              f"{cfg['lock_records']:,} records, one epoch:"]
    lines += U.table_lines(["row", "result"], [[row, ("error: " + r["error"]) if "error" in r
                                                else f"works ({r['batches']} batches)"] for row, r in locked.items()])
    v = cfg["validate"]
    lines += ["", f"  Training + evaluation: {v['epochs']} epochs over {v['train']:,} records "
              f"({v['train'] // BATCH} batches, a {v['step_s'] * 1e3:g} ms GIL-free step each), each followed by "
              f"a fresh evaluation loader over {v['eval'] // BATCH} batches:"]
    vt = []
    for row in VALIDATE_ROWS:
        xs = [x for x in val[row] if "error" not in x]
        if not xs:
            errs = [x["error"] for x in val[row]]
            vt.append([row, "error: " + (errs[0][:80] if errs else "not run"), "", "0"])
            continue
        vt.append([row, f"{S.interval([x['total_s'] for x in xs]).text(2)}",
                   _fmt_ms([t for x in xs for t in x["eval_s"]]), str(len(xs))])
    lines += U.table_lines(["row", "total s", "each evaluation ms", "runs"], vt)
    return lines


def plot(ax, data):
    res = data["results"]
    rows = [r for r in res if any("error" not in x for x in res[r])]
    S.row_bars(ax, {r: [x["growth"] / MiB for x in res[r] if "error" not in x] for r in rows},
               fontsize=6)
    ax.set_xlabel("peak PSS growth during one epoch, MiB (whole process tree)")
    ax.set_title(f"Memory over {data['records']:,} Python-object records, lower is better")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        _child(sys.argv[2:])
