#!/usr/bin/env python3
"""PyTorch's torch._grouped_mm at bench_grouped_gemm's shapes, and the table of both.

grouped_mm_torch.py [--iters 50] [--warmup 5]
    times torch._grouped_mm (bf16, sm_90) on DeepSeek 16B's expert shapes: 64 experts, d_model
    2048, expert hidden 1408; 384, 768 and 1536 rows per expert and the skewed distribution
    bench_grouped_gemm uses (same formula); forward x·W1ᵀ, data gradient dy·W1 and weight gradient
    dyᵀ·x with the operand layouts PyTorch's own backward of _grouped_mm uses (offsets: cumulative
    int32 row ends). FLOP = Σ_e 2·rows_e·k·n; median of --iters after --warmup, CUDA events; each
    output checked against torch.mm (cuBLAS) per expert (worst relative L2 error).
grouped_mm_torch.py table MESHTRAIN.tsv TORCH.jsonl
    one table: meshtrain's rows (bench_grouped_gemm --tsv) beside torch._grouped_mm's.
"""
import argparse
import json
import math
import sys

EXPERTS, DIM, HIDDEN = 64, 2048, 1408
TARGETS = {384: 520.0, 1536: 620.0}  # issue 26, TFLOP/s, by rows per expert (uniform)


