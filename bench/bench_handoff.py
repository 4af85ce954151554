"""Hand-off cost per tiny batch, by depth.

Every row consumes the same N tiny batches (a 4x8 float32 and a 4-element int64
array, as a data loader hands out) from the same generator. "Extra cost" is the
row's time per batch minus the plain loop's, in the same repetition, so the
source's own cost cancels. Construction and thread start are timed (amortised
over N); close() is not.
"""
from __future__ import annotations

import _baselines as B
import _stats as S
import _util as U
import numpy as np

TITLE = "Hand-off cost per tiny batch"
MX_ROWS = True   # mx.io.PrefetchingIter and prefetch.mx.PrefetchingIter rows (run.py)

PLAIN = "plain loop (no prefetching)"
QUEUE = "queue.Queue thread, no copy (unsafe)"
QUEUE_COPY = "queue.Queue thread + np.copy"
BG = "prefetch_generator.BackgroundGenerator"
OURS = "prefetch.Prefetcher"
MX_PLAIN = "MXNet: plain DataIter loop"
MX_PF = "mx.io.PrefetchingIter (its depth is 1)"
MX_OURS = "prefetch.mx.PrefetchingIter"
TARGET_DEPTH = 4


def add_arguments(g):
    g.add_argument("--depths", type=U.int_list, help="hand-off depths, e.g. 1,4,16 (4 is always measured)")


def config(a):
    depths = a.depths or ([1, 4, 16] if a.quick else [1, 2, 4, 16, 64])
    if TARGET_DEPTH not in depths:
        depths = sorted(depths + [TARGET_DEPTH])
    return {"depths": depths, "reps": a.reps or (9 if a.quick else 15),
            "target_s": 0.03 if a.quick else 0.15,  # per measurement; sets N per row
            "n_min": 200, "n_max": 100000, "no_mx": a.no_mx}


def _tiny():
    return (np.arange(32, dtype=np.float32).reshape(4, 8), np.arange(4, dtype=np.int64))


def _gen(batch, n):
    for _ in range(n):
        yield batch


def _rows(cfg):
    """[(name, baseline name, factory(n, depth) -> iterator, takes a depth)], {skipped row: why}."""
    import prefetch
    b = _tiny()
    rows = [(PLAIN, None, lambda n, d: _gen(b, n), False),
            (QUEUE, PLAIN, lambda n, d: B.QueuePrefetcher(_gen(b, n), d, copy=False), True),
            (QUEUE_COPY, PLAIN, lambda n, d: B.QueuePrefetcher(_gen(b, n), d, copy=True), True),
            (OURS, PLAIN, lambda n, d: prefetch.Prefetcher(_gen(b, n), depth=d), True)]
    skipped = {}
    bg, why = B.load_bg()
    if bg is not None:
        rows.insert(3, (BG, PLAIN, lambda n, d: bg(_gen(b, n), max_prefetch=d), True))
    else:
        skipped[BG] = why
    mx, why = B.load_mx() if not cfg["no_mx"] else (None, "left out (--no-mx)")
    if mx is not None:
        import prefetch.mx as pmx

        def src(n):
            return B.mx_source_iter(mx, n, [b[0]], b[1])
        rows += [(MX_PLAIN, None, lambda n, d: iter(src(n)), False),
                 (MX_PF, MX_PLAIN, lambda n, d: mx.io.PrefetchingIter(src(n)), False),
                 (MX_OURS, MX_PLAIN, lambda n, d: pmx.PrefetchingIter(src(n), depth=d), True)]
    else:
        skipped["MXNet rows"] = why
    return rows, skipped


def _per_batch_us(make, n, depth):
    with U.no_gc():
        t0 = U.ns()
        it = make(n, depth)
        cnt = 0
        for _b in it:
            cnt += 1
        t = U.ns() - t0
    B.close_quietly(it)
    if cnt != n:
        raise RuntimeError(f"expected {n} batches, got {cnt}")
    return t / n / 1e3


TARGETS = ((OURS, QUEUE_COPY, 0.2, "extra cost per tiny batch <= 1/5 of a queue.Queue thread + np.copy"),
           (OURS, MX_PF, 1 / 30, "extra cost per tiny batch <= 1/30 of mx.io.PrefetchingIter"),
           (MX_OURS, MX_PF, 1.0, "prefetch.mx.PrefetchingIter costs no more per batch than mx.io.PrefetchingIter"))


def _extra(rows, per_us, depths):
    """Each row's µs per batch minus its plain loop's, per repetition, by depth."""
    base = {name: b for name, b, *_ in rows}
    return {name: {d: [x - y for x, y in zip(per_us[name][d], per_us[b][d])] for d in depths}
            for name, b in base.items() if b}


