import math

import numpy as np


def softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(z_i) / sum_j exp(z_j), shifted by the row maximum so that exp cannot overflow."""
    shifted = np.exp(z - z.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)


def scaled_dot_product_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    fill: float = float("-inf"),
) -> tuple[np.ndarray, np.ndarray]:
    """softmax(Q K^T / sqrt(d_k)) V; returns (output, weights).

    mask is boolean, broadcast to the scores; where it is False the score becomes `fill`.
    """
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, fill)
    weights = softmax(scores)
    return weights @ v, weights
