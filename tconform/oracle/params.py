"""Parameters as a flat mapping of dotted names (the reference modules' names) to arrays."""

from collections.abc import Mapping

import numpy as np

Params = Mapping[str, np.ndarray]


def scope(params: Params, prefix: str) -> dict[str, np.ndarray]:
    """The parameters under `prefix.`, with the prefix removed."""
    head = prefix + "."
    return {name[len(head) :]: value for name, value in params.items() if name.startswith(head)}


def linear(params: Params, x: np.ndarray) -> np.ndarray:
    """x W^T + b, with W stored (out, in) as the reference stores it; b may be absent."""
    y = x @ params["weight"].T
    return y + params["bias"] if "bias" in params else y
