"""Export settings and the cache key: what decides an exported model's bytes.

`ExportSettings` is one export's exporter, opset, dtype and attention kernel, each checked against
what the exporters support. `cache_key` hashes them with the case, config and seed, the library
versions and the source of the code that defines the model (the reference modules, the registry,
the weights, the config and the export code itself), so that a model is exported again exactly
when one of them changes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from tconform.config import ATTENTION_KERNELS, ModelConfig
from tconform.errors import UsageError
from tconform.registry import Case
from tconform.versions import library_versions
from tconform.weights import DEFAULT_SEED

EXPORTERS = ("dynamo", "torchscript")
MAX_OPSET = {"dynamo": 23, "torchscript": 20}  # the TorchScript exporter stops at opset 20
OPSETS = tuple(range(17, max(MAX_OPSET.values()) + 1))
DTYPES = {"float32": torch.float32, "float16": torch.float16}
DEFAULT_OPSET = 18
# ONNX's Attention op, which the "sdpa" kernel exports to, exists from opset 23 on; below it
# the exporter spells the fused call out as MatMul, Softmax, Where, ... again.
ATTENTION_OPSET = 23


def default_opset(attention: str) -> int:
    return ATTENTION_OPSET if attention == "sdpa" else DEFAULT_OPSET


# The source files whose text decides what a case exports.
_PACKAGE = Path(__file__).parents[1]
_MODEL_SOURCES = sorted(
    [
        *(_PACKAGE / "reference").glob("*.py"),
        _PACKAGE / "registry.py",
        _PACKAGE / "weights.py",
        _PACKAGE / "config.py",
        _PACKAGE / "export" / "settings.py",
        _PACKAGE / "export" / "exporter.py",
    ]
)


@dataclass(frozen=True)
class ExportSettings:
    cfg: ModelConfig
    seed: int = DEFAULT_SEED
    exporter: str = "dynamo"
    opset: int = DEFAULT_OPSET
    dtype: str = "float32"
    attention: str = "plain"  # one of ATTENTION_KERNELS (reference/attention.py)

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise UsageError(
                f"unknown exporter {self.exporter!r}; choose from {', '.join(EXPORTERS)}"
            )
        if self.dtype not in DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}; choose from {', '.join(DTYPES)}")
        if self.attention not in ATTENTION_KERNELS:
            raise UsageError(
                f"unknown attention kernel {self.attention!r}; "
                f"choose from {', '.join(ATTENTION_KERNELS)}"
            )
        if self.attention == "sdpa" and self.exporter != "dynamo":
            raise UsageError("--attention sdpa needs the dynamo exporter (ONNX Attention op)")
        top = MAX_OPSET[self.exporter]
        if not OPSETS[0] <= self.opset <= top:
            raise UsageError(
                f"opset {self.opset} out of range for {self.exporter}: {OPSETS[0]}..{top}"
            )


def _source_digest() -> str:
    h = hashlib.sha256()
    for path in _MODEL_SOURCES:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cache_key(case: Case, settings: ExportSettings) -> str:
    blob = json.dumps(
        {
            "case": case.name,
            "config": settings.cfg.to_dict(),
            "seed": settings.seed,
            "exporter": settings.exporter,
            "opset": settings.opset,
            "dtype": settings.dtype,
            "attention": settings.attention,
            "versions": {k: v for k, v in library_versions().items() if k != "python"},
            "source": _source_digest(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()