def distributions():
    """Rows per expert, as bench_grouped_gemm.cpp's distributions() (keep the two equal)."""
    total = 1536 * EXPERTS
    wsum = sum(math.exp(-e / 20.0) for e in range(EXPERTS))
    skew = [16 * int(math.floor((total // 16) * math.exp(-e / 20.0) / wsum + 0.5))
            for e in range(EXPERTS)]
    skew[0] = total - sum(skew[1:])
    return [("uniform 384", [384] * EXPERTS), ("uniform 768", [768] * EXPERTS),
            ("uniform 1536", [1536] * EXPERTS),
            ("skewed exp(-e/20)", skew)]


def measure(args):
    import torch

    dev = torch.device("cuda")
    torch.manual_seed(0)

    def timed(fn):
        for _ in range(args.warmup):
            fn()
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(args.iters)]
        for a, b in ev:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        ms = sorted(a.elapsed_time(b) for a, b in ev)
        return ms[len(ms) // 2]

    def rel_err(got, ref):
        d = (got.float() - ref.float()).norm()
        return float(d / ref.float().norm().clamp_min(1e-30))

    rows = []
    name = torch.cuda.get_device_name(0)
    for dist, counts in distributions():
        total = sum(counts)
        ends = torch.tensor(counts, device=dev).cumsum(0).to(torch.int32)
        starts = [0]
        for c in counts[:-1]:
            starts.append(starts[-1] + c)
        x = (torch.rand(total, DIM, device=dev) * 2 - 1).to(torch.bfloat16)
        dy = (torch.rand(total, HIDDEN, device=dev) * 2 - 1).to(torch.bfloat16)
        w1 = (torch.rand(EXPERTS, HIDDEN, DIM, device=dev) * 2 - 1).to(torch.bfloat16)
        flop = 2.0 * total * DIM * HIDDEN
        # The forward as torchtitan's experts (and bench/e2e/torch_baseline.py) call it; the
        # gradients as autograd's rules for _grouped_mm form them for that forward (mat2 given
        # column-major: dW1 = grouped_mm(dyᵀ, x) over K groups; dx = grouped_mm(dy, W1)).
        products = [
            ("fwd x·W1ᵀ (2048->1408)", lambda: torch._grouped_mm(x, w1.transpose(-2, -1), offs=ends),
             lambda e, s, c: x[s:s + c] @ w1[e].t(), lambda out, e, s, c: out[s:s + c]),
            ("dgrad dy·W1 (1408->2048)", lambda: torch._grouped_mm(dy, w1, offs=ends),
             lambda e, s, c: dy[s:s + c] @ w1[e], lambda out, e, s, c: out[s:s + c]),
            ("wgrad dyᵀ·x (Σ rows)", lambda: torch._grouped_mm(dy.t(), x, offs=ends),
             lambda e, s, c: dy[s:s + c].t() @ x[s:s + c], lambda out, e, s, c: out[e]),
        ]
        for prod, fn, ref, part in products:
            r = dict(system="torch._grouped_mm", device=name, torch=torch.__version__, dist=dist,
                     product=prod, flop=flop)
            out = None
            try:
                out = fn()
                torch.cuda.synchronize()
                r["rel_err"] = max(rel_err(part(out, e, s, c), ref(e, s, c))
                                   for e, (s, c) in enumerate(zip(starts, counts)))
                r["ms"] = timed(fn)
                r["tflops"] = flop / (r["ms"] * 1e-3) / 1e12
            except Exception as exc:  # report and go on: one failing product must not hide others
                r["error"] = f"{type(exc).__name__}: {exc}"
            print(json.dumps(r), flush=True)
            rows.append(r)
    return rows


def table(mt_path, torch_path):
    mt = {}
    with open(mt_path) as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            r = dict(zip(header, line.rstrip("\n").split("\t")))
            mt[(r["dist"], r["product"], r.get("path", "op"))] = r
    th = {}
    try:
        for line in open(torch_path):
            if line.strip():
                r = json.loads(line)
                th[(r["dist"], r["product"])] = r
    except OSError as exc:
        print(f"(no torch._grouped_mm rows: {exc})")
    dev = next((r.get("device") for r in th.values()), "?")
    print(f"grouped GEMMs, DeepSeek 16B experts ({EXPERTS} x {DIM} x {HIDDEN}), bf16, {dev}; "
          "TFLOP/s with FLOP = sum over experts of 2*rows*k*n; median after warm-up, CUDA events")
    print("targets (issue 26): >= 520 TFLOP/s at 384 rows per expert, >= 620 at 1536 "
          "(device-offset grouped GEMMs, each product)")
    print("meshtrain paths: the op on cuBLASLt (per expert over 4 streams), the op on meshtrain "
          "(the Hopper grouped GEMM), each sm90 tile variant alone; queued = launches back to back, "
          "waited = after a host wait (the forward's); rel err vs cuBLAS per expert (worst)")
    hdr = (f"{'rows per expert':<18} {'product':<26} {'meshtrain path':<30} {'target':>6} | {'mt queued':>9} "
           f"{'mt waited':>9} {'mt err':>8} | {'torch':>8} {'torch err':>9} | {'mt/torch':>8}")
    print(hdr)
    print("-" * len(hdr))
    for key, r in mt.items():
        dist, prod, path = key
        flop = float(r["flop"])
        q = flop / (float(r["queued_ms"]) * 1e-3) / 1e12
        waited = float(r["waited_ms"])
        wt = f"{flop / (waited * 1e-3) / 1e12:9.1f}" if waited > 0 else f"{'-':>9}"
        target = ""
        for rows_per, t in TARGETS.items():
            if dist == f"uniform {rows_per}":
                target = f"{t:.0f}"
        t = th.get((dist, prod), {})
        if "tflops" in t:
            tcol, terr, ratio = f"{t['tflops']:8.1f}", f"{t['rel_err']:9.1e}", f"{q / t['tflops']:7.2f}x"
        else:
            tcol, terr, ratio = f"{'-':>8}", f"{'-':>9}", f"{'-':>8}"
        print(f"{dist:<18} {prod:<26} {path:<30} {target:>6} | {q:9.1f} {wt} {float(r['rel_err']):8.1e} | "
              f"{tcol} {terr} | {ratio}")
        if "error" in t:
            print(f"    torch._grouped_mm: {t['error']}")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "table":
        if len(sys.argv) != 4:
            print(__doc__)
            sys.exit(2)
        table(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    rows = measure(args)
    sys.exit(1 if any("error" in r for r in rows) else 0)


if __name__ == "__main__":
    main()
