"""The benchmark: prefetch beside a plain loop, a threading + queue.Queue
prefetcher and mx.io.PrefetchingIter, on this machine, in one run.

    python bench/run.py [--quick] [--out DIR] [--sections a,b] [--reps N] [section options]

Prints a summary sentence, the targets with their verdicts, then one table per
section; writes DIR/bench.txt (the report), DIR/bench.json (every sample) and
DIR/bench.png (the plot). Every figure is the median over repetitions with its
95 % interval; rows are interleaved within each repetition, so machine noise
hits all rows alike. A target is "met" only when its whole interval clears it,
"missed" when the whole interval is on the wrong side, else "inconclusive".
--quick (CI smoke) takes under 3 minutes on 2 cores. Exit status 0 when every
section ran, whatever the verdicts; 1 when a section crashed.

Adding a section: write bench/bench_<name>.py and add <name> to SECTIONS below.
The module provides
    TITLE                    a heading in the user's words
    config(args) -> dict     its parameters from the parsed command line
                             (args.quick, args.reps, args.no_mx and its own)
    run(cfg, say) -> dict    {"tables": [lines], "verdicts": [_stats.Verdict],
                              "data": JSON-able figures}; say(text) shows progress
and optionally
    add_arguments(group)     its own command-line options (names unique across sections)
    plot(ax, data)           one matplotlib panel from its "data" (as read back from JSON)
Use only the public prefetch API (prefetch.Prefetcher, .stats(), prefetch.mx).
"""
from __future__ import annotations

import argparse
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

SECTIONS = ["handoff", "handover", "copy", "memory", "overlap", "mx_engine", "mx_e2e", "torch", "tree"]

try:
    import _stats as S  # needs scipy
    import _util as U
except ImportError as e:
    sys.exit(f"bench/run.py needs {e.name}: pip install '.[bench]' (or pip install scipy numpy)")


def _sections():
    return {name: importlib.import_module(f"bench_{name}") for name in SECTIONS}


def _parser(mods):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI smoke: fewer sizes and repetitions (< 3 min on 2 cores)")
    ap.add_argument("--out", default=os.path.join(HERE, "out"), help="folder for bench.txt, bench.json, bench.png")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma list of: " + ", ".join(SECTIONS))
    ap.add_argument("--reps", type=int, help="repetitions of every timed row (>= 6 for a 95%% interval)")
    ap.add_argument("--no-mx", action="store_true", help="leave the MXNet rows out even when it imports")
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


def _summary(env, quick, wanted, verdicts, mods, load):
    by = {}
    for v in verdicts:
        by.setdefault(v.status, []).append(v.target)
    what = ", ".join(t if t[1].isupper() else t[0].lower() + t[1:] for t in (mods[s].TITLE for s in wanted))
    counts = "; ".join(f"{st} {len(by[st])}" + (f" ({'; '.join(by[st])})" if st in (S.MET, S.MISSED) else "")
                       for st in (S.MET, S.MISSED, S.INCONCLUSIVE, S.NOT_RUN) if st in by)
    return (f"Measured {what} of prefetch against a plain loop, a threading + queue.Queue prefetcher"
            f"{' and mx.io.PrefetchingIter' if env['mxnet'] else ''} ({'quick' if quick else 'full'} run) "
            f"on {env['cpu']}, {env['cores']} cores, Python {env['python']}, numpy {env['numpy']}"
            f"{', mxnet ' + env['mxnet'] if env['mxnet'] else ''}. "
            f"Of {len(verdicts)} targets: {counts or 'none judged'}."
            + (f" The machine was busy (load average up to {load:.1f} on {env['cores']} cores): expect wide "
               "intervals, and figures that differ from a quiet machine's." if load and load > 0.5 * env["cores"] else ""))


def main(argv=None):
    mods = _sections()
    a = _parser(mods).parse_args(argv)
    wanted = [s.strip() for s in a.sections.split(",") if s.strip()]
    bad = [s for s in wanted if s not in mods]
    if bad:
        sys.exit(f"--sections: unknown section(s) {bad}; choose from {SECTIONS}")
    if a.reps is not None and a.reps < 1:
        sys.exit(f"--reps must be >= 1, got {a.reps}")
    env = U.env_info()
    load0, t_start = U.load_average(), time.perf_counter()
    results, errors, verdicts = {}, {}, []
    for s in wanted:
        say = _say(s)
        t0 = time.perf_counter()
        try:
            cfg = mods[s].config(a)
            r = mods[s].run(cfg, say)
            r["config"], r["wall_s"] = cfg, round(time.perf_counter() - t0, 1)
            results[s] = r
            verdicts += r["verdicts"]
        except Exception:  # noqa: BLE001 - one crashed section must not lose the others' figures
            errors[s] = traceback.format_exc()
            print(f"\n[{s}] failed:\n{errors[s]}", file=sys.stderr)
        say(f"done in {time.perf_counter() - t0:.0f} s", final=True)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    wall = time.perf_counter() - t_start
    load1 = U.load_average()

    lines = [_summary(env, a.quick, wanted, verdicts, mods, max(x or 0 for x in (load0, load1))), ""]
    lines += U.table_lines(["target", "measured: median [95% interval]", "verdict"],
                           [[v.target, v.measured, v.status.upper()] for v in verdicts], indent="")
    lines += [f"  {v.target}: {v.note}" for v in verdicts if v.note and "; " in v.note]
    lines += ["", "Met: the whole 95% interval clears the target; missed: the whole interval is on the wrong side;",
              "inconclusive: the interval straddles the target (too noisy or too close to tell).",
              (f"Run: {env['time_utc']}, {wall:.0f} s; load average {load0 or 0:.2f} before, {load1 or 0:.2f} after "
               "(above ~0.5 per core other processes shared the machine: expect wide intervals)."), ""]
    for s in wanted:
        lines.append(f"== {mods[s].TITLE} ==")
        if s in errors:
            lines += ["  FAILED: " + errors[s].strip().splitlines()[-1], ""]
            continue
        doc = (mods[s].__doc__ or "").strip().splitlines()  # what the section measures, for the reader
        lines += ["  " + x for x in doc] + [""] + results[s]["tables"] + [f"  ({results[s]['wall_s']} s)", ""]
    text = "\n".join(lines)
    print(text)

    os.makedirs(a.out, exist_ok=True)
    out = {"quick": a.quick, "argv": sys.argv[1:] if argv is None else argv, "env": env, "wall_s": wall,
           "load_average": [load0, load1], "summary": lines[0],
           "verdicts": [v.as_dict() for v in verdicts], "errors": errors,
           "sections": {s: {"title": mods[s].TITLE, "config": r["config"], "data": r["data"]}
                        for s, r in results.items()}}
    written = []
    for name, body in (("bench.txt", text + "\n"), ("bench.json", json.dumps(out, indent=1, default=str))):
        with open(os.path.join(a.out, name), "w") as f:
            f.write(body)
        written.append(os.path.join(a.out, name))
    if not a.no_plot:
        try:
            import plot
            plot.plot(json.loads(json.dumps(out, default=str)), os.path.join(a.out, "bench.png"))
            written.append(os.path.join(a.out, "bench.png"))
        except ImportError as e:
            print(f"(no plot: {e}; pip install matplotlib)", file=sys.stderr)
    print("wrote " + ", ".join(written))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
