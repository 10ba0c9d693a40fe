#!/usr/bin/env python3
"""Cross-check of meshtrain against the independent PyTorch references (llama3_ref.py,
deepseek_v3_ref.py), which load the HF folder meshtrain exported of the weights step 1 started
from. Plain torch, no transformers import.

  crosscheck.py tokens  --out FILE.bin --count N --vocab V [--seed S]
  crosscheck.py compare --run DUMP_FOLDER --tokens FILE.bin --case NAME --json OUT.json

`compare` reads what the meshtrain run left in its dump folder: config.toml (the effective
config), metrics.jsonl (loss, grad_norm, lr and expert loads per step; log_freq must be 1) and
debug/step-1/ ([debug] dump_step = 1): model/ (an HF folder), gradients.safetensors (the global
gradients of step 1 under HF names, before clipping), moe_load.json (tokens per expert of each
MoE layer in step 1) and dump.json (the windows step 1 read). It replays the same steps: step t
reads the rows_per_step consecutive windows of seq_len + 1 tokens starting at window
(t - 1) * rows_per_step (modulo the windows per epoch) — meshtrain's window order, whatever the
rank layout — with torch.optim.AdamW at the lr meshtrain logged for that step, global-norm
clipping and torchtitan's expert-bias update. It checks: step-1 loss within 1e-5 relative;
step-1 gradient norm and every parameter's gradient (||g_mt - g_ref|| / ||g_ref||) within 1e-4;
the routing of step 1 (tokens per expert of every layer) exactly, and each step's per-layer
load min/max; the loss of every step within 1e-4. Exit status 0 only if all pass.

With multi-token prediction (the folder's num_nextn_predict_layers = [model] mtp_layers = D > 0)
the reference's loss is the main cross entropy plus [model] mtp_loss_weight times the mean of the
D depth losses (deepseek_v3_ref.DeepSeekV3Ref.losses): metrics `loss` (the next-token loss),
`total_loss` (what is minimised, at the logged `mtp_loss_weight`, which must follow config.toml's
schedule) and each depth's `mtp_loss_k` are compared under the same tolerances, and the
gradients of the MTP modules are among the parameter gradients checked.
"""

import argparse
import array
import json
import math
import os
import struct
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deepseek_v3_ref import DeepSeekV3Ref  # noqa: E402
from llama3_ref import Llama3Ref  # noqa: E402
from safetensors_io import load_hf_folder, read_safetensors  # noqa: E402

TOL_LOSS, TOL_GRAD, TOL_TRACK = 1e-5, 1e-4, 1e-4
TOKEN_MAGIC, TOKEN_VERSION = 20240520, 1


# --- token files (llm.c format: 256 int32 header, then uint16 tokens) --------------------------
def write_tokens(path, count, vocab, seed):
    if vocab > 65536:
        raise ValueError(f"vocab {vocab} does not fit uint16 tokens")
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, vocab, (count,), generator=g, dtype=torch.int64)
    header = [0] * 256
    header[0], header[1], header[2] = TOKEN_MAGIC, TOKEN_VERSION, count
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(array.array("H", toks.tolist()).tobytes())


