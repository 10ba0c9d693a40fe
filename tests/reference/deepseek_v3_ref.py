"""DeepSeek-V2/V3 in plain PyTorch, from DeepSeek's published inference model (model.py of
DeepSeek-V3: MLA, Gate, MoE, YaRN precompute_freqs_cis) with the Hugging Face config and weight
names (modeling_deepseek_v3.py), and torchtitan's training-side routing: an expert bias that
only steers the choice, moved after each step by coeff * sign(mean load - load), re-centred.

Covers q_proj or q_a_proj/q_a_layernorm/q_b_proj, kv_a_proj_with_mqa/kv_a_layernorm/kv_b_proj,
rope on interleaved pairs of the q_pe/k_pe tails (the release's layout), YaRN with the mscale
softmax correction, first_k_dense_replace dense layers, softmax or sigmoid scores, group-limited
choice, norm_topk_prob, routed_scaling_factor, shared experts.

Multi-token prediction (num_nextn_predict_layers = D > 0), from the DeepSeek-V3 report (section
2.2) and the released checkpoints' layout (module k is model.layers.{L + k - 1}, L =
num_hidden_layers): module k combines RMSNorm(enorm) of the embedding of the tokens k positions
ahead with RMSNorm(hnorm) of the previous depth's hidden state (the main stack's output before
its final norm for k = 1, module k - 1's block output after), projects the concatenation with
eh_proj (2·hidden -> hidden; the release puts the embedding half first, the report writes the
hidden half first: the release's order is what its weights mean), runs one ordinary decoder
layer, and predicts through its own RMSNorm (shared_head.norm) and the shared output head. The
embedding and the head are the main model's; the release stores copies of them in each module
(embed_tokens, shared_head.head), which this reference requires to equal the main ones."""

import math

import torch
import torch.nn.functional as F

from ref_common import RefModel, causal_attention, rms_norm, swiglu_mlp

IGNORE = -100  # label of a position whose target is not in the row


def token_ce(logits, labels):
    """Mean cross entropy over the positions whose label is not IGNORE."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


def yarn_get_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_tables(cfg, seqlen, dtype, device):
    """(cos, sin) [S, rope_dim/2] and the attention-factor of the rope; precompute_freqs_cis of
    model.py with the correction applied whenever config.json asks for YaRN (HF's rule)."""
    dim = cfg["qk_rope_head_dim"]
    base = float(cfg.get("rope_theta", 10000.0))
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=dtype) / dim))
    rs = cfg.get("rope_scaling")
    attn_factor = 1.0
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        if kind != "yarn":
            raise NotImplementedError(f"rope_scaling type {kind!r} is not in this reference")
        factor = rs["factor"]
        orig = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        beta_fast, beta_slow = rs.get("beta_fast", 32), rs.get("beta_slow", 1)

        def correction_dim(rot):
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(correction_dim(beta_fast)), 0)
        high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=dtype) - low) / (high - low)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
        m, m_all = rs.get("mscale"), rs.get("mscale_all_dim")
        attn_factor = yarn_get_mscale(factor, m) / yarn_get_mscale(factor, m_all) if m and m_all \
            else yarn_get_mscale(factor, 1.0)
    t = torch.arange(seqlen, dtype=dtype)
    angles = torch.outer(t, freqs)
    return (angles.cos() * attn_factor).to(device), (angles.sin() * attn_factor).to(device)


def softmax_scale(cfg):
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    scale = qk ** -0.5
    rs = cfg.get("rope_scaling")
    if rs and rs.get("mscale_all_dim"):
        m = yarn_get_mscale(rs["factor"], rs["mscale_all_dim"])
        scale = scale * m * m
    return scale


