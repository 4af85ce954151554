"""The benchmark's figure: one panel per section that ran, the headline's section first.

    python bench/plot.py out/bench.json [out.png]

A row has one colour in every panel (the same label, the same colour; plain loops are grey);
a target is a black dotted or dashed line labelled "target ..." in every panel that has one.
A section without its own plot(ax, data), or without data, gets no panel: the title names it
(its figures are in bench.txt). Legends sit beside their panel, never over the data.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Distinct colours for rows, in order of first appearance; plain loops and targets are set apart.
PALETTE = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
           "tab:olive", "tab:cyan", "navy", "darkgoldenrod", "teal", "crimson", "slateblue", "sienna",
           "darkseagreen", "orchid", "steelblue", "chocolate", "darkkhaki"]


class Colours:
    """label -> colour, the same in every panel of the figure."""

    def __init__(self):
        self._of = {}

    def __call__(self, label):
        low = label.lower()
        if low.startswith(("target", "bound")):
            return "black"
        if "plain" in low and not low.startswith("prefetch"):
            return "grey"
        if label not in self._of:
            taken = len([c for c in self._of.values() if c in PALETTE])
            self._of[label] = PALETTE[taken % len(PALETTE)]
        return self._of[label]

    def recolour(self, ax):
        """Give every labelled artist of a panel its row's colour."""
        from matplotlib.container import BarContainer, ErrorbarContainer
        for c in ax.containers:
            label = c.get_label()
            if not label or label.startswith("_"):
                continue
            colour = self(label)
            if isinstance(c, ErrorbarContainer):
                line, caps, bars = c.lines
                for a in [line, *caps, *bars]:
                    if a is not None:
                        a.set_color(colour)
            elif isinstance(c, BarContainer):
                for p in c.patches:
                    p.set_facecolor(colour)
        for line in ax.lines:
            label = line.get_label()
            if label and not label.startswith("_"):
                line.set_color(self(label))


def _order(res):
    """Sections that ran, the one whose headline leads the report first, then in run order."""
    secs = [s for s in res.get("ran", res["sections"]) if s in res["sections"]]
    lead = next((s for s in secs if res["sections"][s].get("headline")), None)
    return ([lead] if lead else []) + [s for s in secs if s != lead]


def panels(res):
    """(sections drawn, as (name, module, its results), in order; titles of those left out:
    no plot of their own, or no data)."""
    drawn, left = [], []
    for s in _order(res):
        mod, sec = importlib.import_module(f"bench_{s}"), res["sections"][s]
        if hasattr(mod, "plot") and sec["data"]:
            drawn.append((s, mod, sec))
        else:
            left.append(sec["title"])
    return drawn, left


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    secs, left = panels(res)
    if not secs:
        return
    fig, axes = plt.subplots(len(secs), 1, figsize=(13, 4.2 * len(secs)), layout="constrained", squeeze=False)
    env = res["env"]
    fig.suptitle(textwrap.fill(res.get("headline", ""), 150) + f"\nprefetch benchmark ({'quick' if res['quick'] else 'full'} run, "
                 f"{env['time_utc']}): {env['cpu']}, {env['cores']} cores, Python {env['python']}, "
                 f"numpy {env['numpy']}" + (f", mxnet {env['mxnet']}" if env.get("mxnet") else "")
                 + ("\n" + textwrap.fill(f"No panel (figures in bench.txt): {'; '.join(left)}", 150) if left else ""),
                 fontsize=10)
    colours = Colours()
    for ax, (_, mod, sec) in zip(axes[:, 0], secs):
        mod.plot(ax, sec["data"])
        colours.recolour(ax)
        ax.grid(True, which="major", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.savefig(path, dpi=80, format="png")
    plt.close(fig)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        data = json.load(f)
    plot(data, sys.argv[2] if len(sys.argv) > 2 else sys.argv[1].rsplit(".", 1)[0] + ".png")