def read_tokens(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        if header[0] != TOKEN_MAGIC or header[1] != TOKEN_VERSION:
            raise ValueError(f"{path}: not an llm.c token file (magic {header[0]}, version {header[1]})")
        data = array.array("H")
        data.frombytes(f.read())
    if len(data) != header[2]:
        raise ValueError(f"{path}: header says {header[2]} tokens, file holds {len(data)}")
    return torch.tensor(data.tolist(), dtype=torch.int64)


# --- meshtrain's outputs ---------------------------------------------------------------------
def read_toml(path):
    try:
        import tomllib
        with open(path, "rb") as f:
            return tomllib.load(f)
    except ImportError:  # Python < 3.11: the flat key = value file meshtrain writes
        out, sec = {}, None
        for line in open(path):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                sec = out.setdefault(line.strip("[]"), {})
                continue
            k, v = (s.strip() for s in line.split("=", 1))
            if v.startswith('"'):
                v = json.loads(v)
            elif v in ("true", "false"):
                v = v == "true"
            else:
                v = float(v) if any(c in v for c in ".eE") else int(v)
            sec[k] = v
        return out


def read_metrics(path):
    rows = {}
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            rows[int(r["step"])] = r
    return rows


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def tensor_rel(mt, ref):
    mt, ref = mt.to(torch.float64), ref.to(torch.float64)
    denom = ref.norm().item()
    diff = (mt - ref).norm().item()
    if denom == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / denom


# --- the replay ------------------------------------------------------------------------------
def build_reference(folder, coeff, dtype, device):
    cfg, tensors = load_hf_folder(folder)
    arch = cfg.get("architectures", ["?"])
    if arch == ["LlamaForCausalLM"]:
        return Llama3Ref(cfg, tensors, dtype, device)
    if arch in (["DeepseekV3ForCausalLM"], ["DeepseekV2ForCausalLM"]):
        return DeepSeekV3Ref(cfg, tensors, dtype, device, coeff)
    raise ValueError(f"{folder}/config.json: architectures {arch} has no reference model")


def compare(args):
    run = args.run
    dump = os.path.join(run, "debug", "step-1")
    cfg = read_toml(os.path.join(run, "config.toml"))
    metrics = read_metrics(os.path.join(run, "metrics.jsonl"))
    with open(os.path.join(dump, "dump.json")) as f:
        info = json.load(f)
    steps = int(cfg["training"]["steps"])
    missing = [t for t in range(1, steps + 1) if t not in metrics]
    if missing:
        raise ValueError(f"metrics.jsonl lacks steps {missing[:5]}: run with --metrics.log_freq 1")
    seq = int(cfg["training"]["seq_len"])
    rows = int(info["rows_per_step"])
    if int(info["seq_len"]) != seq:
        raise ValueError(f"dump.json seq_len {info['seq_len']} differs from config.toml {seq}")
    tokens = read_tokens(args.tokens)
    windows = tokens.numel() // (seq + 1)
    if int(info["windows_per_epoch"]) != windows:
        raise ValueError(f"meshtrain counted {info['windows_per_epoch']} windows in its token file, "
                         f"{args.tokens} holds {windows}: not the same file?")

    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"float64": torch.float64, "float32": torch.float32}[args.dtype]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    coeff = float(cfg["model"].get("load_balance_coeff", 0.0))
    model = build_reference(os.path.join(dump, "model"), coeff, dtype, device)
    params = [p for _, p in model.named()]
    o = cfg["optimizer"]
    opt = torch.optim.AdamW(params, lr=float(o["lr"]), betas=(float(o["beta1"]), float(o["beta2"])),
                            eps=float(o["eps"]), weight_decay=float(o["weight_decay"]), foreach=False)
    max_norm = float(cfg["training"]["max_norm"])

    result = {"case": args.case, "device": str(device), "dtype": args.dtype, "failures": [], "steps": []}
    fail = result["failures"]

    def batch(step):
        idx = [((step - 1) * rows + i) % windows for i in range(rows)]
        w = torch.stack([tokens[j * (seq + 1): (j + 1) * (seq + 1)] for j in idx]).to(device)
        return w[:, :-1], w[:, 1:]

    if int(info["window_begin"]) != 0:
        raise ValueError(f"dump.json says step 1 starts at window {info['window_begin']}, expected 0")

    depths = getattr(model, "mtp", 0)  # MTP modules of the exported folder (num_nextn_predict_layers)
    check_mtp_config(cfg, depths)
    for step in range(1, steps + 1):
        inputs, labels = batch(step)
        model.margins = {}
        m = metrics[step]
        if depths:
            loss, main_loss, depth = model.losses(inputs, labels, mtp_weight_of(cfg, m))
        else:
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).to(dtype), labels.reshape(-1))
            main_loss, depth = loss, []
        opt.zero_grad(set_to_none=True)
        loss.backward()
        sq = sum(float(p.grad.to(torch.float64).pow(2).sum()) for p in params if p.grad is not None)
        norm = math.sqrt(sq)
        # metrics "loss" is the next-token loss; with MTP the minimised one is total_loss.
        rec = {"step": step, "loss_mt": m["loss"], "loss_ref": main_loss.item(),
               "loss_rel": rel(m["loss"], main_loss.item()),
               "grad_norm_mt": m["grad_norm"], "grad_norm_ref": norm, "grad_norm_rel": rel(m["grad_norm"], norm)}
        if step == 1:
            check_step1(model, rec, dump, fail)
        check_loads(model, m, rec, fail)
        tol = TOL_LOSS if step == 1 else TOL_TRACK
        if depths:
            check_mtp_losses(step, m, loss, depth, tol, rec, fail)
        if rec["loss_rel"] > tol:
            fail.append(f"step {step}: loss meshtrain {m['loss']:.9g} vs reference {main_loss.item():.9g}, "
                        f"relative {rec['loss_rel']:.3g} > {tol:g}")
        result["steps"].append(rec)
        if max_norm > 0:
            coef = min(max_norm / (norm + 1e-6), 1.0)
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
        for g in opt.param_groups:
            g["lr"] = float(m["lr"])
        opt.step()
        if isinstance(model, DeepSeekV3Ref):
            model.update_expert_bias()
    s = result["steps"]
    result["worst_loss_rel"] = max(r["loss_rel"] for r in s)
    result["worst_grad_norm_rel"] = max(r["grad_norm_rel"] for r in s)
    if depths:
        result["worst_mtp_loss_rel"] = max((d["rel"] for r in s for d in r.get("mtp", [])), default=None)
    result["pass"] = not fail
    return result


