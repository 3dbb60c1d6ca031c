#!/usr/bin/env python3
"""The medians table of a tools/gpu_ab.sh run: one row a setting, one column a configuration
(D<batch>@<context> for decode steps, V<tokens>@<context> for verify blocks), each cell the median
ms over the rounds, then the same less the first setting's, and V8/V1 where both were run.

usage: tools/ab_table.py SUMMARY   (gpu_ab.sh's $OUT/ab/summary.txt; rows as
       "NAME rR: decode|verify  BATCH  TOKENS  CONTEXT  MS ...")
"""
import re
import statistics
import sys
from collections import defaultdict

ROW = re.compile(r"(\S+) r\d+: (decode|verify)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)")


def main(path):
    runs = defaultdict(list)  # (setting, configuration) -> ms of each round
    settings, configs = [], []
    for line in open(path):
        m = ROW.match(line)
        if not m:
            continue
        name, kind, batch, tokens, context, ms = m.groups()
        ctx = f"{int(context) // 1024}k" if int(context) >= 1024 else context
        cfg = f"D{batch}@{ctx}" if kind == "decode" else f"V{tokens}@{ctx}"
        runs[(name, cfg)].append(float(ms))
        if name not in settings:
            settings.append(name)
        if cfg not in configs:
            configs.append(cfg)
    if not settings:
        sys.exit(f"ab_table: no decode or verify rows in {path}")
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratio = "V8@4k" in configs and "V1@4k" in configs
    print("medians, ms (rounds: " + str(max(len(v) for v in runs.values())) + ")")
    print(f"{'setting':10}" + "".join(f"{c:>9}" for c in configs) + ("    V8/V1" if ratio else ""))
    base = settings[0]
    for s in settings:
        cells = "".join(f"{med[(s, c)]:9.3f}" if (s, c) in med else f"{'-':>9}" for c in configs)
        both = ratio and (s, "V8@4k") in med and (s, "V1@4k") in med
        r = f"{med[(s, 'V8@4k')] / med[(s, 'V1@4k')]:9.3f}" if both else ""
        print(f"{s:10}{cells}{r}")
    print(f"less {base}'s")
    for s in settings[1:]:
        cells = "".join(f"{med[(s, c)] - med[(base, c)]:+9.3f}" if (s, c) in med and (base, c) in med
                        else f"{'-':>9}" for c in configs)
        print(f"{s:10}{cells}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
