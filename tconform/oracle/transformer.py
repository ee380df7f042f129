import numpy as np

from tconform.config import ModelConfig
from tconform.oracle.embedding import token_embedding
from tconform.oracle.head import output_head
from tconform.oracle.params import Params, scope
from tconform.oracle.positional import positional_encoding
from tconform.oracle.stacks import decoder, encoder


def transformer(
    params: Params,
    cfg: ModelConfig,
    src_ids: np.ndarray,
    src_keep: np.ndarray,
    tgt_ids: np.ndarray | None = None,
    tgt_keep: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Embed + PE -> encoder -> decoder (reading the target, or the source in doc 001) -> head."""
    x = positional_encoding({}, cfg, token_embedding(scope(params, "src_embed"), cfg, src_ids))
    memory = encoder(scope(params, "encoder"), cfg, x, src_keep)
    if cfg.decoder_input == "source":
        y, tgt_keep = x, src_keep
    else:
        y = positional_encoding({}, cfg, token_embedding(scope(params, "tgt_embed"), cfg, tgt_ids))
    return output_head(
        scope(params, "head"),
        cfg,
        decoder(scope(params, "decoder"), cfg, y, memory, src_keep, tgt_keep),
    )