# --- multi-token prediction -------------------------------------------------------------------
def check_mtp_config(cfg, depths):
    """The exported folder's num_nextn_predict_layers is the run's [model] mtp_layers."""
    want = int(cfg["model"].get("mtp_layers", 0))
    if want != depths:
        raise ValueError(f"config.toml has [model] mtp_layers = {want}, the exported config.json "
                         f"num_nextn_predict_layers = {depths}")


def mtp_weight_of(cfg, m):
    """The weight of the mean MTP loss in step m's total: the one meshtrain logged for the step
    (metrics mtp_loss_weight), which must be [model] mtp_loss_weight's schedule at that step."""
    c = cfg["model"]
    after = int(c.get("mtp_loss_weight_after_step", 0))
    want = float(c["mtp_loss_weight_after"] if after > 0 and int(m["step"]) > after else c["mtp_loss_weight"])
    got = float(m.get("mtp_loss_weight", want))
    if got != want:
        raise ValueError(f"step {m['step']}: metrics mtp_loss_weight {got} is not config.toml's schedule ({want})")
    return want


def check_mtp_losses(step, m, total, depth, tol, rec, fail):
    """meshtrain's minimised loss (metrics total_loss) and per-depth losses (mtp_loss_k) against
    the reference's."""
    rec["mtp"] = []
    if "total_loss" not in m:
        fail.append(f"step {step}: metrics.jsonl has no total_loss")
    else:
        rec["total_loss_mt"], rec["total_loss_ref"] = float(m["total_loss"]), total.item()
        rec["total_loss_rel"] = rel(rec["total_loss_mt"], total.item())
        if rec["total_loss_rel"] > tol:
            fail.append(f"step {step}: total_loss meshtrain {rec['total_loss_mt']:.9g} vs reference "
                        f"{total.item():.9g}, relative {rec['total_loss_rel']:.3g} > {tol:g}")
    for k, lk in enumerate(depth, start=1):
        key = f"mtp_loss_{k}"
        if key not in m:
            fail.append(f"step {step}: metrics.jsonl has no {key}")
            continue
        r = {"k": k, "mt": float(m[key]), "ref": lk.item(), "rel": rel(float(m[key]), lk.item())}
        rec["mtp"].append(r)
        if r["rel"] > tol:
            fail.append(f"step {step}: {key} meshtrain {r['mt']:.9g} vs reference {r['ref']:.9g}, "
                        f"relative {r['rel']:.3g} > {tol:g}")
    extra = sorted(k for k in m if k.startswith("mtp_loss_") and k[9:].isdigit() and int(k[9:]) > len(depth))
    if extra:
        fail.append(f"step {step}: metrics.jsonl has {extra} beyond the folder's {len(depth)} MTP layers")


