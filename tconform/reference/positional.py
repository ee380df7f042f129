"""Sinusoidal positional encoding, added to the embeddings.

    PE[pos, 2i]   = sin(pos / base^(2i/d))
    PE[pos, 2i+1] = cos(pos / base^(2i/d))

`pe_formula="doc002_listing"` reproduces doc 002's loop instead, which indexes by the column j
(already even) and so computes sin(pos / base^(2j/d)) and cos(pos / base^(2(j+1)/d)).
"""

import torch
from torch import nn

from tconform.config import ModelConfig


def sinusoid_table(cfg: ModelConfig) -> torch.Tensor:
    """The (max_seq_len, d_model) table in float64."""
    pos = torch.arange(cfg.max_seq_len, dtype=torch.float64)[:, None]
    pair = torch.arange(0, cfg.d_model, 2, dtype=torch.float64)  # 2i, i.e. the even column j
    if cfg.pe_formula == "formula":
        sin_exponent = cos_exponent = pair / cfg.d_model
    else:
        sin_exponent = 2 * pair / cfg.d_model
        cos_exponent = 2 * (pair + 1) / cfg.d_model
    table = torch.empty(cfg.max_seq_len, cfg.d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos / cfg.pe_base**sin_exponent)
    table[:, 1::2] = torch.cos(pos / cfg.pe_base**cos_exponent)
    return table


class PositionalEncoding(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # A constant rebuilt from the config, never loaded; float64 so that module.to(dtype)
        # rounds it once, correctly, to the model's dtype.
        self.register_buffer("table", sinusoid_table(cfg), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table[: x.shape[-2]].to(x.dtype)
