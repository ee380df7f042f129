import numpy as np

from tconform.config import ModelConfig
from tconform.oracle.params import Params, linear, scope


def feed_forward(params: Params, cfg: ModelConfig, x: np.ndarray) -> np.ndarray:
    """FFN(x) = max(0, x W1 + b1) W2 + b2."""
    hidden = np.maximum(0.0, linear(scope(params, "w1"), x))
    return linear(scope(params, "w2"), hidden)