def apply_rotary(x, cos, sin):
    """x [B, S, H, D]: the complex product of each pair (x[2i], x[2i+1]) with e^{i t f_i}
    (model.py's apply_rotary_emb on view_as_complex)."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    rot = torch.complex(cos, sin)[None, :, None, :]
    return torch.view_as_real(xc * rot).flatten(3)


class DeepSeekV3Ref(RefModel):
    def __init__(self, cfg, tensors, dtype, device, load_balance_coeff):
        super().__init__()
        arch = cfg.get("architectures", ["?"])
        if arch not in (["DeepseekV3ForCausalLM"], ["DeepseekV2ForCausalLM"]):
            raise ValueError(f"deepseek reference: architectures {arch}, expected DeepseekV3ForCausalLM "
                             "or DeepseekV2ForCausalLM")
        if cfg.get("hidden_act", "silu") != "silu" or cfg.get("attention_bias"):
            raise ValueError("deepseek reference: only silu and no attention bias")
        if cfg.get("moe_layer_freq", 1) != 1:
            raise ValueError("deepseek reference: moe_layer_freq must be 1")
        if cfg.get("rope_interleave", True) is not True:
            raise ValueError("deepseek reference: only the interleaved rope layout of the release")
        self.cfg = cfg
        self.dtype, self.device = dtype, device
        c = cfg
        self.dim, self.layers, self.heads = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
        self.q_lora = c.get("q_lora_rank") or 0
        self.kv_lora, self.nope, self.rope = c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"]
        self.vdim = c["v_head_dim"]
        self.n_dense = c.get("first_k_dense_replace", 0)
        self.experts = c["n_routed_experts"]
        self.shared = c.get("n_shared_experts") or 0
        self.top_k = c["num_experts_per_tok"]
        self.n_group = c.get("n_group") or 1
        self.topk_group = c.get("topk_group") or 1
        self.topk_method = c.get("topk_method", "noaux_tc")
        default_score = "sigmoid" if arch == ["DeepseekV3ForCausalLM"] else "softmax"
        self.score_func = c.get("scoring_func", default_score)
        self.norm_topk = bool(c.get("norm_topk_prob", False))
        self.route_scale = float(c.get("routed_scaling_factor", 1.0))
        self.eps = c["rms_norm_eps"]
        # torchtitan's final norm is nn.RMSNorm without eps (torch's machine epsilon); meshtrain
        # records the value it uses beside the HF fields.
        self.final_eps = c.get("meshtrain", {}).get("final_norm_eps", self.eps)
        self.tied = bool(c.get("tie_word_embeddings", False))
        self.coeff = load_balance_coeff
        d, qk = self.dim, self.nope + self.rope
        v, inter, moe_inter = c["vocab_size"], c["intermediate_size"], c["moe_intermediate_size"]
        expected = {"model.embed_tokens.weight": [v, d], "model.norm.weight": [d]}
        if not self.tied:
            expected["lm_head.weight"] = [v, d]
        self.bias = {}
        self.mtp = int(c.get("num_nextn_predict_layers") or 0)
        self.shared_copies = {}  # MTP copy name -> the main tensor it must equal
        for l in range(self.layers + self.mtp):
            if l >= self.layers:  # MTP module k = l - L + 1: its own tensors, then a block
                t = f"model.layers.{l}."
                expected.update({t + "enorm.weight": [d], t + "hnorm.weight": [d],
                                 t + "eh_proj.weight": [d, 2 * d], t + "shared_head.norm.weight": [d]})
                self.shared_copies[t + "embed_tokens.weight"] = "model.embed_tokens.weight"
                self.shared_copies[t + "shared_head.head.weight"] = \
                    "model.embed_tokens.weight" if self.tied else "lm_head.weight"
            a = f"model.layers.{l}.self_attn."
            expected[f"model.layers.{l}.input_layernorm.weight"] = [d]
            expected[f"model.layers.{l}.post_attention_layernorm.weight"] = [d]
            if self.q_lora:
                expected.update({a + "q_a_proj.weight": [self.q_lora, d], a + "q_a_layernorm.weight": [self.q_lora],
                                 a + "q_b_proj.weight": [self.heads * qk, self.q_lora]})
            else:
                expected[a + "q_proj.weight"] = [self.heads * qk, d]
            expected.update({
                a + "kv_a_proj_with_mqa.weight": [self.kv_lora + self.rope, d],
                a + "kv_a_layernorm.weight": [self.kv_lora],
                a + "kv_b_proj.weight": [self.heads * (self.nope + self.vdim), self.kv_lora],
                a + "o_proj.weight": [d, self.heads * self.vdim],
            })
            m = f"model.layers.{l}.mlp."
            if l < self.n_dense:
                expected.update({m + "gate_proj.weight": [inter, d], m + "up_proj.weight": [inter, d],
                                 m + "down_proj.weight": [d, inter]})
                continue
            expected[m + "gate.weight"] = [self.experts, d]
            for e in range(self.experts):
                x = f"{m}experts.{e}."
                expected.update({x + "gate_proj.weight": [moe_inter, d], x + "up_proj.weight": [moe_inter, d],
                                 x + "down_proj.weight": [d, moe_inter]})
            if self.shared:
                hs = moe_inter * self.shared
                expected.update({m + "shared_experts.gate_proj.weight": [hs, d],
                                 m + "shared_experts.up_proj.weight": [hs, d],
                                 m + "shared_experts.down_proj.weight": [d, hs]})
            bias_name = m + "gate.e_score_correction_bias"
            b = tensors.get(bias_name)
            if b is not None and list(b.shape) != [self.experts]:
                raise ValueError(f"tensor {bias_name}: expected shape [{self.experts}], found {list(b.shape)}")
            self.bias[l] = (b if b is not None else torch.zeros(self.experts)).to(device=device, dtype=dtype).clone()
        for copy, main in self.shared_copies.items():
            if main not in tensors:
                continue  # load() below names the missing main tensor
            if copy not in tensors:
                raise ValueError(f"deepseek reference: the HF folder lacks {copy} (the release stores a "
                                 f"copy of {main} in every MTP layer)")
            if list(tensors[copy].shape) != list(tensors[main].shape) or not torch.equal(tensors[copy],
                                                                                        tensors[main]):
                raise ValueError(f"deepseek reference: {copy} differs from {main}; the MTP modules share "
                                 "the main model's embedding and head")
        known = set(expected) | set(self.shared_copies) | \
            {f"model.layers.{l}.mlp.gate.e_score_correction_bias" for l in self.bias}
        extra = sorted(set(tensors) - known)
        if extra:
            raise ValueError(f"deepseek reference: the HF folder has tensors no layer uses: {extra[:4]}")
        self.load(tensors, expected, dtype, device)
        self.scale = softmax_scale(cfg)
        self.counts = {}   # layer -> tokens per expert, summed since the last bias update
        self.margins = {}  # layer -> smallest gap between the k-th and (k+1)-th choice score

    # --- attention (model.py MLA, naive form) ---------------------------------------------
    def mla(self, l, x, cos, sin):
        b, s, _ = x.shape
        a = f"model.layers.{l}.self_attn."
        if self.q_lora:
            q = F.linear(rms_norm(F.linear(x, self.p(a + "q_a_proj.weight")), self.p(a + "q_a_layernorm.weight"),
                                  self.eps), self.p(a + "q_b_proj.weight"))
        else:
            q = F.linear(x, self.p(a + "q_proj.weight"))
        q = q.view(b, s, self.heads, self.nope + self.rope)
        q_nope, q_pe = torch.split(q, [self.nope, self.rope], dim=-1)
        q_pe = apply_rotary(q_pe, cos, sin)
        kv = F.linear(x, self.p(a + "kv_a_proj_with_mqa.weight"))
        kv, k_pe = torch.split(kv, [self.kv_lora, self.rope], dim=-1)
        k_pe = apply_rotary(k_pe.unsqueeze(2), cos, sin)
        kv = F.linear(rms_norm(kv, self.p(a + "kv_a_layernorm.weight"), self.eps), self.p(a + "kv_b_proj.weight"))
        kv = kv.view(b, s, self.heads, self.nope + self.vdim)
        k_nope, v = torch.split(kv, [self.nope, self.vdim], dim=-1)
        qf = torch.cat([q_nope, q_pe], dim=-1).transpose(1, 2)
        kf = torch.cat([k_nope, k_pe.expand(-1, -1, self.heads, -1)], dim=-1).transpose(1, 2)
        o = causal_attention(qf, kf, v.transpose(1, 2), self.scale)
        return F.linear(o, self.p(a + "o_proj.weight"))

    # --- routing (model.py Gate + torchtitan's biased choice) ------------------------------
    def route(self, l, x):
        logits = F.linear(x, self.p(f"model.layers.{l}.mlp.gate.weight"))
        scores = logits.softmax(dim=-1) if self.score_func == "softmax" else logits.sigmoid()
        with torch.no_grad():
            if self.topk_method == "group_limited_greedy":  # DeepSeek-V2: best expert per group, no bias
                choice = scores.clone()
                group = choice.view(x.shape[0], self.n_group, -1).amax(dim=-1)
            else:
                choice = scores + self.bias[l]
                group = choice.view(x.shape[0], self.n_group, -1).topk(2, dim=-1)[0].sum(dim=-1) \
                    if self.n_group > 1 else None
            if self.n_group > 1 and self.topk_group < self.n_group:
                keep = group.topk(self.topk_group, dim=-1)[1]
                mask = torch.ones_like(group, dtype=torch.bool).scatter_(1, keep, False)
                choice = choice.view(x.shape[0], self.n_group, -1).masked_fill(mask.unsqueeze(-1), float("-inf"))
                choice = choice.flatten(1)
            top = choice.topk(self.top_k + 1 if self.top_k < self.experts else self.top_k, dim=-1)
            idx = top.indices[:, : self.top_k]
            if self.top_k < self.experts:
                gap = top.values[:, self.top_k - 1] - top.values[:, self.top_k]
                gap = gap[torch.isfinite(gap)]
                if gap.numel():
                    self.margins[l] = min(self.margins.get(l, float("inf")), float(gap.min()))
        w = scores.gather(1, idx)
        if self.norm_topk:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return idx, w * self.route_scale

    def moe(self, l, x):
        shape = x.shape
        x = x.reshape(-1, self.dim)
        idx, w = self.route(l, x)
        counts = torch.bincount(idx.flatten(), minlength=self.experts).to(torch.float64)
        self.counts[l] = self.counts.get(l, torch.zeros_like(counts)) + counts
        y = torch.zeros_like(x)
        m = f"model.layers.{l}.mlp."
        for e in range(self.experts):
            tok, slot = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            pre = f"{m}experts.{e}."
            out = swiglu_mlp(x[tok], self.p(pre + "gate_proj.weight"), self.p(pre + "up_proj.weight"),
                             self.p(pre + "down_proj.weight"))
            y = y.index_add(0, tok, out * w[tok, slot, None])
        if self.shared:
            y = y + swiglu_mlp(x, self.p(m + "shared_experts.gate_proj.weight"),
                               self.p(m + "shared_experts.up_proj.weight"),
                               self.p(m + "shared_experts.down_proj.weight"))
        return y.view(shape)

    # --- the decoder layers and the head -------------------------------------------------
    def block(self, l, h, cos, sin):
        """Decoder layer l (DeepseekV3DecoderLayer): pre-norm MLA, then a pre-norm dense MLP
        (l < first_k_dense_replace) or MoE, each added to the residual stream."""
        pre = f"model.layers.{l}."
        h = h + self.mla(l, rms_norm(h, self.p(pre + "input_layernorm.weight"), self.eps), cos, sin)
        x = rms_norm(h, self.p(pre + "post_attention_layernorm.weight"), self.eps)
        if l < self.n_dense:
            m = pre + "mlp."
            return h + swiglu_mlp(x, self.p(m + "gate_proj.weight"), self.p(m + "up_proj.weight"),
                                  self.p(m + "down_proj.weight"))
        return h + self.moe(l, x)

    def head(self):
        return self.p("model.embed_tokens.weight") if self.tied else self.p("lm_head.weight")

    def trunk(self, tokens):
        """The main stack's output before the final norm, [B, S, hidden], and the rope tables."""
        cos, sin = rope_tables(self.cfg, tokens.shape[1], self.dtype, self.device)
        h = F.embedding(tokens, self.p("model.embed_tokens.weight"))
        for l in range(self.layers):
            h = self.block(l, h, cos, sin)
        return h, cos, sin

    def logits(self, h):
        return F.linear(rms_norm(h, self.p("model.norm.weight"), self.final_eps), self.head())

    def forward(self, tokens):
        return self.logits(self.trunk(tokens)[0])

    # --- multi-token prediction (DeepSeek-V3 report, section 2.2) ------------------------------
    def mtp_logits(self, tokens, h, cos, sin):
        """Logits [B, S, vocab] of every depth k = 1..D from the main stack's pre-norm output h.
        Depth k at position i sees the embedding of token i + k and predicts token i + k + 1
        (label i + k). The tokens are rolled left by k within the row, so the last k positions see
        the row's first tokens: their targets fall off the row and are ignored, and attention is
        causal, so they change no counted prediction, but their tokens are routed like any other
        and count in the MoE loads of the module's layer."""
        emb = self.p("model.embed_tokens.weight")
        out = []
        for k in range(1, self.mtp + 1):
            l = self.layers + k - 1
            t = f"model.layers.{l}."
            e = rms_norm(F.embedding(torch.roll(tokens, -k, dims=1), emb), self.p(t + "enorm.weight"), self.eps)
            prev = rms_norm(h, self.p(t + "hnorm.weight"), self.eps)
            x = F.linear(torch.cat([e, prev], dim=-1), self.p(t + "eh_proj.weight"))
            h = self.block(l, x, cos, sin)  # the next depth's previous hidden state
            # shared_head: the module's own RMSNorm (rms_norm_eps, as the release's config
            # states), then the main model's output head.
            out.append(F.linear(rms_norm(h, self.p(t + "shared_head.norm.weight"), self.eps), self.head()))
        return out

    def losses(self, tokens, labels, mtp_weight):
        """(loss, main, [l_1 .. l_D]) of one batch, tokens and labels [B, S] (labels = tokens
        shifted by one within the window). main: the mean cross entropy over every position.
        l_k: the mean over the positions whose depth-k target, label i + k, lies inside the row
        (S - k per row; torch's ignore_index rule: ignored positions add nothing to the sum or the
        count). loss = main + mtp_weight * (l_1 + ... + l_D) / D, the report's
        L = L_main + (lambda / D) * sum_k L_MTP^k. (The report writes L_MTP^k with a 1/T in front
        of its T - k terms; a mean over the targets that exist is what ignoring the rest means.)"""
        h, cos, sin = self.trunk(tokens)
        main = token_ce(self.logits(h), labels)
        if not self.mtp:
            return main, main, []
        s = tokens.shape[1]
        if s <= self.mtp:
            raise ValueError(f"seq_len {s} leaves no depth-{self.mtp} target in a row")
        depth = []
        for k, logits in enumerate(self.mtp_logits(tokens, h, cos, sin), start=1):
            target = torch.full_like(labels, IGNORE)
            target[:, : s - k] = labels[:, k:]
            depth.append(token_ce(logits, target))
        return main + mtp_weight * torch.stack(depth).mean(), main, depth

    def moe_layers(self):
        return sorted(self.bias)

    @torch.no_grad()
    def update_expert_bias(self):
        """torchtitan's load balancing after an optimizer step: bias += coeff * sign(mean - load),
        minus the mean of that step; the counts restart."""
        for l in self.moe_layers():
            c = self.counts.get(l)
            if c is None:
                continue
            if self.coeff > 0:
                delta = self.coeff * torch.sign(c.mean() - c)
                self.bias[l] += (delta - delta.mean()).to(self.bias[l].dtype)
        self.counts = {}
