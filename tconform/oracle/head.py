import numpy as np

from tconform.config import ModelConfig
from tconform.oracle.attention import softmax
from tconform.oracle.params import Params, linear, scope


def output_head(params: Params, cfg: ModelConfig, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """logits = x W + b; probabilities = softmax(logits) over the vocabulary."""
    logits = linear(scope(params, "proj"), x)
    return logits, softmax(logits)
