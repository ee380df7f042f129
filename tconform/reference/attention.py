"""Scaled dot-product attention: softmax(Q K^T / sqrt(d_k)) V.

`mask` is boolean and broadcasts to the score matrix; True means "may attend". Masked scores are
set to the configured fill (-inf or -1e9) before the softmax.

Two kernels compute the same formula (ATTENTION_KERNELS). "plain" writes it out step by step
and also returns the weights. "sdpa" goes through torch's scaled_dot_product_attention, which
the dynamo exporter writes as one ONNX `Attention` node at opset 23 and ONNX Runtime runs as one
fused kernel; it gives no weights, so the `attention` case, whose model outputs them, exports
plain under either kernel.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

from tconform.config import ATTENTION_KERNELS, ModelConfig


class ScaledDotProductAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fill = cfg.fill_value
        self.kernel = "plain"  # see use_attention_kernel

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        # A tensor fill rounds to the scores' dtype (-1e9 becomes -inf in float16), as the
        # exported graph does; a Python float fill raises in eager float16.
        scores = scores.masked_fill(~mask, torch.tensor(self.fill, dtype=scores.dtype))
        weights = scores.softmax(dim=-1)
        return weights @ v, weights

    def context(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """softmax(...) V alone, through the selected kernel."""
        if self.kernel == "sdpa":
            return fused_attention(q, k, v, mask, self.fill)
        return self(q, k, v, mask)[0]


def fused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, fill: float
) -> torch.Tensor:
    """The plain kernel's context through torch's scaled_dot_product_attention.

    Rows with at least one key to attend to are the same formula (a masked score adds exp(fill
    - max) = 0 under either fill). A fully masked row differs: the fused kernels (torch's and
    ONNX Runtime's) return zeros there, while softmax over fills gives NaN for -inf (0/0) and
    equal weights, the mean of V, for -1e9; those rows are set to what the plain kernel gives.
    """
    # ONNX Runtime's Attention kernel does not broadcast the mask over the query axis.
    mask = mask.expand(*mask.shape[:-2], q.shape[-2], mask.shape[-1])
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    dead = ~mask.any(dim=-1, keepdim=True)
    if math.isinf(torch.tensor(fill, dtype=v.dtype).item()):  # -1e9 is -inf in float16
        fallback = torch.tensor(float("nan"), dtype=context.dtype, device=context.device)
    else:
        fallback = v.mean(dim=-2, keepdim=True)
    return torch.where(dead, fallback, context)


def use_attention_kernel(module: nn.Module, kernel: str) -> nn.Module:
    """Set every attention inside `module` to `kernel` (one of ATTENTION_KERNELS)."""
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}")
    for sub in module.modules():
        if isinstance(sub, ScaledDotProductAttention):
            sub.kernel = kernel
    return module
