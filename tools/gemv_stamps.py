#!/usr/bin/env python3
"""Summarises the TMA GEMV's block stamps (src/backend/cuda/gemv_stamps.cuh) of the last step in a
$DS_GEMV_STAMPS_OUT file, per kind of launch (N, K, splits), medians over its launches, in us:
  gap        from the previous GEMV launch's end (its last block's stamp 14) to this one's release
             (its first block past pdl_wait); the kernels between them are not stamped
  early      how long before the release its first block started (its weights' copies asked for)
  late_start when its last block started, from the release (negative: before it)
  rel_spread when its last block got past pdl_wait
  staged, first, loop_med, loop_max, end: from the release to the inputs staged (median block),
             warp 0's first stage done (median), the blocks' stages done (median, last) and the
             launch's last block done.
Needs numpy (the device machine has it). Usage:
  gemv_stamps.py FILE [--blocks I] [--trim OUT.npy]
--blocks I prints every block of launch I (the step's launches in release order); --trim saves the
step's records (u64 [n, 16]) for a look elsewhere."""
import sys
from collections import defaultdict

import numpy as np

F = 16  # u64 fields a record (kStampFields)


def load(path):
    raw = np.fromfile(path, dtype=np.uint64)
    n = int(raw[0])
    rec = raw[1:].reshape(-1, F)
    cap = rec.shape[0]
    if n <= cap:
        return rec[:n]
    first = n % cap
    return np.concatenate([rec[first:], rec[:first]])


def launches(rec):
    """Launches of the last step: per weight, the records after its last gap of > 200 us."""
    out = []
    by_w = defaultdict(list)
    for i, w in enumerate(rec[:, 0]):
        by_w[int(w)].append(i)
    for idx in by_w.values():
        idx = np.array(idx)
        t = rec[idx, 2].astype(np.int64)
        order = np.argsort(t)
        idx, t = idx[order], t[order]
        gaps = np.nonzero(np.diff(t) > 200_000)[0]
        start = gaps[-1] + 1 if len(gaps) else 0
        out.append(rec[idx[start:]])
    out.sort(key=lambda r: int(r[:, 3].min()))
    # The last step's launches: a weight last used 20 ms before the last release is an older step's.
    last = int(out[-1][:, 3].min())
    return [r for r in out if last - int(r[:, 3].min()) < 20_000_000]


def kind(r):
    nk = int(r[0, 15])
    N, K = nk & 0xFFFFFFFF, nk >> 32
    splits = int(r[0, 1]) >> 48
    return f"N{N} K{K} x{splits}"


def main():
    path = sys.argv[1]
    rec = load(path)
    ls = launches(rec)
    rows = defaultdict(list)
    prev_end = None
    per_launch = []
    for r in ls:
        t = r.astype(np.int64)
        rel = int(t[:, 3].min())
        loop_end = np.where(t[:, 6:14] > 0, t[:, 6:14], 0).max(axis=1)
        end = int(t[:, 14].max())
        staged = t[:, 4]
        first = t[:, 5][t[:, 5] > 0]
        d = dict(
            gap=(rel - prev_end) / 1e3 if prev_end else np.nan,
            early=(rel - int(t[:, 2].min())) / 1e3,
            late_start=(int(t[:, 2].max()) - rel) / 1e3,
            rel_spread=(int(t[:, 3].max()) - rel) / 1e3,
            staged=(np.median(staged) - rel) / 1e3,
            first=(np.median(first) - rel) / 1e3 if len(first) else np.nan,
            loop_med=(np.median(loop_end) - rel) / 1e3,
            loop_max=(loop_end.max() - rel) / 1e3,
            end=(end - rel) / 1e3,
            blocks=len(r),
        )
        rows[kind(r)].append(d)
        per_launch.append((kind(r), d, r))
        prev_end = end
    keys = ["gap", "early", "late_start", "rel_spread", "staged", "first", "loop_med", "loop_max", "end"]
    print(f"{len(ls)} GEMV launches in the last step; us, medians over the launches of a kind")
    print(f"{'kind':24s} {'n':>3s} {'blk':>4s} " + " ".join(f"{k:>10s}" for k in keys))
    for k, ds in sorted(rows.items(), key=lambda kv: -len(kv[1])):
        med = {key: np.nanmedian([d[key] for d in ds]) for key in keys}
        print(f"{k:24s} {len(ds):3d} {ds[0]['blocks']:4d} " + " ".join(f"{med[key]:10.2f}" for key in keys))
    if "--blocks" in sys.argv:
        # Every block of launch i (the step's launches in release order), by start time.
        i = int(sys.argv[sys.argv.index("--blocks") + 1])
        k, d, r = per_launch[i]
        t = r.astype(np.int64)
        rel = int(t[:, 3].min())
        print(f"\nlaunch {i}: {k}, {len(r)} blocks; us from the first release")
        order = np.argsort(t[:, 2])
        print(" bx by  sm   start    wait  staged   first  loop0..7 (max)    end")
        for j in order:
            x = t[j]
            bx, by, sm = int(x[1]) & 0xFFFF, (int(x[1]) >> 16) & 0xFFFF, (int(x[1]) >> 32) & 0xFFFF
            loops = [v for v in x[6:14] if v > 0]
            f = lambda v: (v - rel) / 1e3 if v > 0 else float("nan")
            print(f"{bx:3d} {by:2d} {sm:3d} {f(x[2]):7.2f} {f(x[3]):7.2f} {f(x[4]):7.2f} {f(x[5]):7.2f} "
                  f"{f(min(loops)) if loops else 0:7.2f}..{f(max(loops)) if loops else 0:7.2f} {f(x[14]):7.2f}")
    if "--trim" in sys.argv:
        np.save(sys.argv[sys.argv.index("--trim") + 1], np.concatenate([r for _, _, r in per_launch]))


if __name__ == "__main__":
    main()
