"""BERT built from a config, as a user brings it: transformers' BertModel with random weights
(nothing is downloaded), called with keyword inputs on a right-padded batch; its output is a
ModelOutput (last_hidden_state, pooler_output), checked as it is.

    pip install transformers
    tconform check examples.bert:make
"""

from __future__ import annotations

import torch
from transformers import BertConfig, BertModel


def make() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    model = BertModel(config).eval()
    input_ids = torch.randint(3, config.vocab_size, (2, 16))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 10:] = 0  # the second sentence is 10 tokens, then padding
    input_ids[attention_mask == 0] = config.pad_token_id
    return model, {"input_ids": input_ids, "attention_mask": attention_mask}
