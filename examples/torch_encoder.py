"""PyTorch's own nn.TransformerEncoder, as a user would take it off the shelf.

Two details matter when its outputs are compared element by element:
- `enable_nested_tensor=False`: by default the encoder packs padded batches into a nested tensor
  and writes 0 at padded positions, which no exported graph reproduces;
- the key-padding mask means True = ignore this position (nn.MultiheadAttention's convention).
"""

from __future__ import annotations

import torch
from torch import nn

D_MODEL, HEADS, D_FF, LAYERS = 32, 4, 64, 3


def make() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A 3-layer post-norm encoder with a final LayerNorm, and a padded batch of two."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.1, batch_first=True)
        encoder = nn.TransformerEncoder(
            layer, LAYERS, norm=nn.LayerNorm(D_MODEL), enable_nested_tensor=False
        )
        # nn.TransformerEncoder deep-copies one layer, so fresh layers are identical; nudge
        # every weight, as training would, so that each layer (and norm gain) is its own.
        with torch.no_grad():
            for parameter in encoder.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        src = torch.randn(2, 7, D_MODEL)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, 4:] = True  # the second sequence has 4 real tokens
    return encoder.eval(), {"src": src, "src_key_padding_mask": padding}
