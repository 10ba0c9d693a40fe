#!/usr/bin/env python3
"""PyTorch baseline for meshtrain's end-to-end benchmark (bench/e2e/run.sh).

The same models and shapes as meshtrain's flavors, trained the way torchtitan does on one GPU:
scaled_dot_product_attention, torch._grouped_mm for the routed experts (tokens per expert counted
with torch.histc, which neither syncs nor breaks the compiled graph), fused AdamW. Four variants
(--variants): eager or torch.compile, each with
  autocast  bf16 autocast over fp32 parameters (the optimizer updates them in place);
  bf16      bf16 parameters for compute over fp32 master copies, no autocast: the fp32 gradients
            of the masters are cast from the bf16 ones, AdamW updates the masters, then writes the
            bf16 parameters from them.
Prints one JSON line per variant: tokens/s, TFLOP/s and MFU (torchtitan's active-parameter
convention, peak 989.5 TFLOP/s bf16), peak memory and its parts: parameters (with the fp32 masters),
gradients as backward leaves them (the bf16 variant's fp32 master gradients, made at the optimizer
step while the bf16 ones are freed, apart), optimizer moments, and the rest (activations,
workspace, allocator slack) = peak - those. Synthetic tokens (uniform ids): the throughput of
the dense model does not depend on the data; the MoE model's expert loads are near uniform.
"""
import argparse
import gc
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_FLOPS = 989.5e12


