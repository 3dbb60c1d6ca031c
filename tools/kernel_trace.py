#!/usr/bin/env python3
"""Per-step table of a kernel trace (tools/kernel_trace.cpp's CSV).

The kernels of one stream end in stream order (each waits for the one before it), so a kernel's
share of a step is the time from the end of the kernel before it to its own end: what the step
would lose if it took no time. Steps start at an embedding kernel. The table gives, for each kind
of launch (name and grid), its launches a step, its share of the step (the median over the
steps after the first --skip), and the mean share and span (start to end) of one launch. With
--by-prev a kind of launch is also told apart by the kernel before it (name and grid), so that
launches of one kernel and grid for different weights (down_proj after gate_up, out_proj after the
GDN kernel, o_proj after the attention combine) get rows of their own.

usage: kernel_trace.py TRACE.csv [--skip N] [--top K] [--tokens T] [--by-prev] [--timeline FIRST COUNT]
"""
import argparse
import csv
import re
import statistics
import sys


def short(name):
    base = name.replace("(anonymous namespace)::", "")
    base = base[5:] if base.startswith("void ") else base
    depth = 0
    for i, c in enumerate(base):  # the argument list: the first '(' outside template brackets
        depth += (c == "<") - (c == ">")
        if c == "(" and depth == 0:
            base = base[:i]
            break
    base = re.sub(r"^(ds::cuda::)?(qgemv::)?", "", base).replace("ds::cuda::", "")
    return base.split("<")[0] + ("<" + base.split("<", 1)[1] if "<" in base and len(base) < 90 else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=3, help="steps left out at the start (warm-up)")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--tokens", type=int, help="only steps of this many tokens (the embedding's grid)")
    ap.add_argument("--by-prev", action="store_true", help="tell launches apart by the kernel before them too")
    ap.add_argument("--timeline", type=int, nargs=2, metavar=("FIRST", "COUNT"),
                    help="also list kernels FIRST.. of the middle step: start and end from its first start")
    a = ap.parse_args()
    rows = []
    with open(a.trace) as f:
        for r in csv.DictReader(f):
            rows.append((int(r["end"]), int(r["start"]), r["name"], r["grid_x"], r["grid_y"], r["grid_z"]))
    rows.sort()
    steps, cur = [], None
    for r in rows:
        if "embedding" in r[2]:
            cur = []
            if a.tokens is None or int(r[3]) == a.tokens:
                steps.append(cur)
        if cur is not None:
            cur.append(r)
    steps = steps[a.skip:-1] if len(steps) > a.skip + 1 else steps
    if not steps:
        sys.exit("kernel_trace.py: no steps (no embedding kernel) in " + a.trace)
    per_label = {}
    spans = []
    for st in steps:
        spans.append((st[-1][0] - st[0][1]) / 1e3)
        seen = {}
        prev_end = st[0][1]
        before = "the step's start"  # --by-prev: the kernel before (its name without template arguments, its grid)
        for end, start, name, gx, gy, gz in st:
            kernel, grid = short(name), f"[{gx}x{gy}x{gz}]"
            label = f"{kernel} {grid}" + (f" after {before}" if a.by_prev else "")
            before = f"{kernel.split('<')[0]} {grid}"
            d = per_label.setdefault(label, {"share": [], "n": [], "one": [], "span": []})
            s = seen.setdefault(label, [0.0, 0])
            s[0] += (end - prev_end) / 1e3
            s[1] += 1
            d["one"].append((end - prev_end) / 1e3)
            d["span"].append((end - start) / 1e3)
            prev_end = end
        for label, (share, n) in seen.items():
            per_label[label]["share"].append(share)
            per_label[label]["n"].append(n)
    print(f"{len(steps)} steps; step span median {statistics.median(spans):.1f} us "
          f"(min {min(spans):.1f}, max {max(spans):.1f}); {len(steps[0])} kernels a step")
    table = sorted(per_label.items(), key=lambda kv: -statistics.median(kv[1]["share"]))
    total = sum(statistics.median(d["share"]) for _, d in table)
    print(f"{'share us/step':>13} {'%':>5} {'n':>4} {'us/launch':>9} {'span us':>8}  launch")
    for label, d in table[: a.top]:
        sh = statistics.median(d["share"])
        print(f"{sh:13.1f} {100 * sh / total:5.1f} {statistics.median(d['n']):4.0f} "
              f"{statistics.mean(d['one']):9.2f} {statistics.mean(d['span']):8.2f}  {label}")
    print(f"{total:13.1f} total of the medians")
    if a.timeline:
        st = steps[len(steps) // 2]
        t0, first, count = st[0][1], a.timeline[0], a.timeline[1]
        print(f"{'start us':>9} {'end us':>9} {'share':>7}  kernel (middle step)")
        for i in range(first, min(len(st), first + count)):
            end, start, name, gx, gy, gz = st[i]
            prev = st[i - 1][0] if i else start
            print(f"{(start - t0) / 1e3:9.2f} {(end - t0) / 1e3:9.2f} {(end - prev) / 1e3:7.2f}  "
                  f"{short(name)} [{gx}x{gy}x{gz}]")


if __name__ == "__main__":
    main()
