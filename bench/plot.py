"""The benchmark's figure: one panel per section that has a plot(ax, data).

    python bench/plot.py out/bench.json [out.png]

Legends sit beside their panel, never over the data.
"""
from __future__ import annotations

import importlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    secs = [(s, importlib.import_module(f"bench_{s}"), r["data"]) for s, r in res["sections"].items()]
    secs = [(s, m, d) for s, m, d in secs if hasattr(m, "plot") and d]
    if not secs:
        return
    fig, axes = plt.subplots(len(secs), 1, figsize=(13, 4.2 * len(secs)), layout="constrained", squeeze=False)
    env = res["env"]
    fig.suptitle(f"prefetch benchmark ({'quick' if res['quick'] else 'full'} run, {env['time_utc']}): "
                 f"{env['cpu']}, {env['cores']} cores, Python {env['python']}, numpy {env['numpy']}"
                 + (f", mxnet {env['mxnet']}" if env.get("mxnet") else ""), fontsize=11)
    for ax, (_, mod, data) in zip(axes[:, 0], secs):
        mod.plot(ax, data)
        ax.grid(True, which="major", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.savefig(path, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        data = json.load(f)
    plot(data, sys.argv[2] if len(sys.argv) > 2 else sys.argv[1].rsplit(".", 1)[0] + ".png")