# ----------------------------------------------------------------------------- rope
def llama3_freqs(head_dim, seq_len, theta, factor=8.0, low=1.0, high=4.0, orig=8192):
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    wavelen = 2 * math.pi / freqs
    low_wl, high_wl = orig / low, orig / high
    new = torch.where(wavelen > low_wl, freqs / factor, freqs)
    smooth = (orig / wavelen - low) / (high - low)
    freqs = torch.where((wavelen >= high_wl) & (wavelen <= low_wl),
                        (1 - smooth) * new / factor + smooth * new, new)
    t = torch.arange(seq_len).float()
    return torch.polar(torch.ones(seq_len, head_dim // 2), torch.outer(t, freqs))


def yarn_freqs(dim, seq_len, theta=10000.0, factor=40.0, beta_fast=32, beta_slow=1, orig=4096):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if seq_len > orig:
        def corr_dim(n_rot):
            return dim * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(theta))
        low = max(math.floor(corr_dim(beta_fast)), 0)
        high = min(math.ceil(corr_dim(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    t = torch.arange(seq_len).float()
    return torch.polar(torch.ones(seq_len, dim // 2), torch.outer(t, freqs))


def apply_rope(x, freqs_cis):  # x [B, S, H, D] (interleaved pairs), freqs [S, D/2]
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs_cis[None, :, None, :]).flatten(3)
    return out.type_as(x)


# ----------------------------------------------------------------------------- llama3
class LlamaBlock(nn.Module):
    def __init__(self, a, layer_id):
        super().__init__()
        d, h, kv, hd = a["dim"], a["n_heads"], a["n_kv_heads"], a["dim"] // a["n_heads"]
        self.h, self.kv, self.hd = h, kv, hd
        self.wq = nn.Linear(d, h * hd, bias=False)
        self.wk = nn.Linear(d, kv * hd, bias=False)
        self.wv = nn.Linear(d, kv * hd, bias=False)
        self.wo = nn.Linear(h * hd, d, bias=False)
        self.w1 = nn.Linear(d, a["ffn"], bias=False)
        self.w2 = nn.Linear(a["ffn"], d, bias=False)
        self.w3 = nn.Linear(d, a["ffn"], bias=False)
        self.attention_norm = nn.RMSNorm(d, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(d, eps=1e-5)

    def forward(self, x, freqs):
        B, S, _ = x.shape
        y = self.attention_norm(x)
        q = apply_rope(self.wq(y).view(B, S, self.h, self.hd), freqs)
        k = apply_rope(self.wk(y).view(B, S, self.kv, self.hd), freqs)
        v = self.wv(y).view(B, S, self.kv, self.hd)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, enable_gqa=self.kv != self.h)
        x = x + self.wo(o.transpose(1, 2).reshape(B, S, -1))
        y = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class Llama(nn.Module):
    def __init__(self, a, seq_len):
        super().__init__()
        self.tok_embeddings = nn.Embedding(a["vocab"], a["dim"])
        self.layers = nn.ModuleList([LlamaBlock(a, i) for i in range(a["n_layers"])])
        self.norm = nn.RMSNorm(a["dim"], eps=1e-5)
        self.output = nn.Linear(a["dim"], a["vocab"], bias=False)
        self.register_buffer("freqs", llama3_freqs(a["dim"] // a["n_heads"], seq_len, 500000.0),
                             persistent=False)
        self.attn_dims = 2 * (a["dim"] // a["n_heads"])
        self.n_heads = a["n_heads"]

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs)
        return self.output(self.norm(h))


# ----------------------------------------------------------------------------- deepseek v3
class MLA(nn.Module):
    def __init__(self, a):
        super().__init__()
        d, h = a["dim"], a["n_heads"]
        self.h, self.nope, self.rope, self.vd = h, a["nope"], a["rope"], a["v"]
        self.qk = self.nope + self.rope
        self.wq = nn.Linear(d, h * self.qk, bias=False)
        self.wkv_a = nn.Linear(d, a["kv_lora"] + self.rope, bias=False)
        self.kv_norm = nn.RMSNorm(a["kv_lora"], eps=1e-5)
        self.wkv_b = nn.Linear(a["kv_lora"], h * (self.nope + self.vd), bias=False)
        self.wo = nn.Linear(h * self.vd, d, bias=False)
        self.kv_lora = a["kv_lora"]
        scale = self.qk ** -0.5
        if a["seq_len"] > 4096:
            mscale = 0.1 * a["mscale"] * math.log(40.0) + 1.0
            scale = scale * mscale * mscale
        self.scale = scale

    def forward(self, x, freqs):
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, self.h, self.qk)
        q_nope, q_pe = torch.split(q, [self.nope, self.rope], dim=-1)
        q = torch.cat([q_nope, apply_rope(q_pe, freqs)], dim=-1)
        kv = self.wkv_a(x)
        kv, k_pe = torch.split(kv, [self.kv_lora, self.rope], dim=-1)
        k_pe = apply_rope(k_pe.unsqueeze(2), freqs)
        kv = self.wkv_b(self.kv_norm(kv)).view(B, S, self.h, self.nope + self.vd)
        k_nope, v = torch.split(kv, [self.nope, self.vd], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, self.h, -1)], dim=-1)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, scale=self.scale)
        return self.wo(o.transpose(1, 2).reshape(B, S, -1))


class FFN(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


ALIGN = 16  # torch._grouped_mm wants each group's rows aligned


class MoE(nn.Module):
    def __init__(self, a):
        super().__init__()
        d, e, hid = a["dim"], a["experts"], a["moe_inter"]
        self.e, self.k = e, a["top_k"]
        self.gate = nn.Linear(d, e, bias=False)
        self.w1 = nn.Parameter(torch.empty(e, hid, d))
        self.w2 = nn.Parameter(torch.empty(e, d, hid))
        self.w3 = nn.Parameter(torch.empty(e, hid, d))
        for w in (self.w1, self.w2, self.w3):
            nn.init.trunc_normal_(w, std=0.02)
        self.shared = FFN(d, hid * a["shared"])
        self.register_buffer("expert_bias", torch.zeros(e))
        self.register_buffer("tokens_per_expert", torch.zeros(e))

    def forward(self, x):
        B, S, D = x.shape
        x = x.reshape(-1, D)
        T = x.shape[0]
        scores = F.softmax(self.gate(x).float(), dim=-1)
        _, idx = torch.topk(scores + self.expert_bias, self.k, dim=-1)
        w = scores.gather(1, idx)
        with torch.no_grad():
            # histc, not bincount: bincount's output size depends on the data (a host sync, and
            # a graph break under torch.compile); ids are integers in [0, E), one bin each.
            counts = torch.histc(idx.flatten().float(), bins=self.e, min=0, max=self.e).long()
            self.tokens_per_expert += counts
            padded = ((counts + ALIGN - 1) // ALIGN) * ALIGN
            ends = torch.cumsum(padded, 0)
            starts = ends - padded
            order = torch.argsort(idx.flatten(), stable=True)          # expert-major slots
            sorted_e = idx.flatten()[order]
            rank_in_e = torch.arange(T * self.k, device=x.device) - (torch.cumsum(counts, 0) - counts)[sorted_e]
            dest = starts[sorted_e] + rank_in_e                           # padded row of each slot
            cap = T * self.k + self.e * ALIGN
        src_tok = order // self.k
        # grouped_mm is bf16-only and outside autocast's lists: cast as torchtitan's experts do.
        xb = x.to(torch.bfloat16)
        xp = xb.new_zeros(cap, D)
        xp[dest] = xb[src_tok]
        offs = ends.to(torch.int32)
        w1, w2, w3 = (w.to(torch.bfloat16).transpose(-2, -1) for w in (self.w1, self.w2, self.w3))
        h = F.silu(torch._grouped_mm(xp, w1, offs=offs)) * torch._grouped_mm(xp, w3, offs=offs)
        yp = torch._grouped_mm(h, w2, offs=offs)
        y = yp[dest] * w.flatten()[order].unsqueeze(1).to(yp.dtype)
        out = x.new_zeros(T, D).index_add_(0, src_tok, y.to(x.dtype))
        return (out + self.shared(x)).view(B, S, D)

    @torch.no_grad()
    def balance(self, coeff=1e-3):
        delta = coeff * torch.sign(self.tokens_per_expert.mean() - self.tokens_per_expert)
        self.expert_bias += delta - delta.mean()
        self.tokens_per_expert.zero_()


class DSBlock(nn.Module):
    def __init__(self, a, layer_id):
        super().__init__()
        self.attention = MLA(a)
        self.attention_norm = nn.RMSNorm(a["dim"], eps=1e-5)
        self.ffn_norm = nn.RMSNorm(a["dim"], eps=1e-5)
        self.moe = MoE(a) if layer_id >= a["n_dense"] else None
        self.feed_forward = FFN(a["dim"], a["inter"]) if self.moe is None else None

    def forward(self, x, freqs):
        x = x + self.attention(self.attention_norm(x), freqs)
        y = self.ffn_norm(x)
        return x + (self.moe(y) if self.moe is not None else self.feed_forward(y))


class DeepSeek(nn.Module):
    def __init__(self, a, seq_len):
        super().__init__()
        a = dict(a, seq_len=seq_len)
        self.tok_embeddings = nn.Embedding(a["vocab"], a["dim"])
        self.layers = nn.ModuleList([DSBlock(a, i) for i in range(a["n_layers"])])
        self.norm = nn.RMSNorm(a["dim"], eps=1e-5)
        self.output = nn.Linear(a["dim"], a["vocab"], bias=False)
        self.register_buffer("freqs", yarn_freqs(a["rope"], seq_len), persistent=False)
        self.attn_dims = a["nope"] + a["rope"] + a["v"]
        self.n_heads = a["n_heads"]
        self.top_k, self.experts = a["top_k"], a["experts"]

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs)
        return self.output(self.norm(h))


FLAVORS = {
    "llama3_8b": dict(kind="llama", dim=4096, n_heads=32, n_kv_heads=8, ffn=14336, vocab=128256),
    "deepseek_v3_16b": dict(kind="deepseek", dim=2048, inter=10944, moe_inter=1408, n_heads=16,
                            experts=64, shared=2, top_k=6, n_dense=1, kv_lora=512, nope=128,
                            rope=64, v=128, mscale=0.707, vocab=102400),
}


def flops_per_token(model, seq_len, n_layers):
    total = emb = routed = 0
    for name, p in model.named_parameters():
        n = p.numel()
        total += n
        if name == "tok_embeddings.weight":
            emb += n
        if ".moe.w" in name:
            routed += n
    active = total - routed + (routed * model.top_k / model.experts if routed else 0)
    attn = 6 * n_layers * model.n_heads * model.attn_dims * seq_len
    return total, active, 6 * (active - emb) + attn


VARIANTS = {  # name -> (torch.compile, precision)
    "eager": (False, "autocast"),
    "compile": (True, "autocast"),
    "eager-bf16": (False, "bf16"),
    "compile-bf16": (True, "bf16"),
}


def system_name(variant):
    compiled, precision = VARIANTS[variant]
    return ("pytorch " + ("compile" if compiled else "eager") +
            (" (autocast)" if precision == "autocast" else " (bf16 + fp32 masters)"))


def gib(n_bytes):
    return n_bytes / 2**30


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def run(flavor, n_layers, batch, seq_len, steps, warmup, variant):
    compiled, precision = VARIANTS[variant]
    a = dict(FLAVORS[flavor], n_layers=n_layers)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = (Llama(a, seq_len) if a["kind"] == "llama" else DeepSeek(a, seq_len)).to(dev)
    total, active, fpt = flops_per_token(model, seq_len, n_layers)
    params = list(model.parameters())
    if precision == "bf16":
        # fp32 masters first, then the model's own parameters become their bf16 compute copies
        # (parameters only: the buffers — rope's complex frequencies, the expert bias and load
        # counters — keep their dtypes).
        masters = [p.detach().clone().requires_grad_(True) for p in params]
        with torch.no_grad():
            for p in params:
                p.data = p.data.to(torch.bfloat16)
        opt_params = masters
    else:
        masters, opt_params = None, params
    opt = torch.optim.AdamW(opt_params, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=True)
    fwd = torch.compile(model) if compiled else model
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    tokens = torch.randint(0, a["vocab"], (batch, seq_len + 1), device=dev)
    inp, lab = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    grad_bytes = [0, 0]  # the gradients backward leaves; the masters' fp32 copies (bf16)

    def step():
        if precision == "autocast":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = fwd(inp)
        else:
            logits = fwd(inp)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), lab.flatten())
        loss.backward()
        grad_bytes[0] = tensor_bytes(p.grad for p in params)
        if masters is not None:
            # The masters' fp32 gradients, each bf16 gradient freed once cast.
            for p, m in zip(params, masters):
                m.grad = p.grad.float()
                p.grad = None
            grad_bytes[1] = tensor_bytes(m.grad for m in masters)
        torch.nn.utils.clip_grad_norm_(opt_params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if masters is not None:
            with torch.no_grad():  # the optimizer's result written into the bf16 compute copies
                for p, m in zip(params, masters):
                    p.copy_(m)
        for m in moes:
            m.balance()
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    tps = batch * seq_len / dt
    peak = torch.cuda.max_memory_allocated()
    param_bytes = tensor_bytes(params) + (tensor_bytes(masters) if masters else 0)
    moment_bytes = sum(tensor_bytes(v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
                       for st in opt.state.values())
    r = dict(system=system_name(variant), variant=variant, flavor=flavor, n_layers=n_layers,
             batch=batch, seq_len=seq_len, params=total, active=active, flops_per_token=fpt,
             step_s=dt, tps=tps, tflops=fpt * tps / 1e12, mfu=100 * fpt * tps / PEAK_FLOPS,
             peak_gib=gib(peak), reserved_gib=gib(torch.cuda.max_memory_reserved()),
             params_gib=gib(param_bytes), grads_gib=gib(grad_bytes[0]),
             master_grads_gib=gib(grad_bytes[1]), moments_gib=gib(moment_bytes),
             rest_gib=gib(peak - param_bytes - grad_bytes[0] - moment_bytes), loss=float(loss))
    del fwd, model, opt, params, masters, opt_params
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flavor", choices=FLAVORS, required=True)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated, of " + ", ".join(VARIANTS) + " (default: all)")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}: expected one of {', '.join(VARIANTS)}")
    failed = False
    for v in variants:
        try:
            r = run(args.flavor, args.n_layers, args.batch, args.seq_len, args.steps, args.warmup, v)
        except Exception as e:  # report and go on: one failing variant must not hide the others
            r = dict(system=system_name(v), variant=v, flavor=args.flavor,
                     error=f"{type(e).__name__}: {e}")
            failed = True
        print(json.dumps(r), flush=True)
        # Free the variant's model, optimizer and compiled graphs before the next one.
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
