"""Soak run: a long prefetch stream, logging RSS, fill and wait times,
to show that memory stays flat. Not part of CI; an hour is the default.

The source mimics a real loader: it refills one buffer in place (the §3 rule 3
pattern) with batch sizes drawn from a few shapes, sometimes hands out strided
views and nested dicts, and raises nothing. The consumer keeps a few batches
alive for a while (as a training step's prefetch-to-device queue does) and
spends a simulated step of GIL-free work (a numpy reduction, plus --step-ms of
idle time) per batch. One prefetcher, one stream, for the whole run.

Every --interval seconds one JSON line goes to stdout (and to --out when
given): elapsed_s, batches, rss_mib, fill, peak_fill, consumer_wait_s,
producer_wait_s, blocks_allocated, blocks_reused. At the end a summary: RSS
after the warm-up vs at the end (drift), the maximum, and the blocks allocated
after the warm-up (0 in a steady state).

    python bench/soak.py                 # 60 minutes
    python bench/soak.py --minutes 5 --interval 10 --out build/soak.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import numpy as np

from prefetch import Prefetcher


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Loader:
    """An endless source: one buffer per shape, refilled in place for each batch."""

    def __init__(self, seed, mib):
        self.rng = random.Random(seed)
        side = int((mib * 2**20 / 4) ** 0.5)
        self.shapes = [(side, side), (side // 2, side), (side // 4, side), (64, 128)]
        self.bufs = [np.zeros(s, np.float32) for s in self.shapes]
        self.label = np.zeros(self.shapes[0][0], np.int64)

    def __iter__(self):
        i = 0
        while True:
            k = self.rng.randrange(len(self.bufs))
            buf = self.bufs[k]
            buf[0, 0] = i                       # a cheap in-place refill marker
            self.label[:4] = i
            data = buf if self.rng.random() < 0.8 else buf[:, ::2]
            yield {"data": data, "label": self.label[::2], "i": i}
            i += 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=30.0, help="seconds between log lines")
    ap.add_argument("--mib", type=float, default=8.0, help="largest batch, MiB")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-bytes", type=int, default=None)
    ap.add_argument("--hold", type=int, default=3, help="batches the consumer keeps alive")
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="idle time per batch, as a GPU step would leave the host (0: as fast as possible)")
    ap.add_argument("--warmup", type=float, default=0.1, help="fraction of the run before the baseline")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="also write the JSON lines here")
    args = ap.parse_args(argv)

    out = open(args.out, "w") if args.out else None
    end = time.monotonic() + args.minutes * 60
    warm_until = time.monotonic() + args.minutes * 60 * args.warmup
    start = time.monotonic()
    rows, held, n, expect = [], [], 0, 0
    base = None

    def log():
        s = p.stats()
        row = dict(elapsed_s=round(time.monotonic() - start, 1), batches=n, rss_mib=round(rss_mib(), 1),
                   fill=s.fill, peak_fill=s.peak_fill, consumer_wait_s=round(s.consumer_wait_s, 3),
                   producer_wait_s=round(s.producer_wait_s, 3), blocks_allocated=s.blocks_allocated,
                   blocks_reused=s.blocks_reused)
        rows.append(row)
        line = json.dumps(row)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()
        return row

    with Prefetcher(Loader(args.seed, args.mib), depth=args.depth, workers=args.workers,
                    max_bytes=args.max_bytes, name="soak") as p:
        next_log = time.monotonic()
        for batch in p:
            if batch["i"] != expect or batch["data"][0, 0] != expect:
                sys.exit(f"soak: batch {expect} came out wrong: {batch['i']}, {batch['data'][0, 0]}")
            expect += 1
            batch["data"].sum()                 # the simulated step (numpy drops the GIL)
            if args.step_ms:
                time.sleep(args.step_ms / 1e3)
            held.append(batch)
            if len(held) > args.hold:
                held.pop(0)
            n += 1
            now = time.monotonic()
            if now >= next_log:
                row = log()
                if base is None and now >= warm_until:
                    base = row
                next_log = now + args.interval
            if now >= end:
                break
        last = log()
    if base is None:
        base = rows[0]
    tail = [r for r in rows if r["elapsed_s"] >= base["elapsed_s"]]
    summary = dict(
        minutes=args.minutes, batches=n, batches_per_s=round(n / max(last["elapsed_s"], 1e-9), 1),
        rss_after_warmup_mib=base["rss_mib"], rss_end_mib=last["rss_mib"],
        rss_drift_mib=round(last["rss_mib"] - base["rss_mib"], 1),
        rss_max_after_warmup_mib=max(r["rss_mib"] for r in tail),
        blocks_allocated_after_warmup=last["blocks_allocated"] - base["blocks_allocated"],
        blocks_reused=last["blocks_reused"], peak_fill=last["peak_fill"], depth=args.depth,
        consumer_wait_s=last["consumer_wait_s"], producer_wait_s=last["producer_wait_s"],
    )
    print("summary " + json.dumps(summary), flush=True)
    if out:
        out.write("summary " + json.dumps(summary) + "\n")
        out.close()


if __name__ == "__main__":
    main()
