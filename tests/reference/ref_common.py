"""Pieces the reference models share, in plain PyTorch: parameters kept under their Hugging
Face names (so gradients compare name by name with meshtrain's dump), RMSNorm, causal
softmax attention and the SwiGLU MLP, each as the published model definitions write them."""

import torch
import torch.nn.functional as F


class MissingTensor(KeyError):
    pass


class RefModel(torch.nn.Module):
    """Holds every weight as an nn.Parameter named by its HF name (dots replaced inside the
    ParameterDict, which forbids them); `p(name)` returns it."""

    def __init__(self):
        super().__init__()
        self._params = torch.nn.ParameterDict()
        self._names = []

    def add(self, name, tensor, dtype, device):
        key = name.replace(".", "__")
        self._params[key] = torch.nn.Parameter(tensor.to(device=device, dtype=dtype).clone())
        self._names.append(name)

    def p(self, name):
        return self._params[name.replace(".", "__")]

    def named(self):
        return [(n, self.p(n)) for n in self._names]

    def load(self, tensors, expected, dtype, device):
        """Takes exactly the HF tensors in `expected` (name -> shape) from `tensors`; a missing,
        extra or misshapen tensor is an error naming it."""
        missing = [n for n in expected if n not in tensors]
        if missing:
            raise MissingTensor(f"the HF folder lacks {len(missing)} tensors, e.g. {missing[:4]}")
        for n, shape in expected.items():
            got = list(tensors[n].shape)
            if got != list(shape):
                raise ValueError(f"tensor {n}: expected shape {list(shape)}, found {got}")
            self.add(n, tensors[n], dtype, device)


def rms_norm(x, weight, eps):
    # LlamaRMSNorm / DeepseekV3RMSNorm: x * rsqrt(mean(x^2) + eps), then the weight.
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def causal_attention(q, k, v, scale):
    """q, k [B, H, S, Dqk], v [B, H, S, Dv] -> [B, S, H * Dv]; eager softmax(q k^T * scale)."""
    s = q.shape[2]
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    mask = torch.full((s, s), float("-inf"), dtype=scores.dtype, device=scores.device).triu(1)
    probs = torch.softmax(scores + mask, dim=-1)
    out = torch.matmul(probs, v)  # [B, H, S, Dv]
    b, h, _, dv = out.shape
    return out.transpose(1, 2).reshape(b, s, h * dv)


def swiglu_mlp(x, gate_w, up_w, down_w):
    # down_proj(silu(gate_proj(x)) * up_proj(x))
    return F.linear(F.silu(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)


def token_loss(logits, labels):
    """Mean next-token cross entropy over every position (meshtrain divides the sum by the
    step's token count)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