def check_step1(model, rec, dump, fail):
    if rec["grad_norm_rel"] > TOL_GRAD:
        fail.append(f"step 1: gradient norm meshtrain {rec['grad_norm_mt']:.9g} vs reference "
                    f"{rec['grad_norm_ref']:.9g}, relative {rec['grad_norm_rel']:.3g} > {TOL_GRAD:g}")
    grads = read_safetensors(os.path.join(dump, "gradients.safetensors"))
    names = dict(model.named())
    extra = sorted(set(grads) - set(names))
    lacking = sorted(set(names) - set(grads))
    if extra or lacking:
        fail.append(f"gradients.safetensors: names differ from the model's (extra {extra[:3]}, missing {lacking[:3]})")
    worst, worst_name, per = 0.0, None, {}
    for n, p in names.items():
        if n not in grads:
            continue
        ref = p.grad if p.grad is not None else torch.zeros_like(p)
        if list(grads[n].shape) != list(ref.shape):
            fail.append(f"gradient {n}: shape {list(grads[n].shape)} vs reference {list(ref.shape)}")
            continue
        r = tensor_rel(grads[n], ref.cpu())
        per[n] = r
        if r > worst:
            worst, worst_name = r, n
    rec["grad_worst_rel"], rec["grad_worst_name"] = worst, worst_name
    rec["grad_rel"] = per
    bad = [f"{n} ({r:.3g})" for n, r in sorted(per.items(), key=lambda kv: -kv[1]) if r > TOL_GRAD]
    if bad:
        fail.append(f"step 1: {len(bad)} parameter gradients beyond {TOL_GRAD:g} relative: {', '.join(bad[:5])}")
    layers = model.moe_layers()
    if not layers:
        return
    with open(os.path.join(dump, "moe_load.json")) as f:
        loads = json.load(f)
    rec["routing"] = {}
    for l in layers:
        key = f"layers.{l}.moe"
        ref = [int(x) for x in model.counts[l].tolist()] if l in model.counts else None
        mt = [int(x) for x in loads.get(key, [])]
        margin = model.margins.get(l, float("inf"))
        rec["routing"][key] = {"meshtrain": mt, "reference": ref, "min_choice_margin": margin}
        if mt != ref:
            fail.append(f"step 1 {key}: tokens per expert differ: meshtrain {mt} vs reference {ref} "
                        f"(smallest gap between the k-th and (k+1)-th choice score: {margin:.3g}; "
                        f"a gap near float32 rounding means a tie that either side may break)")


def check_loads(model, m, rec, fail):
    for l in model.moe_layers():
        c = model.counts.get(l)
        if c is None:
            continue
        for what, ref in (("load_max", float(c.max())), ("load_min", float(c.min()))):
            key = f"moe.layers.{l}.{what}"
            if key in m and float(m[key]) != ref:
                fail.append(f"step {rec['step']} layers.{l}: {what} meshtrain {m[key]:g} vs reference {ref:g} "
                            f"(routing differs; smallest choice gap {model.margins.get(l, float('inf')):.3g})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokens")
    t.add_argument("--out", required=True)
    t.add_argument("--count", type=int, required=True)
    t.add_argument("--vocab", type=int, required=True)
    t.add_argument("--seed", type=int, default=1234)
    c = sub.add_parser("compare")
    c.add_argument("--run", required=True)
    c.add_argument("--tokens", required=True)
    c.add_argument("--case", required=True)
    c.add_argument("--json", required=True)
    c.add_argument("--device", default="auto")
    c.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    a = ap.parse_args()
    if a.cmd == "tokens":
        write_tokens(a.out, a.count, a.vocab, a.seed)
        return 0
    try:
        result = compare(a)
    except Exception as e:  # noqa: BLE001 - any failure is reported as this case's FAIL
        result = {"case": a.case, "pass": False, "failures": [f"{type(e).__name__}: {e}"],
                  "traceback": traceback.format_exc()}
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1, default=float)
    if result["pass"]:
        s1 = result["steps"][0]
        print(f"PASS {a.case}: step-1 loss rel {s1['loss_rel']:.2g} (tol {TOL_LOSS:g}), grad norm rel "
              f"{s1['grad_norm_rel']:.2g}, worst parameter gradient {s1.get('grad_worst_name')} rel "
              f"{s1.get('grad_worst_rel', 0):.2g} (tol {TOL_GRAD:g}); {len(result['steps'])} steps, worst loss "
              f"rel {result['worst_loss_rel']:.2g} (tol {TOL_TRACK:g})"
              + (f", worst MTP depth loss rel {result['worst_mtp_loss_rel']:.2g}"
                 if result.get("worst_mtp_loss_rel") is not None else ""))
    else:
        print(f"FAIL {a.case}:")
        for line in result["failures"][:20]:
            print(f"  - {line}")
        if "traceback" in result:
            print(result["traceback"])
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
