import numpy as np

from tconform.config import ModelConfig
from tconform.oracle.params import Params


def sinusoid_table(
    length: int, d_model: int, base: float = 10000.0, formula: str = "formula"
) -> np.ndarray:
    """PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(pos / base^(2i/d)).

    formula="doc002_listing" evaluates doc 002's loop literally: for even column j it uses
    sin(pos / base^(2j/d)) and cos(pos / base^(2(j+1)/d)).
    """
    table = np.empty((length, d_model))
    for pos in range(length):
        for i in range(d_model // 2):
            if formula == "formula":
                sin_angle = cos_angle = pos / base ** (2 * i / d_model)
            else:
                j = 2 * i
                sin_angle = pos / base ** (2 * j / d_model)
                cos_angle = pos / base ** (2 * (j + 1) / d_model)
            table[pos, 2 * i] = np.sin(sin_angle)
            table[pos, 2 * i + 1] = np.cos(cos_angle)
    return table


def positional_encoding(params: Params, cfg: ModelConfig, x: np.ndarray) -> np.ndarray:
    """X + PE for the first seq positions."""
    length = x.shape[-2]
    return x + sinusoid_table(length, cfg.d_model, cfg.pe_base, cfg.pe_formula)
