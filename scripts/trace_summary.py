#!/usr/bin/env python3
"""Summarises meshtrain's per-rank Chrome traces (train/profiler: one track per stream).

    scripts/trace_summary.py [--expect-tracks a,b,...] DIR_OR_FILES...
        (DIR: an iteration_<step> folder of rankR_trace.json)

For every rank and track (compute, and one per communication group): event count, busy time (the
union of its events), share of the step, the time a communication track overlaps compute, and
its most frequent ops. Standard library only. Exit status 1 when no trace is found, or when
--expect-tracks names a track that some rank's trace lacks (or holds no events).
"""
import collections
import glob
import json
import os
import sys


def union(intervals):
    """Sorted, merged [start, end) intervals."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(merged):
    return sum(e - s for s, e in merged)


def intersection(a, b):
    """Total length of the intersection of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def load(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names, rank = {}, None
    per_track = collections.defaultdict(list)
    for ev in events:
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[ev["tid"]] = ev["args"]["name"]
        elif ev.get("ph") == "X":
            rank = ev.get("pid", rank)
            per_track[ev["tid"]].append(ev)
    if isinstance(trace, dict):
        rank = trace.get("otherData", {}).get("rank", rank)
    return rank, names, per_track


def summarise(path, expect=()):
    """The summary text of one trace, and the expected tracks it lacks."""
    rank, names, per_track = load(path)
    present = {names.get(tid, f"stream {tid}") for tid in per_track}
    missing = [t for t in expect if t not in present]
    all_spans = [(ev["ts"], ev["ts"] + ev["dur"]) for evs in per_track.values() for ev in evs]
    if not all_spans:
        return f"rank {rank}: no events in {path}\n", list(expect)
    step_us = max(e for _, e in all_spans) - min(s for s, _ in all_spans)
    merged = {tid: union((ev["ts"], ev["ts"] + ev["dur"]) for ev in evs)
              for tid, evs in per_track.items()}
    compute_tid = next((t for t, n in names.items() if n == "compute"), 0)
    compute = merged.get(compute_tid, [])
    lines = [f"rank {rank}: {os.path.basename(path)}, step span {step_us / 1e3:.3f} ms, "
             f"{len(per_track)} tracks"]
    lines.append(f"  {'track':<14} {'events':>7} {'busy ms':>9} {'of step':>8} "
                 f"{'overlaps compute ms':>20}  ops")
    for tid in sorted(per_track):
        evs = per_track[tid]
        busy = length(merged[tid])
        name = names.get(tid, f"stream {tid}")
        overlap = "-" if tid == compute_tid else f"{intersection(merged[tid], compute) / 1e3:.3f}"
        ops = collections.Counter(ev["name"] for ev in evs).most_common(4)
        ops_text = ", ".join(f"{op} x{n}" for op, n in ops)
        lines.append(f"  {name:<14} {len(evs):>7} {busy / 1e3:>9.3f} "
                     f"{100 * busy / max(step_us, 1e-9):>7.1f}% {overlap:>20}  {ops_text}")
    if missing:
        lines.append(f"  MISSING tracks: {', '.join(missing)}")
    return "\n".join(lines) + "\n", missing


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    args, expect = argv[1:], []
    if args[0] == "--expect-tracks" and len(args) >= 2:
        expect = [t for t in args[1].split(",") if t]
        args = args[2:]
    files = []
    for a in args:
        files += sorted(glob.glob(os.path.join(a, "rank*_trace.json"))) if os.path.isdir(a) else [a]
    files.sort(key=lambda p: (len(p), p))  # rank2 before rank10
    if not files:
        print(f"trace_summary: no rank*_trace.json under {' '.join(args)}", file=sys.stderr)
        return 1
    lacking = 0
    for f in files:
        text, missing = summarise(f, expect)
        sys.stdout.write(text)
        lacking += bool(missing)
    if expect:
        print(f"tracks {','.join(expect)}: present on {len(files) - lacking} of {len(files)} ranks")
    return 1 if lacking else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
