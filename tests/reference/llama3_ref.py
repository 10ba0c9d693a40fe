"""Llama-3 as Hugging Face's LlamaForCausalLM computes it (transformers' modeling_llama.py),
in plain PyTorch: embed_tokens, pre-norm decoder layers (RMSNorm, grouped-query attention with
rotate-half RoPE on the HF layout of q_proj/k_proj, llama3 rope scaling; RMSNorm, SwiGLU MLP),
a final RMSNorm and lm_head (tied to embed_tokens when tie_word_embeddings)."""

import math

import torch
import torch.nn.functional as F

from ref_common import RefModel, causal_attention, rms_norm, swiglu_mlp


def inv_frequencies(cfg, head_dim, dtype):
    """_compute_default_rope_parameters, then _compute_llama3_parameters when rope_scaling has
    rope_type llama3 (the HF rule: low frequencies divided by factor, high kept, smooth blend)."""
    base = float(cfg.get("rope_theta", 10000.0))
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim))
    rs = cfg.get("rope_scaling")
    if not rs:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return inv
    if kind != "llama3":
        raise NotImplementedError(f"rope_scaling type {kind!r} is not in this reference")
    factor = rs["factor"]
    low, high = rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class Llama3Ref(RefModel):
    def __init__(self, cfg, tensors, dtype, device):
        super().__init__()
        arch = cfg.get("architectures", ["?"])
        if arch != ["LlamaForCausalLM"]:
            raise ValueError(f"llama3 reference: architectures {arch}, expected LlamaForCausalLM")
        if cfg.get("hidden_act", "silu") != "silu" or cfg.get("attention_bias") or cfg.get("mlp_bias"):
            raise ValueError("llama3 reference: only silu, no attention/mlp bias")
        self.cfg = cfg
        self.dim = cfg["hidden_size"]
        self.layers = cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads") or self.heads
        self.head_dim = cfg.get("head_dim") or self.dim // self.heads
        self.eps = cfg["rms_norm_eps"]
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        ffn, v = cfg["intermediate_size"], cfg["vocab_size"]
        hd, d = self.head_dim, self.dim
        expected = {"model.embed_tokens.weight": [v, d], "model.norm.weight": [d]}
        if not self.tied:
            expected["lm_head.weight"] = [v, d]
        for l in range(self.layers):
            pre = f"model.layers.{l}."
            expected.update({
                pre + "input_layernorm.weight": [d],
                pre + "self_attn.q_proj.weight": [self.heads * hd, d],
                pre + "self_attn.k_proj.weight": [self.kv_heads * hd, d],
                pre + "self_attn.v_proj.weight": [self.kv_heads * hd, d],
                pre + "self_attn.o_proj.weight": [d, self.heads * hd],
                pre + "post_attention_layernorm.weight": [d],
                pre + "mlp.gate_proj.weight": [ffn, d],
                pre + "mlp.up_proj.weight": [ffn, d],
                pre + "mlp.down_proj.weight": [d, ffn],
            })
        extra = sorted(set(tensors) - set(expected))
        if extra:
            raise ValueError(f"llama3 reference: the HF folder has tensors no Llama layer uses: {extra[:4]}")
        self.load(tensors, expected, dtype, device)
        self.inv_freq = inv_frequencies(cfg, hd, dtype).to(device)

    def forward(self, tokens):
        b, s = tokens.shape
        h = F.embedding(tokens, self.p("model.embed_tokens.weight"))
        pos = torch.arange(s, device=tokens.device, dtype=self.inv_freq.dtype)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        rep = self.heads // self.kv_heads
        for l in range(self.layers):
            pre = f"model.layers.{l}."
            x = rms_norm(h, self.p(pre + "input_layernorm.weight"), self.eps)
            q = F.linear(x, self.p(pre + "self_attn.q_proj.weight")).view(b, s, self.heads, -1).transpose(1, 2)
            k = F.linear(x, self.p(pre + "self_attn.k_proj.weight")).view(b, s, self.kv_heads, -1).transpose(1, 2)
            v = F.linear(x, self.p(pre + "self_attn.v_proj.weight")).view(b, s, self.kv_heads, -1).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            o = causal_attention(q, k, v, self.head_dim ** -0.5)
            h = h + F.linear(o, self.p(pre + "self_attn.o_proj.weight"))
            x = rms_norm(h, self.p(pre + "post_attention_layernorm.weight"), self.eps)
            h = h + swiglu_mlp(x, self.p(pre + "mlp.gate_proj.weight"), self.p(pre + "mlp.up_proj.weight"),
                               self.p(pre + "mlp.down_proj.weight"))
        h = rms_norm(h, self.p("model.norm.weight"), self.eps)
        head = self.p("model.embed_tokens.weight") if self.tied else self.p("lm_head.weight")
        return F.linear(h, head)

    def moe_layers(self):
        return []
