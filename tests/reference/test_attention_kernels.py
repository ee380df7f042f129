"""The two attention kernels compute the same function in eager torch: the fused one
(scaled_dot_product_attention) agrees with the plain one on padding and causal masks, and on
fully masked rows under both fills (NaN for -inf, the mean of V for -1e9)."""

from __future__ import annotations

import pytest
import torch

from tconform.config import PRESETS
from tconform.reference import MultiHeadAttention
from tconform.reference.attention import ScaledDotProductAttention, use_attention_kernel
from tconform.reference.multi_head import causal_keep

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]
FILLS = ("-inf", "-1e9")


def padding_mask(batch: int, seq: int, lengths: list[int]) -> torch.Tensor:
    keep = torch.zeros(batch, seq, dtype=torch.bool)
    for b, length in enumerate(lengths):
        keep[b, :length] = True
    return keep[:, None, None, :]


def both_kernels(fill: str, q, k, v, mask) -> tuple[torch.Tensor, torch.Tensor]:
    attention = ScaledDotProductAttention(TINY.replace(mask_fill=fill))
    plain = attention.context(q, k, v, mask)
    use_attention_kernel(attention, "sdpa")
    return plain, attention.context(q, k, v, mask)


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("causal", [False, True])
def test_the_fused_kernel_agrees_on_padding_and_causal_masks(fill, causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    mask = padding_mask(3, 6, [6, 4, 1])  # the third sequence is one real token and padding
    if causal:
        mask = mask & causal_keep(6, q.device)
    plain, fused = both_kernels(fill, q, k, v, mask)
    assert not plain.isnan().any()
    torch.testing.assert_close(fused, plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fill", FILLS)
def test_a_fully_masked_row_is_what_the_plain_kernel_gives(fill):
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    # Sequence 1 is all padding; with the causal mask its rows have no key left at all.
    mask = padding_mask(2, 5, [5, 0]) & causal_keep(5, q.device)
    plain, fused = both_kernels(fill, q, k, v, mask)
    if fill == "-inf":  # softmax over -inf only: 0/0
        assert plain[1].isnan().all()
    else:  # equal weights: the mean of the values
        torch.testing.assert_close(plain[1], v[1].mean(dim=-2, keepdim=True).expand_as(plain[1]))
    torch.testing.assert_close(fused, plain, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_use_attention_kernel_sets_every_attention_and_refuses_unknown_kernels():
    module = use_attention_kernel(MultiHeadAttention(TINY, causal=True), "sdpa")
    kernels = [m.kernel for m in module.modules() if isinstance(m, ScaledDotProductAttention)]
    assert kernels == ["sdpa"]
    with pytest.raises(ValueError, match="unknown attention kernel"):
        use_attention_kernel(module, "flash")
