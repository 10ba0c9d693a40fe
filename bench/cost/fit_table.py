#!/usr/bin/env python3
"""Fits the cost model's kernel throughput table (src/meshtrain/train/cost_model.h) from profiled
runs: per op, FLOP/s of compute-heavy nodes and bytes/s of the others, from the flops/bytes the
profiler writes into each event of the compute track (tid 0). Collectives (other tracks) are left
to the link parameters. Usage: fit_table.py OUT.txt "SOURCE TEXT" TRACE.json [TRACE.json ...]"""
import json
import sys
from collections import defaultdict


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, source, traces = sys.argv[1], sys.argv[2], sys.argv[3:]
    flops = defaultdict(float)
    nbytes = defaultdict(float)
    secs_heavy = defaultdict(float)
    secs_light = defaultdict(float)
    for path in traces:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        for e in events:
            if e.get("ph") != "X" or e.get("tid") != 0:
                continue
            a = e["args"]
            dur = e["dur"] * 1e-6
            if a.get("flops", 0) > 0:
                flops[e["name"]] += a["flops"]
                secs_heavy[e["name"]] += dur
            elif a.get("bytes", 0) > 0:
                nbytes[e["name"]] += a["bytes"]
                secs_light[e["name"]] += dur
    if not flops or not nbytes:
        sys.exit("no flops/bytes in the traces: profile with a build whose profiler writes them")
    lines = [f"source {source}"]
    lines.append(f"default_flops {sum(flops.values()) / sum(secs_heavy.values()):.4g}")
    lines.append(f"default_bytes {sum(nbytes.values()) / sum(secs_light.values()):.4g}")
    for op in sorted(flops):
        if secs_heavy[op] > 0:
            lines.append(f"flops {op} {flops[op] / secs_heavy[op]:.4g}")
    for op in sorted(nbytes):
        if secs_light[op] > 0:
            lines.append(f"bytes {op} {nbytes[op] / secs_light[op]:.4g}")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