def _ratios(extra, depths):
    """(ours, other) -> {depth: Interval of per-repetition extra-cost ratios}."""
    ratio = {}
    for ours, others in ((OURS, (QUEUE_COPY, QUEUE, BG, MX_PF)), (MX_OURS, (MX_PF,))):
        for other in others:
            if ours in extra and other in extra:
                ratio[(ours, other)] = {d: S.interval(S.ratios(extra[ours][d], extra[other][d]))
                                        for d in depths if extra[ours][d]}
    return ratio


def _verdicts(ratio, skipped):
    verdicts = []
    for ours, other, goal, text in TARGETS:
        iv = ratio.get((ours, other), {}).get(TARGET_DEPTH)
        if iv is None:
            verdicts.append(S.Verdict(text, "n/a", S.NOT_RUN, skipped.get("MXNet rows", "")))
            continue
        verdicts.append(S.Verdict(text, f"ratio {iv.text(3)} at depth {TARGET_DEPTH}",
                                  S.judge(iv, goal, higher_is_better=False)))
    return verdicts


def run(cfg, say):
    rows, skipped = _rows(cfg)
    depths = cfg["depths"]
    n = {}
    for name, _, make, _ in rows:  # pilot: N per row so that one measurement takes about target_s
        per = _per_batch_us(make, 300, TARGET_DEPTH)
        n[name] = max(cfg["n_min"], min(cfg["n_max"], int(cfg["target_s"] * 1e6 / max(per, 1e-3))))
    # per_us[row][depth] = [one value per repetition]; rows without a depth are measured at depths[0]
    per_us = {name: {d: [] for d in depths} for name, *_ in rows}

    def by_depth_view():   # rows without a depth stand for every depth
        return {name: {d: per_us[name][d if by_depth else depths[0]] for d in depths}
                for name, _, _, by_depth in rows}

    def unresolved():
        return S.open_verdicts(_verdicts(_ratios(_extra(rows, by_depth_view(), depths), depths), skipped))

    for rep in S.repetitions(cfg, unresolved, say):
        # Extra repetitions only decide the targets: they measure the target depth alone.
        for d in (U.rotate(depths, rep) if rep < cfg["reps"] else [TARGET_DEPTH]):
            for name, _, make, by_depth in U.rotate(rows, rep):
                if by_depth or d == depths[0] or (rep >= cfg["reps"] and d == TARGET_DEPTH):
                    per_us[name][d if by_depth else depths[0]].append(_per_batch_us(make, n[name], d))
    per_us = by_depth_view()
    extra = _extra(rows, per_us, depths)
    ratio = _ratios(extra, depths)
    verdicts = _verdicts(ratio, skipped)
    head = ratio[(OURS, QUEUE_COPY)][TARGET_DEPTH]
    headline = S.Headline(OURS, "a queue.Queue thread + np.copy",
                          f"per tiny batch handed over (extra cost over a plain loop, depth {TARGET_DEPTH})",
                          head, better="cheaper", worse="dearer", where=f"per tiny batch, depth {TARGET_DEPTH}")

    hdr = ["row, extra µs per batch over its plain loop"] + [f"depth {d}" for d in depths]
    tab = []
    for name, b, _, by_depth in rows:
        if b is None:
            tab.append([f"{name}: µs per batch"] + [S.interval(per_us[name][d]).text(2) for d in depths])
        else:
            tab.append([name] + [S.interval(extra[name][d]).text(2) if (by_depth or d == depths[0]) else "(same)"
                                 for d in depths])
    lines = U.table_lines(hdr, tab)
    lines += ["", "  ratio of extra cost per batch (below 1: prefetch is cheaper)"]
    lines += U.table_lines(["ours / other"] + [f"depth {d}" for d in depths],
                           [[f"{a} / {b}"] + [iv[d].text(3) for d in depths] for (a, b), iv in ratio.items()])
    lines += [f"  (not measured: {k}: {why})" for k, why in skipped.items()]
    data = {"depths": depths, "n_per_row": n, "per_batch_us": per_us, "extra_us": extra, "skipped": skipped}
    return {"tables": lines, "verdicts": verdicts, "data": data, "headline": headline}


def plot(ax, data):
    depths = data["depths"]
    for name, by_d in data["extra_us"].items():
        ivs = [S.interval(by_d[str(d)]) for d in depths]  # JSON keys
        med = [max(iv.median, 1e-3) for iv in ivs]
        ours = name.startswith("prefetch.")
        ax.errorbar(depths, med, yerr=np.array([iv.errbar() for iv in ivs]).T,
                    fmt="-o" if ours else "--s", lw=2.2 if ours else 1.2, capsize=3, label=name)
    if QUEUE_COPY in data["extra_us"]:
        goal = [0.2 * max(S.interval(data["extra_us"][QUEUE_COPY][str(d)]).median, 5e-3) for d in depths]
        ax.plot(depths, goal, "k:", lw=1, label=f"target for {OURS}: 1/5 of {QUEUE_COPY}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.set_xlabel("depth (batches ready ahead)")
    ax.set_ylabel("extra µs per batch over a plain loop")
    ax.set_title("Hand-off cost per tiny batch, lower is better\n(median, bars: 95% interval)")
