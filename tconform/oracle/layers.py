from collections.abc import Callable

import numpy as np

from tconform.config import ModelConfig
from tconform.oracle.feed_forward import feed_forward
from tconform.oracle.multi_head import multi_head_attention
from tconform.oracle.norm import norm
from tconform.oracle.params import Params, scope


def residual(
    params: Params,
    cfg: ModelConfig,
    x: np.ndarray,
    norm_name: str,
    sublayer: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """pre: x + Sublayer(Norm(x)); post: Norm(x + Sublayer(x))."""
    norm_params = scope(params, norm_name)
    if cfg.placement == "pre":
        return x + sublayer(norm(norm_params, cfg, x))
    return norm(norm_params, cfg, x + sublayer(x))


def encoder_layer(
    params: Params, cfg: ModelConfig, x: np.ndarray, src_keep: np.ndarray
) -> np.ndarray:
    attn = scope(params, "self_attn")
    x = residual(params, cfg, x, "norm1", lambda h: multi_head_attention(attn, cfg, h, h, src_keep))
    return residual(params, cfg, x, "norm2", lambda h: feed_forward(scope(params, "ffn"), cfg, h))


def decoder_layer(
    params: Params,
    cfg: ModelConfig,
    y: np.ndarray,
    memory: np.ndarray,
    src_keep: np.ndarray,
    tgt_keep: np.ndarray,
) -> np.ndarray:
    self_attn, cross_attn = scope(params, "self_attn"), scope(params, "cross_attn")
    y = residual(
        params,
        cfg,
        y,
        "norm1",
        lambda h: multi_head_attention(self_attn, cfg, h, h, tgt_keep, causal=True),
    )
    y = residual(
        params,
        cfg,
        y,
        "norm2",
        lambda h: multi_head_attention(cross_attn, cfg, h, memory, src_keep),
    )
    return residual(params, cfg, y, "norm3", lambda h: feed_forward(scope(params, "ffn"), cfg, h))
