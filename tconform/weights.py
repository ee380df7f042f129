"""Deterministic parameters, drawn with NumPy from a seed and each parameter's name, or read
from a committed trained checkpoint.

Each parameter has its own generator, seeded by (seed, crc32(name)), so adding a parameter never
changes the others. Values are rounded to float32 first: the float64 oracle then computes with
exactly the weights a float32 model holds, so the golden is the exact answer for that model.

Trained checkpoints (tconform/data/checkpoints/<name>.npz with <name>.json: config, task,
training record, sha256; made by scripts/train_checkpoint.py, scored by
tconform.studies.checkpoints)
hold float32 arrays keyed by the Transformer's parameter names, which the generation models
share: `checkpoint_params` gives any module whose names they cover its trained weights.
"""

from __future__ import annotations

import io
import json
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tconform.config import DEFAULT_SEED, ModelConfig
from tconform.errors import UsageError
from tconform.files import sha256_bytes

CHECKPOINTS = Path(__file__).parent / "data" / "checkpoints"

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


def available(folder: Path = CHECKPOINTS) -> list[str]:
    """The names of the checkpoints `folder` holds (tconform's own by default)."""
    return sorted(p.stem for p in folder.glob("*.json") if p.is_file() and not p.is_symlink())


def read_record(name: str, folder: Path = CHECKPOINTS) -> dict:
    """The JSON record of checkpoint `name`, one of those `folder` holds. A name read from a
    manifest is looked up among them, never used as a path (an absolute or `../` name would
    read any .json and .npz on the machine as weights)."""
    known = available(folder)
    if not isinstance(name, str) or name not in known:
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:80] + "..."
        raise UsageError(f"unknown checkpoint {shown}; available: {', '.join(known) or 'none'}")
    return json.loads((folder / f"{name}.json").read_text())


def load_checkpoint(
    name: str, folder: Path = CHECKPOINTS
) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """(config, params) of a committed checkpoint; params as make_params gives them (float64
    arrays of float32 values), after checking the .npz against its sha256."""
    record = read_record(name, folder)
    path = folder / f"{name}.npz"
    if not path.is_file():
        raise UsageError(f"{path.name}: missing beside {name}.json")
    data = path.read_bytes()
    if sha256_bytes(data) != record["sha256"]:
        raise UsageError(f"{path.name}: sha256 does not match {name}.json (corrupt or replaced)")
    with np.load(io.BytesIO(data)) as archive:
        params = {key: archive[key].astype(np.float64) for key in archive.files}
    return ModelConfig.from_dict(record["config"]), params


def same_weights_config(trained: ModelConfig, cfg: ModelConfig) -> bool:
    """Whether weights trained at `trained` are the same model at `cfg`: the same config but
    for the mask fill, which decides only a fully masked attention row (-inf: NaN, -1e9:
    uniform); a row with a key left gives every masked key weight exactly 0 under both."""
    return trained.replace(mask_fill=cfg.mask_fill) == cfg


def checkpoint_params(
    module: nn.Module, name: str, cfg: ModelConfig | None = None
) -> dict[str, np.ndarray]:
    """`module`'s parameters from checkpoint `name` (every one must be there); with `cfg`, the
    checkpoint must have been trained at that config (its mask fill aside: same_weights_config)."""
    trained_cfg, params = load_checkpoint(name)
    if cfg is not None and not same_weights_config(trained_cfg, cfg):
        raise UsageError(
            f"checkpoint {name!r} was trained at another config ({trained_cfg.to_dict()})"
        )
    missing = [n for n, _ in module.named_parameters() if n not in params]
    if missing:
        raise UsageError(
            f"checkpoint {name!r} holds no parameter {missing[0]!r} (it holds the whole "
            "Transformer's: the transformer case and the generation models take it)"
        )
    return {n: params[n] for n, _ in module.named_parameters()}
