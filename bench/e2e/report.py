#!/usr/bin/env python3
"""Side-by-side table for bench/e2e/run.sh and the per-op breakdown of a meshtrain trace.

report.py table RESULTS.jsonl          -- one row per system/flavor (JSON lines)
report.py breakdown TRACE.json [N]     -- time per op (and per stream) from a Chrome trace
report.py meshtrain FLAVOR DUMP_DIR    -- one JSON row from a run's metrics.jsonl: the median step
                                          (by step time) of the steps after the first two, which
                                          include warm-up; its tokens/s, TFLOP/s and MFU
"""
import json
import sys
from collections import defaultdict


def table(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    hdr = f"{'flavor':<18} {'system':<18} {'tokens/s':>10} {'TFLOP/s':>9} {'MFU':>7} {'peak GiB':>9} {'step ms':>9}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if "error" in r:
            print(f"{r.get('flavor', '?'):<18} {r['system']:<18} ERROR: {r['error']}")
            continue
        print(f"{r['flavor']:<18} {r['system']:<18} {r['tps']:>10,.0f} {r['tflops']:>9.1f} "
              f"{r['mfu']:>6.1f}% {r['peak_gib']:>9.1f} {1000 * r['step_s']:>9.1f}")


def breakdown(path, top=25):
    trace = json.load(open(path))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    per_op = defaultdict(float)
    per_stream = defaultdict(float)
    count = defaultdict(int)
    for e in events:
        if e.get("ph") != "X":
            continue
        per_op[e["name"]] += e["dur"]
        count[e["name"]] += 1
        per_stream[names.get((e["pid"], e["tid"]), str(e["tid"]))] += e["dur"]
    total = sum(v for k, v in per_stream.items() if k == "compute") or sum(per_op.values())
    print(f"{'op':<28} {'calls':>6} {'ms':>9} {'% of compute':>13}")
    for op, us in sorted(per_op.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{op:<28} {count[op]:>6} {us / 1000:>9.2f} {100 * us / total:>12.1f}%")
    print("per stream (busy ms): " + ", ".join(f"{k} {v / 1000:.1f}" for k, v in sorted(per_stream.items())))


def meshtrain_row(flavor, dump):
    """The median step (by step time) of the steady steps; every rate comes from that one step,
    so tokens/s x step time is the step's token count (medians taken per column would mix
    steps)."""
    steps = [json.loads(l) for l in open(f"{dump}/metrics.jsonl") if l.strip()]
    steady = [r for r in steps if r["step"] > 2] or steps
    timed = sorted((r for r in steady if r.get("step_time_s") is not None),
                   key=lambda r: r["step_time_s"])
    m = timed[len(timed) // 2] if timed else {}
    nan = float("nan")
    def val(key):
        v = m.get(key)
        return nan if v is None else v
    print(json.dumps(dict(system="meshtrain", flavor=flavor, step=m.get("step"), tps=val("tps"),
                          tflops=val("tflops"), mfu=val("mfu"),
                          peak_gib=max(r["memory_gib"] for r in steps), step_s=val("step_time_s"),
                          loss=steps[-1]["loss"])))

if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "table":
        table(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "meshtrain":
        meshtrain_row(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == "breakdown":
        breakdown(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 25)
    else:
        print(__doc__)
        sys.exit(2)
