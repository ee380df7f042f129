"""Encoder and decoder stacks: N layers, then a final norm where the variant has one."""

import torch
from torch import nn

from tconform.config import ModelConfig
from tconform.reference.layers import DecoderLayer, EncoderLayer
from tconform.reference.norm import Norm


class Encoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.final_norm = Norm(cfg) if cfg.final_norm else None

    def forward(self, x: torch.Tensor, src_keep: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, src_keep)
        return self.final_norm(x) if self.final_norm is not None else x


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.final_norm = Norm(cfg) if cfg.final_norm else None

    def forward(
        self,
        y: torch.Tensor,
        memory: torch.Tensor,
        src_keep: torch.Tensor,
        tgt_keep: torch.Tensor,
    ) -> torch.Tensor:
        for layer in self.layers:
            y = layer(y, memory, src_keep, tgt_keep)
        return self.final_norm(y) if self.final_norm is not None else y
