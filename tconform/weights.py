"""Deterministic parameters, drawn with NumPy from a seed and each parameter's name.

Each parameter has its own generator, seeded by (seed, crc32(name)), so adding a parameter never
changes the others. Values are rounded to float32 first: the float64 oracle then computes with
exactly the weights a float32 model holds, so the golden is the exact answer for that model.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch import nn

from tconform.config import DEFAULT_SEED

Rule = Callable[[tuple[int, ...], np.random.Generator], np.ndarray]


def _default_draw(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "table":  # embedding rows: unit scale, as the sqrt(d) scaling expects
        return rng.normal(0.0, 1.0, shape)
    if len(shape) >= 2:  # a matrix (Linear: out, in): keeps activations near unit scale
        return rng.normal(0.0, 1.0 / np.sqrt(np.prod(shape[1:])), shape)
    if leaf in ("gain", "weight"):  # a norm's scale, away from 1 so that a dropped gain shows
        return 1.0 + rng.normal(0.0, 0.1, shape)
    return rng.normal(0.0, 0.1, shape)  # biases and shifts, away from 0 so a dropped one shows


def make_params(
    module: nn.Module, seed: int = DEFAULT_SEED, rules: Mapping[str, Rule] | None = None
) -> dict[str, np.ndarray]:
    """float64 arrays holding float32-representable values, keyed by parameter name. `rules`
    (a case's own, by the parameter's last name part) come before the defaults."""
    params = {}
    for name, p in module.named_parameters():
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        shape = tuple(p.shape)
        rule = (rules or {}).get(name.rsplit(".", 1)[-1])
        value = rule(shape, rng) if rule else _default_draw(name, shape, rng)
        params[name] = np.asarray(value, dtype=np.float32).astype(np.float64)
    return params


def load_params(module: nn.Module, params: dict[str, np.ndarray]) -> nn.Module:
    """Copy `params` into `module` in the module's own dtype; every parameter must be given."""
    state = {name: torch.from_numpy(value) for name, value in params.items()}
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(state[name].to(p.dtype))
    return module.eval()
