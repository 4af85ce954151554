"""PNG plot of a bench/run.py JSON file: python bench/plot.py out/bench.json [out.png]"""
from __future__ import annotations

import json
import sys


def _short(name):
    return (name.replace(" (no prefetch)", "").replace("prefetch_generator.", "")
            .replace(" (naive safe)", " (safe)").replace(" (no copy: unsafe)", " (unsafe)")
            .replace(", reused dst (limit)", " (limit)").replace(" (depth fixed at 1)", ""))


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    secs = res.get("sections", {})
    fig, axes = plt.subplots(2, 3, figsize=(18, 10))
    ax = axes.ravel()
    env = res.get("env", {})
    fig.suptitle(f"prefetch bench ({'quick' if res.get('quick') else 'full'}) — {env.get('cpu', '?')}, "
                 f"{env.get('cpu_count')} cores, Python {env.get('python')}, numpy {env.get('numpy')}, "
                 f"prefetch {env.get('prefetch')}, {env.get('time_utc', '')}", fontsize=10)

    h = secs.get("handoff")
    a = ax[0]
    if h and "rows" in h:
        depths = h["params"]["depths"]
        for name, r in h["rows"].items():
            ys = [r["by_depth"][str(d)]["extra_us"] for d in depths]
            if ys[0] is None:
                continue
            med = [max(y["median"], 1e-3) for y in ys]
            lo = [max(y["median"] - y["lo"], 0) for y in ys]
            hi = [max(y["hi"] - y["median"], 0) for y in ys]
            style = "-o" if "prefetch." in name else "--s"
            a.errorbar(depths, med, yerr=[lo, hi], fmt=style, capsize=3, label=_short(name))
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("depth")
        a.set_ylabel("extra µs per batch over plain loop")
        a.set_title("[1] hand-off cost, tiny batch (lower is better)")
        a.legend(fontsize=7)
    else:
        a.set_axis_off()

    c = secs.get("copy")
    a = ax[1]
    if c and "rows" in c:
        sizes = c["params"]["sizes"]
        for name, r in c["rows"].items():
            ys = [r[str(s)]["median"] for s in sizes]
            style = "-o" if "prefetch." in name else ("k:" if "limit" in name else "--s")
            if "2 threads" in name:
                style = "k-."
            a.plot([s / 2**20 for s in sizes], ys, style, label=_short(name))
        a.set_xscale("log", base=2)
        a.set_xticks([sz / 2**20 for sz in sizes])
        a.set_xticklabels([f"{sz // 2**10}K" if sz < 2**20 else f"{sz // 2**20}M" for sz in sizes])
        a.set_xlabel("batch size (bytes)")
        a.set_ylabel("GB/s")
        a.set_title("[2] copy throughput (higher is better)")
        a.legend(fontsize=7)
    else:
        a.set_axis_off()

    o = secs.get("overlap")
    a = ax[2]
    if o and "cases" in o:
        cases = list(o["cases"])
        rows = list(o["cases"][cases[0]]["rows"])
        w = 0.8 / max(1, len(rows))
        inrun = all(o["cases"][cc]["rows"][r].get("efficiency_inrun") for cc in cases for r in rows
                    if "bare" not in r)
        key = "efficiency_inrun" if inrun else "efficiency"
        rows = [r for r in rows if o["cases"][cases[0]]["rows"][r].get(key)]
        w = 0.8 / max(1, len(rows))
        for i, r in enumerate(rows):
            a.bar([j + i * w for j in range(len(cases))],
                  [o["cases"][cc]["rows"][r][key]["median"] for cc in cases], w, label=_short(r))
        a.axhline(0.97, color="k", lw=0.8, ls="--")
        a.set_xticks([j + 0.4 - w / 2 for j in range(len(cases))])
        a.set_xticklabels([cc.replace(", ", "\n").replace(" P=", "\nP=") for cc in cases], fontsize=7)
        a.set_ylim(0, 1.15)
        a.set_ylabel("N·max(P,C) / total" + (" (P, C timed in the run)" if inrun else ""))
        a.set_title("[3] overlap efficiency (1.0 = perfect; dashed 0.97)")
        a.legend(fontsize=7, loc="upper center", ncol=2)
    else:
        a.set_axis_off()

    m = secs.get("memory")
    for k, (key, label, title) in enumerate((("faults_per_batch", "minor page faults per batch", "[4] page faults per batch, steady state"),
                                             ("ms_per_batch", "ms per batch", "[4] time per batch in the long run"))):
        a = ax[3 + k]
        if m and m.get("results"):
            sizes = [s for s, _ in m["params"]["plan"]]
            rows = list(m["results"])
            w = 0.8 / max(1, len(rows))
            for i, r in enumerate(rows):
                a.bar([j + i * w for j in range(len(sizes))],
                      [m["results"][r].get(str(s), {}).get(key) or 0 for s in sizes], w, label=_short(r))
            a.set_xticks([j + 0.4 - w / 2 for j in range(len(sizes))])
            a.set_xticklabels([f"{s / 2**20:g} MiB" for s in sizes])
            a.set_yscale("symlog" if key == "faults_per_batch" else "log")
            a.set_ylabel(label)
            a.set_title(title)
            a.legend(fontsize=7)
        else:
            a.set_axis_off()

    e = secs.get("mx_e2e")
    a = ax[5]
    if not (e and e.get("summary")):
        # no MXNet section: the targets, as text
        a.set_axis_off()
        lines = ["Targets (this run):"]
        for k, t in (res.get("targets") or {}).items():
            met = t.get("met")
            lines.append(f"{'n/a ' if met is None else ('MET ' if met else 'MISS')}  {k}")
        busy = {k: v for k, v in (res.get("others_cpu") or {}).items() if v is not None}
        if busy:
            lines.append("")
            lines.append("CPU used by other processes: " + ", ".join(f"{k} {v:.0%}" for k, v in busy.items()))
        a.text(0.0, 1.0, "\n".join(lines), va="top", family="monospace", fontsize=8, transform=a.transAxes)
    else:
        a.clear()
        ks = list(e["summary"])
        a.bar(range(len(ks)), [e["summary"][k]["median"] for k in ks])
        a.set_xticks(range(len(ks)))
        a.set_xticklabels(ks)
        a.set_ylabel("s per epoch")
        a.set_title("[5] MXNet Module.fit epoch time (lower is better)")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        data = json.load(f)
    plot(data, sys.argv[2] if len(sys.argv) > 2 else sys.argv[1].rsplit(".", 1)[0] + ".png")
