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

from tconform.config import (
    ATTENTION_KERNELS,
    EXPORTERS,
    MAX_OPSET,
    MODEL_DTYPES,
    OPSETS,
    ModelConfig,
)
from tconform.errors import UsageError
from tconform.registry import Case
from tconform.versions import library_versions
from tconform.weights import DEFAULT_SEED, read_record, same_weights_config

# A model's dtype -> the torch dtype its module is traced in. float16 and bfloat16 are the
# module in that type (weights, activations, inputs and outputs: what `module.to(dtype)` and
# torch.onnx.export give a user); int8 is the float32 export quantised by ONNX Runtime's
# quantisation tool (`quantize_dynamic`: int8 weights, activations quantised at run time;
# the settings below), its inputs and outputs float32; int4 is the float32 export's weights in
# 4-bit blocks by ONNX Runtime's weight-only quantiser (MatMulNBits), inputs and outputs float32.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.float32,
    "int4": torch.float32,
}
assert tuple(DTYPES) == MODEL_DTYPES  # the command line offers config's names
# What each dtype's inputs and outputs are (the goldens are fed and compared at that type).
IO_DTYPES = {
    "float32": "float32",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "int8": "float32",
    "int4": "float32",
}
# onnxruntime.quantization.quantize_dynamic's arguments for the int8 dtype (part of the cache
# key). reduce_range: 7-bit weights. ONNX Runtime's x86 int8 kernels multiply uint8 activations
# by int8 weights with VPMADDUBSW, whose int16 pair sums saturate on CPUs without VNNI (AVX2:
# this project's EPYC): with full-range weights the tiny preset's attention lost up to 20 dB of
# SQNR to saturation (docs/tolerances.md). 7-bit weights cannot saturate, so the same graph
# computes the same numbers on every x86 CPU, and the int8 row holds on all of them.
# per_channel: one scale per output column, which 7-bit weights need to keep their resolution.
INT8_QUANTIZATION = {"weight_type": "QInt8", "per_channel": True, "reduce_range": True}
# onnxruntime.quantization.matmul_nbits_quantizer's settings for the int4 dtype (part of the
# cache key): what ONNX Runtime GenAI's model builder writes for the CPU. Every MatMul with a
# weight becomes MatMulNBits: 4-bit weights in blocks of 32 along the reduction, one float32
# scale per block (symmetric: no zero point); accuracy_level 4 lets the CPU kernel quantise the
# activations to int8 per block and multiply in integers (MLAS's fast path; level 0 would
# dequantise the weights and multiply in float32). Embedding tables (Gather) stay float32.
INT4_QUANTIZATION = {
    "tool": "MatMulNBitsQuantizer",
    "bits": 4,
    "block_size": 32,
    "is_symmetric": True,
    "accuracy_level": 4,
}
# The dtypes made by quantising the float32 export, with the quantiser's settings.
QUANTIZATIONS = {"int8": INT8_QUANTIZATION, "int4": INT4_QUANTIZATION}
DEFAULT_OPSET = 18
# ONNX's Attention op, which the "sdpa" kernel exports to, exists from opset 23 on; below it
# the exporter spells the fused call out as MatMul, Softmax, Where, ... again.
ATTENTION_OPSET = 23


def default_opset(attention: str) -> int:
    return ATTENTION_OPSET if attention == "sdpa" else DEFAULT_OPSET


# The source files whose text decides what a case exports, and what its record says it
# computes in (provenance.py's rule: a record made under an older rule is made again).
_PACKAGE = Path(__file__).parents[1]
_MODEL_SOURCES = sorted(
    [
        *(_PACKAGE / "reference").glob("*.py"),
        _PACKAGE / "provenance.py",
        _PACKAGE / "registry.py",
        _PACKAGE / "weights.py",
        _PACKAGE / "config.py",
        _PACKAGE / "export" / "settings.py",
        _PACKAGE / "export" / "exporter.py",
        _PACKAGE / "export" / "quantize.py",
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
    # a committed trained checkpoint's weights (tconform.weights) instead of the seeded ones
    checkpoint: str = ""

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
        if self.checkpoint:
            trained = ModelConfig.from_dict(read_record(self.checkpoint)["config"])
            if not same_weights_config(trained, self.cfg):
                raise UsageError(
                    f"checkpoint {self.checkpoint!r} was trained at another config than this "
                    "export's"
                )
        top = MAX_OPSET[self.exporter]
        if not OPSETS[0] <= self.opset <= top:
            raise UsageError(
                f"opset {self.opset} out of range for {self.exporter}: {OPSETS[0]}..{top}"
            )


def quantization(dtype: str) -> dict[str, object] | None:
    """The quantisation a dtype's models are made with (None: none, the module's own type)."""
    return dict(QUANTIZATIONS[dtype]) if dtype in QUANTIZATIONS else None


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
    if settings.dtype in QUANTIZATIONS:  # the quantiser's settings decide the bytes too
        blob += json.dumps(quantization(settings.dtype), sort_keys=True)
    if settings.checkpoint:  # the trained weights, by their recorded sha256
        blob += f"checkpoint {settings.checkpoint} {read_record(settings.checkpoint)['sha256']}"
    return hashlib.sha256(blob.encode()).hexdigest()
