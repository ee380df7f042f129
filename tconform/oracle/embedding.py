import math

import numpy as np

from tconform.config import ModelConfig
from tconform.oracle.params import Params


def token_embedding(params: Params, cfg: ModelConfig, ids: np.ndarray) -> np.ndarray:
    """Embedding(i) = E[i], times sqrt(d_model) when the variant scales embeddings."""
    scale = math.sqrt(cfg.d_model) if cfg.embed_scale else 1.0
    return params["table"][ids] * scale
