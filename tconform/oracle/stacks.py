import numpy as np

from tconform.config import ModelConfig
from tconform.oracle.layers import decoder_layer, encoder_layer
from tconform.oracle.norm import norm
from tconform.oracle.params import Params, scope


def encoder(params: Params, cfg: ModelConfig, x: np.ndarray, src_keep: np.ndarray) -> np.ndarray:
    for i in range(cfg.n_layers):
        x = encoder_layer(scope(params, f"layers.{i}"), cfg, x, src_keep)
    return norm(scope(params, "final_norm"), cfg, x) if cfg.final_norm else x


def decoder(
    params: Params,
    cfg: ModelConfig,
    y: np.ndarray,
    memory: np.ndarray,
    src_keep: np.ndarray,
    tgt_keep: np.ndarray,
) -> np.ndarray:
    for i in range(cfg.n_layers):
        y = decoder_layer(scope(params, f"layers.{i}"), cfg, y, memory, src_keep, tgt_keep)
    return norm(scope(params, "final_norm"), cfg, y) if cfg.final_norm else y
