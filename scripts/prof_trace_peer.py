#!/usr/bin/env python3
"""Checks a trace nabla wrote against Perfetto's own trace processor.

Loads TRACE (Chrome trace-event JSON from nb_prof_stop, `nabla profile` or
`profile.steps`) with PyPI's `perfetto` TraceProcessor and compares what it
reads with the summary nabla wrote beside it (TRACE with .json replaced by
.summary.json): per slice name, the number of slices and their total
duration; the number of threads with slices and their names; and that every
slice Perfetto places at depth > 0 has a parent on the same track.

  python3 scripts/prof_trace_peer.py TRACE [--bin trace_processor_shell] [--out result.json]

The trace processor is a native binary (trace_processor_shell) that the
`perfetto` package downloads on first use; where that cannot be fetched, pass
it with --bin (or $PERFETTO_TRACE_PROCESSOR). Exit 0: all agree; 1: a
mismatch (listed); 77: no trace processor could be started (nothing checked).
Durations may differ by at most 1 ns per slice: Perfetto reads the JSON's
microseconds as doubles; nabla writes them with 3 exact decimals.
Set up: python3 -m venv --system-site-packages VENV; VENV/bin/pip install perfetto==0.59.1
"""
import argparse
import json
import os
import sys


def summary_path(trace):
    return trace[:-5] + ".summary.json" if trace.endswith(".json") else trace + ".summary.json"


def open_processor(trace, binary):
    try:
        from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    except ImportError as e:
        return None, f"the perfetto package is not installed ({e})"
    try:
        cfg = TraceProcessorConfig(bin_path=binary) if binary else TraceProcessorConfig()
        return TraceProcessor(trace=trace, config=cfg), None
    except Exception as e:  # the download of trace_processor_shell, or starting it
        return None, f"cannot start Perfetto's trace processor: {type(e).__name__}: {e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--bin", default=os.environ.get("PERFETTO_TRACE_PROCESSOR"))
    ap.add_argument("--out", help="write the comparison here as JSON")
    a = ap.parse_args()
    with open(summary_path(a.trace)) as f:
        ours = json.load(f)
    tp, why = open_processor(a.trace, a.bin)
    if tp is None:
        print(f"SKIPPED: {why}")
        return 77
    import perfetto
    rows = tp.query("select name, count(*) as n, sum(dur) as total from slice group by name").as_pandas_dataframe()
    theirs = {r["name"]: (int(r["n"]), int(r["total"])) for _, r in rows.iterrows()}
    threads = tp.query(
        "select distinct thread.tid as tid, thread.name as name from slice "
        "join thread_track on slice.track_id = thread_track.id join thread using (utid)").as_pandas_dataframe()
    orphans = tp.query(
        "select count(*) as n from slice s where s.depth > 0 and not exists "
        "(select 1 from slice p where p.id = s.parent_id and p.track_id = s.track_id)").as_pandas_dataframe()
    tp.close()

    problems, compared = [], {}
    for name, s in ours["slices"].items():
        n, total = theirs.get(name, (0, 0))
        compared[name] = {"nabla": [s["count"], s["total_ns"]], "perfetto": [n, total]}
        if n != s["count"]:
            problems.append(f"'{name}': nabla recorded {s['count']} slices, Perfetto reads {n}")
        elif abs(total - s["total_ns"]) > n:
            problems.append(f"'{name}': nabla's total {s['total_ns']} ns, Perfetto's {total} ns")
    for name in theirs.keys() - ours["slices"].keys():
        problems.append(f"'{name}': Perfetto reads {theirs[name][0]} slices nabla did not record")
    if len(threads) != ours["threads"]:
        problems.append(f"threads with slices: nabla {ours['threads']}, Perfetto {len(threads)}")
    unnamed = [int(t) for t, nm in zip(threads["tid"], threads["name"]) if not nm]
    if unnamed:
        problems.append(f"threads without a name in Perfetto: {unnamed}")
    if int(orphans["n"][0]):
        problems.append(f"{int(orphans['n'][0])} slices at depth > 0 without a parent on their track")
    result = {
        "trace": os.path.basename(a.trace),
        "perfetto": getattr(perfetto, "__version__", "?"),
        "events": ours["events"],
        "names": len(ours["slices"]),
        "threads": sorted(str(n) for n in threads["name"]),
        "problems": problems,
        "slices": compared,
    }
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
    for p in problems:
        print("MISMATCH:", p)
    print(f"{'OK' if not problems else 'FAILED'}: {ours['events']} slices under {len(ours['slices'])} names on "
          f"{len(threads)} threads compared with Perfetto's trace processor")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
