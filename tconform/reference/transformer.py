"""The whole encoder-decoder model: token ids and padding masks in, logits and probabilities out."""

import torch
from torch import nn

from tconform.config import ModelConfig
from tconform.reference.embedding import TokenEmbedding
from tconform.reference.head import OutputHead
from tconform.reference.positional import PositionalEncoding
from tconform.reference.stacks import Decoder, Encoder


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.decoder_reads_source = cfg.decoder_input == "source"
        self.src_embed = TokenEmbedding(cfg, cfg.src_vocab)
        # doc 001's variant feeds the decoder the embedded source, so it has no target embedding.
        self.tgt_embed = None if self.decoder_reads_source else TokenEmbedding(cfg, cfg.tgt_vocab)
        self.positional = PositionalEncoding(cfg)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.head = OutputHead(cfg)

    def forward(
        self,
        src_ids: torch.Tensor,
        src_keep: torch.Tensor,
        tgt_ids: torch.Tensor | None = None,
        tgt_keep: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.positional(self.src_embed(src_ids))
        memory = self.encoder(x, src_keep)
        if self.tgt_embed is None:
            y, tgt_keep = x, src_keep
        else:
            y = self.positional(self.tgt_embed(tgt_ids))
        return self.head(self.decoder(y, memory, src_keep, tgt_keep))
