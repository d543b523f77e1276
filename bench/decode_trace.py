#!/usr/bin/env python3
"""Where a decode step's time goes, from a trace of `nabla generate`.

Reads the Chrome trace JSON that `nabla generate ... --profile-steps A-B
--profile-out FILE` writes and prints, per engine step (median over the
traced steps): the main thread's top-level ops summed by kind (products by
output shape, custom calls, fused kernels, slices, ...) and the gaps between
them; then, for each product and custom call shape, its median duration and
how long after the call started a pool worker began its share ("worker
joins": a worker that slept between regions joins late).

  nabla generate --hf DIR --prompt "Once upon a time there was a" --temperature 0 \\
      --max-tokens 128 --threads 2 --max-seq-len 256 --profile-steps 30-90 --profile-out /tmp/t.json
  python3 bench/decode_trace.py /tmp/t.json
"""
import bisect
import collections
import json
import statistics
import sys


def main(path):
    with open(path) as f:
        d = json.load(f)
    events = d["traceEvents"] if isinstance(d, dict) else d
    xs = sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"])
    steps = [e for e in xs if e["name"] == "engine step"]
    if not steps:
        sys.exit(f"{path}: no 'engine step' spans (was --profile-steps given?)")
    main_tid = steps[0]["tid"]
    ops = [e for e in xs if e["tid"] == main_tid and e["name"] != "engine step"]
    starts = [e["ts"] for e in ops]

    def kind(e):
        words = e["name"].split()
        k = words[0]
        if k[0] == "k" and k[1:].isdigit():
            return "fused kernels"
        return f"{k} {words[1]}" if k in ("dot_general", "custom_call") and len(words) > 1 else k

    per_step = []
    for s in steps:
        t0, t1 = s["ts"], s["ts"] + s["dur"]
        top, end = [], -1.0
        for e in ops[bisect.bisect_left(starts, t0):bisect.bisect_left(starts, t1)]:
            if e["ts"] >= end and e["ts"] + e["dur"] <= t1:  # outermost spans only
                top.append(e)
                end = e["ts"] + e["dur"]
        row = collections.defaultdict(float)
        for e in top:
            row[kind(e)] += e["dur"]
        row["gaps between ops"] = s["dur"] - sum(e["dur"] for e in top)
        row["step"] = s["dur"]
        per_step.append(row)
    print(f"{len(steps)} steps; medians per step (us):")
    for k in sorted({k for r in per_step for k in r}):
        print(f"  {k:40s} {statistics.median(r.get(k, 0.0) for r in per_step):9.1f}")

    workers = [e for e in xs if e["tid"] != main_tid and e["name"] == "pool tasks"]
    wstarts = [e["ts"] for e in workers]
    durs, joins = collections.defaultdict(list), collections.defaultdict(list)
    for e in ops:
        if not e["name"].startswith(("dot_general", "custom_call")):
            continue
        k = kind(e)
        durs[k].append(e["dur"])
        i = bisect.bisect_left(wstarts, e["ts"])
        if i < len(workers) and workers[i]["ts"] < e["ts"] + e["dur"]:
            joins[k].append(workers[i]["ts"] - e["ts"])
    print("per call (us): median duration, median and p90 of the worker's join")
    for k in sorted(durs):
        j = sorted(joins[k])
        jt = f"{statistics.median(j):7.1f} {j[int(0.9 * (len(j) - 1))]:7.1f}" if j else "      -       -"
        print(f"  {k:40s} {statistics.median(durs[k]):9.1f} {jt}  ({len(durs[k])} calls)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
