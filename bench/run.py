"""The benchmark: prefetch beside what a user would otherwise write, on this machine, in one run.

    python bench/run.py [--quick] [--out DIR] [--sections a,b] [--reps N] [--max-reps N] [section options]

--quick runs the headline's section and the cheaper ones (QUICK_SECTIONS) with
fewer sizes and repetitions (meant to stay under 90 s on a quiet 2-core
machine); --sections all runs every section in quick mode (CI's smoke test).

Prints one sentence first (what is faster than what, by how much, on this
machine: the headline of the first section that declares one), the count of
targets by verdict, the targets, then one table per section; writes
DIR/bench.txt (the report), DIR/bench.json (every sample) and DIR/bench.png
(the plot), all three or none. Every figure is the median over repetitions
with its 95 % interval; rows are interleaved within each repetition, so machine
noise hits all rows alike. A target is "met" only when its whole interval
clears it, "missed" when the whole interval is on the wrong side; while an
interval straddles its target the section adds repetitions (up to --max-reps),
and what is still open then is "inconclusive". --quick calls a target from its
median, where the median clears it by 10 % and the interval does not reach 10 %
past it on the other side; otherwise the target is "provisional"
(bench/_stats.py says why). How busy the machine was is the CPU time of other processes
(the benchmark's own threads excluded). Exit status 0 when every section ran,
whatever the verdicts; 1 when a section crashed or the results could not be
written; 130 on Ctrl-C (nothing written).

Adding a section: write bench/bench_<name>.py and add <name> to SECTIONS below.
The module provides
    TITLE                    a heading in the user's words
    config(args) -> dict     its parameters from the parsed command line
                             (args.quick, args.reps, args.no_mx and its own); "reps" is the
                             planned repetitions, and the harness adds "max_reps"
    run(cfg, say) -> dict    {"tables": [lines], "verdicts": [_stats.Verdict],
                              "data": JSON-able figures}; say(text) shows progress;
                             optional keys: "headline": _stats.Headline (the comparison the
                             report leads with), "skipped": why nothing was measured (a
                             missing dependency; the section then counts as not run)
and optionally
    GIL_WARNINGS = True      # its GILBoundWarnings are its subject; every other section's are
                             # counted by the harness (a target: none where threads run in parallel)
    MX_ROWS = True           it has rows that need MXNet: where mxnet does not import here and
                             --mx-python names an interpreter where it does (bench/main.sh
                             passes the MXNet environment's), the whole section runs there, in a
                             child process, and its results join this report
    add_arguments(group)     its own command-line options (names unique across sections)
    plot(ax, data)           one matplotlib panel from its "data" (as read back from JSON);
                             a target is drawn as a line labelled "target ..."
Loop over repetitions with _stats.repetitions(cfg, unresolved, say), unresolved()
saying whether a target's interval still straddles it.
Use only the public prefetch API (prefetch.Prefetcher, .stats(), prefetch.mx).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# One OpenMP thread for MXNet's operators, set before anything imports mxnet:
# on a 2-core machine a team on both cores would fight the prefetch thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")

SECTIONS = ["loader", "loader_val", "loader_mx", "gil", "gil_mx", "gil_load", "loader_scaling", "handoff", "handover", "copy",
            "memory", "overlap", "mx_engine", "mx_e2e", "torch", "tree", "footprint"]
# --quick runs these (what the first line states: prefetch against the loaders a user would
# use instead) unless --sections says otherwise; the others are named in the report as left
# to a full run.
QUICK_SECTIONS = ["loader", "loader_mx", "mx_engine"]

try:
    import _baselines as B
    import _stats as S  # needs numpy
    import _util as U
except ImportError as e:
    sys.exit(f"bench/run.py needs {e.name}: pip install '.[bench]' (or pip install numpy)")


def _sections():
    return {name: importlib.import_module(f"bench_{name}") for name in SECTIONS}


def _parser(mods):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the headline and the cheaper sections, fewer sizes and "
                    "repetitions (meant to stay under 90 s on a quiet 2-core machine)")
    ap.add_argument("--out", default=os.path.join(HERE, "out"), help="folder for bench.txt, bench.json, bench.png")
    ap.add_argument("--sections", help="comma list of: " + ", ".join(SECTIONS) + ", or 'all' (default: all; "
                    "with --quick: " + ", ".join(QUICK_SECTIONS) + ")")
    ap.add_argument("--reps", type=int, help="repetitions of every timed row (>= 6 for a 95%% interval)")
    ap.add_argument("--max-reps", type=int, help="cap on the repetitions a section adds while an interval "
                    "straddles its target (default: 3 x --reps in a full run; none with --reps or --quick)")
    ap.add_argument("--no-mx", action="store_true", help="leave the MXNet rows out even when it imports")
    ap.add_argument("--mx-python", help="an interpreter with mxnet and this package: the sections with MXNet rows "
                    "run there when mxnet does not import here (bench/main.sh passes its MXNet environment's)")
    ap.add_argument("--child-section", help=argparse.SUPPRESS)   # run.py's own: one section in the child
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--no-plot", action="store_true")
    for name, m in mods.items():
        if hasattr(m, "add_arguments"):
            m.add_arguments(ap.add_argument_group(f"{name}: {m.TITLE}"))
    return ap


def _say(section):
    tty = sys.stderr.isatty()  # a terminal: one line rewritten in place; a log: a line every 10 s
    last = [-1e9]

    def say(text, final=False):
        if tty:
            print("\r" + f"[{section}] {text}"[:100].ljust(100), end="", file=sys.stderr, flush=True)
        elif final or time.monotonic() - last[0] >= 10:
            last[0] = time.monotonic()
            print(f"[{section}] {text}", file=sys.stderr, flush=True)
    return say


def _machine(env):
    return f"{env['cores']}-core {env['cpu']}, Python {env['python']}"


def _headline(results, wanted, env, quick):
    """The first line (at most 160 characters: who won, by how much, against what, whether it
    holds) from the first section (in run order) that declared a headline and ran, and the
    detail after it: that comparison in full, then what every section claims beside it (its
    other comparisons with a loader a user would use instead: plain loop, torch's and Gluon's
    DataLoaders, mx.io.PrefetchingIter). None when no section declared one."""
    heads = [results[s]["headline"] for s in wanted if results.get(s, {}).get("headline") is not None]
    if not heads:
        return None
    claims = [c for s in wanted for c in results.get(s, {}).get("claims", [])]
    also = f" Also, median [95% interval]: {'; '.join(claims)}." if claims else ""
    return heads[0].first_line(env["cores"]), heads[0].sentence(_machine(env), quick) + also


def _counts(verdicts):
    by = {}
    for v in verdicts:
        by.setdefault(v.status, []).append(v.target)
    order = (S.MET, S.MISSED, S.INCONCLUSIVE, S.NOT_RESOLVED, S.NOT_RUN)
    counts = ", ".join(f"{st} {len(by[st])}" for st in order if st in by)
    return f"Of {len(verdicts)} targets: {counts or 'none judged'}."


def _busy_line(others, env, results, mods):
    """How busy the machine was: the whole run, and every section that was busy on its own
    (the verdicts it marks), so the summary never says "quiet" beside a "(busy machine)" verdict."""
    if others is None:
        return "Other processes' CPU use: unknown (no /proc here)."
    busy = [f"{mods[s].TITLE.split(':')[0]} ({r['others_cores']:.2f})" for s, r in results.items()
            if r.get("others_cores") is not None and r["others_cores"] > U.BUSY_CORES]
    line = f"Other processes used {others:.2f} of {env['cores']} cores on average during the run"
    if others > U.BUSY_CORES:
        line += ": the machine was busy, expect wide intervals and figures that differ from a quiet machine's."
    elif busy:
        line += " (quiet on average)."
    else:
        return line + " (quiet)."
    if busy:
        line += (" Busy during: " + "; ".join(busy) + " cores: their verdicts say \"(busy machine)\", and in quick "
                 "mode a target missed there is provisional, never \"missed\".")
    return line


def _ran(results):
    """Sections that measured something: not failed, not turned into a note by a missing dependency."""
    return [s for s, r in results.items() if not r.get("skipped")]


def _elsewhere(results):
    """Where sections ran in the MXNet environment: its versions."""
    envs = {(r["env"]["mxnet"], r["env"]["numpy"]) for r in results.values() if r.get("ran_in")}
    return "".join(f"; MXNet sections: mxnet {m}, numpy {n} (the MXNet environment)" for m, n in sorted(envs))


def _report(a, env, wanted, mods, results, errors, verdicts, wall, others, left):
    ran = _ran(results)
    first = _headline(results, wanted, env, a.quick)
    ran_what = f"{'Quick' if a.quick else 'Full'} run of: " + "; ".join(mods[s].TITLE for s in ran) + "."
    lines = ([*first, f"{_counts(verdicts)} {ran_what}"] if first else   # no headline: the counts lead
             [f"On this machine ({_machine(env)}): {_counts(verdicts)[0].lower()}{_counts(verdicts)[1:]}",
              ran_what])
    not_run = [f"{mods[s].TITLE} ({results[s]['skipped']})" for s in results if s not in ran]
    not_run += [f"{mods[s].TITLE} (failed)" for s in errors]
    if left:
        not_run.append("left to a full run (without --quick): " + "; ".join(mods[s].TITLE for s in left))
    if not_run:
        lines.append("Not run: " + "; ".join(not_run) + ".")
    lines.append(_busy_line(others, env, results, mods))
    lines.append("")
    lines += U.table_lines(["target", "measured: median [95% interval]", "verdict"],
                           [[v.target, v.measured, v.shown()] for v in verdicts], indent="")
    lines += [f"  {v.target}: {v.note}" for v in verdicts if v.note]
    lines += ["", "Met: the whole 95% interval clears the target; missed: the whole interval is on the wrong side;",
              "inconclusive: the interval still straddles the target after the extra repetitions; provisional: a",
              "quick run calls a target from its median (its few repetitions make a loose interval), where the",
              "median clears the target by 10 % and the interval reaches no more than 10 % past it on the other",
              "side; this one was closer, its interval too wide, or it missed while other processes were busy: run",
              "without --quick. (busy machine): other processes used the CPUs while it was measured: re-run on",
              "a quiet machine before relying on it. Every ratio is a speed ratio (ours / other, higher is better) unless",
              "its target says cost or time.",
              f"Run: {env['time_utc']}, {wall:.0f} s, {_machine(env)}, numpy {env['numpy']}"
              + (f", mxnet {env['mxnet']}" if env["mxnet"] else "") + _elsewhere(results) + ".", ""]
    for s in wanted:
        if s not in results and s not in errors:
            continue
        lines.append(f"== {mods[s].TITLE} ==")
        if s in errors:
            lines += ["  FAILED: " + errors[s].strip().splitlines()[-1], ""]
            continue
        r = results[s]
        doc = (mods[s].__doc__ or "").strip().splitlines()  # what the section measures, for the reader
        busy = "" if r["others_cores"] is None else f"; other processes used {r['others_cores']:.2f} cores"
        busy += "; in the MXNet environment" if r.get("ran_in") else ""
        lines += ["  " + x for x in doc] + [""] + r["tables"] + [f"  ({r['wall_s']} s{busy})", ""]
    return lines


def _write(out_dir, files, plot_from):
    """Write every file under a temporary name, then rename them all: a run that stops
    (disk full, Ctrl-C) leaves the previous results as they were, never half of new ones."""
    tmp = {name: os.path.join(out_dir, f".{name}.{os.getpid()}.tmp") for name in files}
    try:
        for name, body in files.items():
            with open(tmp[name], "w") as f:
                f.write(body)
        if plot_from is not None:
            png = os.path.join(out_dir, f".bench.{os.getpid()}.tmp.png")
            tmp["bench.png"] = png   # removed in finally if the plot fails half-way
            try:
                import plot
                plot.plot(plot_from, png)
            except ImportError as e:
                print(f"(no plot: {e}; pip install matplotlib)", file=sys.stderr)
            except Exception:  # noqa: BLE001 - a broken panel must not cost the report and the JSON
                print(f"(no plot: it failed:\n{traceback.format_exc()})", file=sys.stderr)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(png)
            if not os.path.exists(png):   # no matplotlib, or no section with data to draw
                del tmp["bench.png"]
        for name, path in tmp.items():
            os.replace(path, os.path.join(out_dir, name))
    finally:
        for path in tmp.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return [os.path.join(out_dir, name) for name in tmp]


def _lock(out_dir):
    """One run per output folder: a second one says who holds it and exits."""
    f = open(os.path.join(out_dir, ".lock"), "a+")  # noqa: SIM115 - held until the process exits
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "?"
        sys.exit(f"bench/run.py: another run (pid {holder}) is writing to {out_dir}; wait for it to end "
                 "(two runs at once also slow each other's figures), or pass another --out")
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def _run_section(a, mod, say):
    """One section, here: its results with its config, wall time and how busy the machine was."""
    t0, meter = time.perf_counter(), U.OtherCpu()
    cfg = mod.config(a)
    cfg["max_reps"] = _max_reps(a, cfg)
    with U.gil_warnings() as notes:
        r = mod.run(cfg, say)
    r["gil_warnings"] = [str(w) for _t, w in notes]
    r["config"], r["wall_s"] = cfg, round(time.perf_counter() - t0, 1)
    r["others_cores"] = meter.cores()
    for v in r["verdicts"]:
        v.busy = r["others_cores"] is not None and r["others_cores"] > U.BUSY_CORES
        # Quick mode states only what it resolved: an open interval, or a miss
        # measured while other processes took the CPUs the rows needed (the
        # interval covers the noise within the run, not a busier machine), is
        # provisional, never "missed".
        if a.quick and (v.status == S.INCONCLUSIVE or (v.busy and v.status == S.MISSED)):
            if v.status == S.MISSED:
                v.note = (v.note + "; " if v.note else "") + "below the target on a busy machine"
            v.status = S.NOT_RESOLVED
    return r


def _child_argv(argv):
    """The parent's options for its child: all but where the report goes and which sections run."""
    out, skip = [], {"--out", "--sections", "--mx-python", "--child-section", "--child-out"}
    it = iter(argv)
    for x in it:
        name = x.split("=", 1)[0]
        if name in skip:
            if "=" not in x:
                next(it, None)
            continue
        out.append(x)
    return out


