#!/usr/bin/env python3
"""Per-rank figures of profiled steps (Chrome traces from train/profiler): the step graph's span
(first node start to last node end, all micro-batches), the time in collectives and their count.
Usage: trace_stats.py TRACE.json [...]; prints one line per trace and the mean span."""
import json
import sys


def stats(path):
    with open(path) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    start = min(e["ts"] for e in ev)
    end = max(e["ts"] + e["dur"] for e in ev)
    comm = [e for e in ev if e.get("tid", 0) != 0]
    return (end - start) / 1e3, sum(e["dur"] for e in comm) / 1e3, len(comm)


def main():
    spans = []
    for p in sys.argv[1:]:
        span, comm_ms, n = stats(p)
        spans.append(span)
        print(f"{p}: step graph {span:.1f} ms, collectives {n} taking {comm_ms:.1f} ms")
    if spans:
        print(f"mean span {sum(spans) / len(spans):.1f} ms over {len(spans)} rank(s)")


if __name__ == "__main__":
    main()
