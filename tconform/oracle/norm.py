import numpy as np

from tconform.config import ModelConfig
from tconform.oracle.params import Params


def norm(params: Params, cfg: ModelConfig, x: np.ndarray) -> np.ndarray:
    """layernorm: gain*(x-mean)/sqrt(var+eps)+shift, var biased (doc 000's formula).
    std: gain*(x-mean)/(std+eps)+shift, std unbiased (the code in docs 001 and 002)."""
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    if cfg.norm == "layernorm":
        var = (centered**2).mean(axis=-1, keepdims=True)
        normalised = centered / np.sqrt(var + cfg.norm_eps)
    else:
        std = np.sqrt((centered**2).sum(axis=-1, keepdims=True) / (x.shape[-1] - 1))
        normalised = centered / (std + cfg.norm_eps)
    return params["gain"] * normalised + params["shift"]
