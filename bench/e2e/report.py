#!/usr/bin/env python3
"""Side-by-side table for bench/e2e/run.sh and the per-op breakdown of a meshtrain trace.

report.py table RESULTS.jsonl          -- one row per system/flavor (JSON lines)
report.py breakdown TRACE.json [N]     -- time per op (and per stream) from a Chrome trace
report.py meshtrain FLAVOR DUMP_DIR [LOG [SYSTEM]] -- one JSON row from a run's metrics.jsonl: the median step
                                          (by step time) of the steps after the first two, which
                                          include warm-up; its tokens/s, TFLOP/s and MFU;
                                          with LOG (its train log), the memory plan's parts;
                                          SYSTEM names the row (default "meshtrain")
"""
import json
import re
import sys
from collections import defaultdict


def table(path):
    """All rows per flavor; the baseline is the fastest PyTorch variant of that flavor, and every
    row's tokens/s and peak memory are also given as ratios to it. Then the memory parts."""
    rows = [json.loads(l) for l in open(path) if l.strip()]
    flavors = list(dict.fromkeys(r.get("flavor", "?") for r in rows))
    hdr = (f"{'flavor':<16} {'system':<40} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} "
           f"{'peak GiB':>9} {'step ms':>8} {'x base':>7} {'mem x':>6}")
    print(hdr)
    print("-" * len(hdr))
    for flavor in flavors:
        mine = [r for r in rows if r.get("flavor", "?") == flavor]
        torch_ok = [r for r in mine if r["system"].startswith("pytorch") and "error" not in r]
        base = max(torch_ok, key=lambda r: r["tps"]) if torch_ok else None
        for r in mine:
            if "error" in r:
                print(f"{flavor:<16} {r['system']:<40} ERROR: {r['error']}")
                continue
            mark = " *" if r is base else ""
            ratio = f"{r['tps'] / base['tps']:>6.3f}x" if base else f"{'-':>7}"
            mem = f"{r['peak_gib'] / base['peak_gib']:>5.2f}x" if base else f"{'-':>6}"
            print(f"{flavor:<16} {r['system'] + mark:<40} {r['tps']:>10,.0f} {r['tflops']:>8.1f} "
                  f"{r['mfu']:>5.1f}% {r['peak_gib']:>9.1f} {1000 * r['step_s']:>8.1f} {ratio} {mem}")
        if base:
            print(f"{'':<16} baseline (*) = the fastest PyTorch variant: {base['system']}")
    print()
    print("peak memory parts, GiB (meshtrain: its step graph's memory plan as the train log prints "
          "it, rest = other state + inputs;")
    print("PyTorch: parameters incl. fp32 masters, gradients as backward leaves them, rest = peak "
          "- parameters - gradients - moments)")
    hdr = (f"{'flavor':<16} {'system':<40} {'peak':>6} {'params':>7} {'grads':>7} {'moments':>8} "
           f"{'activations':>12} {'rest':>6}")
    print(hdr)
    print("-" * len(hdr))
    fmt_ = lambda r, k: f"{r[k]:.1f}" if isinstance(r.get(k), (int, float)) else "-"
    for r in rows:
        if "error" in r:
            continue
        print(f"{r['flavor']:<16} {r['system']:<40} {r['peak_gib']:>6.1f} {fmt_(r, 'params_gib'):>7} "
              f"{fmt_(r, 'grads_gib'):>7} {fmt_(r, 'moments_gib'):>8} "
              f"{fmt_(r, 'activations_gib'):>12} {fmt_(r, 'rest_gib'):>6}")
        if r.get("master_grads_gib"):
            print(f"{'':<16} {'':<40} + {r['master_grads_gib']:.1f} GiB fp32 master gradients at "
                  "the optimizer step (the bf16 ones freed as they are cast)")
    if not any("activations_gib" in r for r in rows if r.get("system", "").startswith("meshtrain")):
        print("(meshtrain: no memory plan line found in its train log)")


PLAN_RE = re.compile(
    r"memory plan \(per rank\): parameters ([\d.]+) GiB(?: \+ compute copies ([\d.]+) GiB)?, "
    r"gradients ([\d.]+) GiB, other state "
    r"([\d.]+) GiB, activations ([\d.]+) GiB \(live peak [\d.]+ GiB\), inputs ([\d.]+) GiB; "
    r"total ([\d.]+) GiB; optimizer moments ([\d.]+) GiB")


def plan_parts(log_path):
    """meshtrain's memory plan from its train log (trainer.cpp's 'memory plan (per rank)' line),
    or {} when the log has none."""
    try:
        text = open(log_path, errors="replace").read()
    except OSError:
        return {}
    m = PLAN_RE.search(text)
    if not m:
        return {}
    # The compute copies (mixed precision's persistent bf16 weights) count as parameters, as
    # PyTorch's bf16 weights beside their fp32 masters do.
    params, copies, grads, other, acts, inputs, total, moments = (
        float(x) if x is not None else 0.0 for x in m.groups())
    return dict(params_gib=params + copies, grads_gib=grads, moments_gib=moments,
                activations_gib=acts,
                rest_gib=other + inputs, planned_gib=total + moments)


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


def meshtrain_row(flavor, dump, log=None, system="meshtrain"):
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
    print(json.dumps(dict(system=system, flavor=flavor, step=m.get("step"), tps=val("tps"),
                          tflops=val("tflops"), mfu=val("mfu"),
                          peak_gib=max(r["memory_gib"] for r in steps), step_s=val("step_time_s"),
                          loss=steps[-1]["loss"], **(plan_parts(log) if log else {}))))

if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "table":
        table(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "meshtrain":
        meshtrain_row(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None,
                      sys.argv[5] if len(sys.argv) > 5 else "meshtrain")
    elif len(sys.argv) >= 3 and sys.argv[1] == "breakdown":
        breakdown(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 25)
    else:
        print(__doc__)
        sys.exit(2)
