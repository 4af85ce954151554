"""The main job: measure prefetch against every alternative on this machine.

    python bench/run.py [--quick] [--out DIR] [--sections handoff,copy,overlap,memory,mx_e2e]

Shows a progress bar, prints one table per section and the targets, and writes
DIR/bench.json (every figure, every sample), DIR/bench.txt (the tables) and
DIR/bench.png (the plot). All comparisons are ratios measured in this process,
interleaved, over several repetitions, with the cyclic GC off while timing.
--quick takes under 2 minutes on 2 cores. Missing optional packages
(prefetch_generator, mxnet, matplotlib, tqdm) turn their rows into a note.
Exit status: 0 when every section ran (targets met or not), 1 when one crashed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _util as U  # noqa: E402
import bench_copy  # noqa: E402
import bench_handoff  # noqa: E402
import bench_memory  # noqa: E402
import bench_mx_e2e  # noqa: E402
import bench_overlap  # noqa: E402

SECTIONS = {
    "handoff": bench_handoff,
    "copy": bench_copy,
    "overlap": bench_overlap,
    "memory": bench_memory,
    "mx_e2e": bench_mx_e2e,
}

TARGET_TEXT = {
    "handoff_vs_naive_safe": "hand-off extra cost <= 1/5 of queue.Queue + np.copy",
    "handoff_vs_mx_prefetchingiter": "hand-off extra cost <= 1/30 of mx.io.PrefetchingIter",
    "copy_w1_vs_copyto_1t": "copy >= 0.9x 1-thread np.copyto (>= 1 MiB), workers=1",
    "copy_w2_vs_copyto_2t": "copy >= 0.9x 2-thread np.copyto (>= 1 MiB), workers=2",
    "overlap_gil_released": "overlap >= 0.97 when both sides release the GIL",
    "zero_faults_steady_state": "zero page faults per batch in steady state",
}


def _targets_lines(targets):
    rows = []
    for key, text in TARGET_TEXT.items():
        t = targets.get(key)
        if t is None:
            continue
        met = t.get("met")
        verdict = "n/a" if met is None else ("MET" if met else "MISSED")
        if "ratio" in t:
            val = f"{t['ratio']:.3f} at depth {t['depth']}"
        elif "worst_ratio" in t:
            val = f"worst {t['worst_ratio']:.2f} at {U.human_bytes(t['worst_size'])}"
        elif "worst" in t:
            val = f"worst {t['worst']:.3f} ({t['worst_case']})"
            if t.get("inrun_worst") is not None:
                val += f"; in-run P,C: worst {t['inrun_worst']:.3f}"
        elif "by_size" in t:
            late = t.get("late_pool_blocks_by_size") or {}
            val = ", ".join((f"{U.human_bytes(int(s))}: {v:.1f}" + (f" ({late[s]} late block)" if late.get(s) else ""))
                            if v is not None else f"{s}: n/a" for s, v in t["by_size"].items())
        else:
            val = t.get("why") or ""
        rows.append([text, verdict, val[:90]])
    return ["Targets (issue 4; ratios from this run):"] + U.table_lines(["target", "verdict", "measured"], rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description="prefetch benchmarks: the main job",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (< 2 min on 2 cores)")
    ap.add_argument("--out", default=os.path.join(HERE, "out"), help="folder for bench.json/.txt/.png")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help="comma list of: " + ", ".join(SECTIONS))
    ap.add_argument("--reps", type=int, help="repetitions for every timed section")
    ap.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")], help="hand-off depths, e.g. 1,4,16")
    ap.add_argument("--sizes", type=lambda s: [U.parse_size(x) for x in s.split(",")],
                    help="copy sizes, e.g. 64k,1m,16m,256m")
    ap.add_argument("--no-mx", action="store_true", help="leave MXNet rows out even when it imports")
    ap.add_argument("--wait-idle", type=float, default=0, metavar="S",
                    help="before each section, wait up to S s for other processes to go quiet")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)

    wanted = [s.strip() for s in a.sections.split(",") if s.strip()]
    bad = [s for s in wanted if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {bad}; choose from {list(SECTIONS)}")
    if a.no_mx and "mx_e2e" in wanted:
        wanted.remove("mx_e2e")
    cfgs = {}
    for s in wanted:
        cfg = SECTIONS[s].default_cfg(a.quick)
        if a.reps and "reps" in cfg:
            cfg["reps"] = a.reps
        if s == "handoff":
            cfg["no_mx"] = a.no_mx
            if a.depths:
                cfg["depths"] = a.depths
        if s == "copy" and a.sizes:
            cfg["sizes"] = a.sizes
        cfgs[s] = cfg

    env = U.env_info()
    print(f"prefetch bench ({'quick' if a.quick else 'full'}): Python {env['python']}, numpy {env['numpy']}, "
          f"{env.get('cpu', '?')}, {env['cpu_count']} cores, mxnet {env['mxnet'] or 'absent'}", file=sys.stderr)
    print(f"prefetch {env['prefetch'] or 'NOT IMPORTABLE'} from {env['prefetch_file']}", file=sys.stderr)
    if env["prefetch_standin"]:
        print("WARNING: this is a stand-in prefetch, not the real core", file=sys.stderr)

    total = sum(SECTIONS[s].steps(cfgs[s]) for s in wanted)
    prog = U.Progress(total, enabled=not a.no_progress)
    t_start = time.perf_counter()
    waited = 0.0
    result = {"quick": a.quick, "argv": sys.argv[1:] if argv is None else argv, "env": env,
              "config": cfgs, "sections": {}, "errors": {}, "section_wall_s": {}, "others_cpu": {}}
    for i, s in enumerate(wanted, 1):
        if prog._bar is None or getattr(prog._bar, "disable", False):
            print(f"[{i}/{len(wanted)}] {s} ...", file=sys.stderr, flush=True)
        if a.wait_idle > 0:
            prog.set(f"waiting for a quiet machine before {s}")
            tw = time.perf_counter()
            U.wait_idle(a.wait_idle)
            waited += time.perf_counter() - tw
        t0 = time.perf_counter()
        snap = U.cpu_snapshot()
        try:
            result["sections"][s] = SECTIONS[s].run(cfgs[s], prog)
        except Exception:
            result["errors"][s] = traceback.format_exc()
            print(f"\nsection {s} failed:\n{result['errors'][s]}", file=sys.stderr)
        result["section_wall_s"][s] = round(time.perf_counter() - t0, 1)
        result["others_cpu"][s] = U.others_cpu(snap, U.cpu_snapshot())
    prog.close()
    result["waited_s"] = round(waited, 1)
    result["wall_s"] = round(time.perf_counter() - t_start - waited, 1)

    targets = {}
    for s, r in result["sections"].items():
        targets.update(r.get("targets", {}))
    result["targets"] = targets

    lines = [f"prefetch bench, {'quick' if a.quick else 'full'} mode, {env['time_utc']}: "
             f"{env.get('cpu', '?')}, {env['cpu_count']} cores, Python {env['python']}, numpy {env['numpy']}, "
             f"prefetch {env['prefetch']}, mxnet {env['mxnet'] or 'absent'}",
             f"command: python bench/run.py {' '.join(result['argv'])}".rstrip(), ""]
    for s in wanted:
        if s in result["sections"]:
            lines += SECTIONS[s].report(result["sections"][s]) + [""]
        else:
            lines += [f"[{s}] FAILED: " + result["errors"][s].strip().splitlines()[-1], ""]
    lines += _targets_lines(targets)
    lines.append(f"wall time {result['wall_s']} s (" + ", ".join(f"{k} {v} s" for k, v in result["section_wall_s"].items()) + ")"
                 + (f" + {result['waited_s']} s waiting for a quiet machine" if waited else ""))
    busy = {k: v for k, v in result["others_cpu"].items() if v is not None}
    if busy:
        lines.append("CPU share used by other processes during each section: "
                     + ", ".join(f"{k} {v:.0%}" for k, v in busy.items())
                     + ("  <- the machine was busy: figures disturbed" if max(busy.values()) > 0.1 else ""))
    text = "\n".join(lines)
    print(text)

    os.makedirs(a.out, exist_ok=True)
    jpath = os.path.join(a.out, "bench.json")
    with open(jpath, "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(os.path.join(a.out, "bench.txt"), "w") as f:
        f.write(text + "\n")
    written = [jpath, os.path.join(a.out, "bench.txt")]
    if not a.no_plot:
        try:
            import plot
            ppath = os.path.join(a.out, "bench.png")
            plot.plot(result, ppath)
            written.append(ppath)
        except ImportError as e:
            print(f"(no plot: {e}; pip install matplotlib)", file=sys.stderr)
        except Exception:
            print("plot failed:\n" + traceback.format_exc(), file=sys.stderr)
    print("wrote " + ", ".join(written))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