def _run_in_child(a, s):
    """Section s in the interpreter --mx-python names (its environment has mxnet); the child
    writes the section's results as JSON, read back here as if it had run in this process."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "section.json")
        cmd = [a.mx_python, os.path.abspath(__file__), *_child_argv(a.argv), "--child-section", s, "--child-out", path]
        rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, check=False).returncode
        if rc != 0 or not os.path.exists(path):
            raise RuntimeError(f"the section {s!r} failed in {a.mx_python} (exit {rc}; its output is above)")
        with open(path) as f:
            r = json.load(f)
    r["verdicts"] = [S.Verdict(**v) for v in r["verdicts"]]
    if r.get("headline"):
        h = r["headline"]
        h["ratio"] = S.Interval(**h["ratio"])
        h["verdict"] = S.Verdict(**h["verdict"]) if h.get("verdict") else None
        r["headline"] = S.Headline(**h)
    r["ran_in"] = a.mx_python
    return r


def _child(a, mods):
    """--child-section: run that one section here and write its results to --child-out."""
    s = a.child_section
    try:
        r = _run_section(a, mods[s], _say(s))
    except KeyboardInterrupt:   # Ctrl-C reaches the parent too: it says what happened
        return 130
    r["verdicts"] = [v.as_dict() for v in r["verdicts"]]
    if r.get("headline") is not None:
        r["headline"] = r["headline"].as_dict()
    r["env"] = U.env_info()
    with open(a.child_out, "w") as f:
        json.dump(r, f, default=str)
    return 0


def main(argv=None):
    mods = _sections()
    a = _parser(mods).parse_args(argv)
    import _stats as S  # needs numpy
    S.quick_margin = 0.10 if a.quick else 0.0
    a.argv = sys.argv[1:] if argv is None else list(argv)
    if a.child_section:
        return _child(a, mods)
    chosen = a.sections or ",".join(QUICK_SECTIONS if a.quick else SECTIONS)
    wanted = SECTIONS if chosen == "all" else [s.strip() for s in chosen.split(",") if s.strip()]
    left = [] if a.sections else [s for s in SECTIONS if s not in wanted]
    bad = [s for s in wanted if s not in mods]
    if bad:
        sys.exit(f"--sections: unknown section(s) {bad}; choose from {SECTIONS}")
    for opt in ("reps", "max_reps"):
        if getattr(a, opt) is not None and getattr(a, opt) < 1:
            sys.exit(f"--{opt.replace('_', '-')} must be >= 1, got {getattr(a, opt)}")
    try:
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        sys.exit(f"bench/run.py: cannot make the output folder {a.out}: {e.strerror}")
    lock = _lock(a.out)
    env = U.env_info()
    t_start, machine = time.perf_counter(), U.OtherCpu()
    results, errors, verdicts = {}, {}, []
    current = None
    mx_elsewhere = a.mx_python and B.load_mx()[0] is None
    try:
        for s in wanted:
            current, say = s, _say(s)
            t0 = time.perf_counter()
            try:
                if mx_elsewhere and getattr(mods[s], "MX_ROWS", False):
                    r = _run_in_child(a, s)
                else:
                    r = _run_section(a, mods[s], say)
                results[s] = r
                verdicts += r["verdicts"]
            except Exception:  # noqa: BLE001 - one crashed section must not lose the others' figures
                errors[s] = traceback.format_exc()
                print(f"\n[{s}] failed:\n{errors[s]}", file=sys.stderr)
            say(f"done in {time.perf_counter() - t0:.0f} s", final=True)
    except KeyboardInterrupt:
        print(f"\nbench/run.py: interrupted during the {current!r} section; nothing written "
              f"(what {a.out} held before is unchanged).", file=sys.stderr)
        return 130
    if sys.stderr.isatty():
        print(file=sys.stderr)
    wall, others = time.perf_counter() - t_start, machine.cores()
    verdicts += _gil_verdict(results, mods)

    lines = _report(a, env, wanted, mods, results, errors, verdicts, wall, others, left)
    text = "\n".join(lines)
    out = {"quick": a.quick, "argv": sys.argv[1:] if argv is None else argv, "env": env, "wall_s": wall,
           "others_cores": others, "headline": lines[0], "summary": lines[1],
           "verdicts": [v.as_dict() for v in verdicts], "errors": errors, "ran": _ran(results),
           "sections": {s: {"title": mods[s].TITLE, "config": r["config"], "data": r["data"],
                            "headline": r["headline"].as_dict() if r.get("headline") else None}
                        for s, r in results.items() if not r.get("skipped")}}
    # The files first: a reader that closes stdout early (| head) must not cost the results.
    try:
        written = _write(a.out, {"bench.txt": text + "\n", "bench.json": json.dumps(out, indent=1, default=str)},
                         None if a.no_plot else json.loads(json.dumps(out, default=str)))
        failed = None
    except KeyboardInterrupt:
        print(f"bench/run.py: interrupted while writing; nothing written ({a.out} is unchanged).", file=sys.stderr)
        return 130
    except OSError as e:
        written, failed = [], (f"bench/run.py: could not write the results to {a.out}: {e.strerror or e}; nothing "
                               f"written (what {a.out} held before is unchanged). The report is above.")
    finally:
        lock.close()
    try:
        print(text)
        if written:
            print("wrote " + ", ".join(written))
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # the reader left; files are written
    if failed:
        print(failed, file=sys.stderr)
        return 1
    return 1 if errors else 0


def _gil_verdict(results, mods):
    """GILBoundWarnings given in every section that ran, but those whose subject they are
    (GIL_WARNINGS): none is the target (their threads run in parallel, or wait for CPUs)."""
    counted = {s: r.get("gil_warnings", []) for s, r in results.items()
               if not r.get("skipped") and not getattr(mods[s], "GIL_WARNINGS", False)}
    if not counted:
        return []
    n = sum(len(w) for w in counted.values())
    where = "; ".join(f"{mods[s].TITLE.split(':')[0]}: {len(w)}" for s, w in counted.items() if w)
    v = S.Verdict(f"no GILBoundWarning in the sections where threads run in parallel ({len(counted)} of "
                  f"{len(results)} sections run)", f"{n} warning(s)" + (f" ({where})" if where else ""),
                  S.MISSED if n else S.MET)
    if n:
        v.note = "first: " + next(w[0] for w in counted.values() if w)
    v.busy = any((results[s].get("others_cores") or 0) > U.BUSY_CORES for s in counted)
    return [v]


def _max_reps(a, cfg):
    """The cap on repetitions when an interval straddles its target: --max-reps, else none
    beyond an explicit --reps or in --quick (it calls a target from its median, which more
    repetitions barely move), else 3 x the planned ones."""
    if a.max_reps is not None:
        return max(a.max_reps, cfg.get("reps", 1))
    if a.reps is not None or a.quick or "reps" not in cfg:
        return cfg.get("reps", 1)
    return cfg["reps"] * 3


if __name__ == "__main__":
    sys.exit(main())
