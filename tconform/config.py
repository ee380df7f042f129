"""Model configuration: dimensions plus every option on which the source documents disagree.

The documents (see docs/design.md, "The documents") describe one architecture in several
incompatible ways. Each disagreement is a named option here, so that every variant can be built,
exported, checked against the oracle and compared with the others, instead of one reading being
silently copied.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Literal, get_args

from tconform.errors import UsageError

Norm = Literal["layernorm", "std"]
Placement = Literal["post", "pre"]
MaskFill = Literal["-inf", "-1e9"]
PositionalFormula = Literal["formula", "doc002_listing"]
DecoderInput = Literal["target", "source"]
# How the exported graph computes attention: an export setting, not a model option, since both
# compute the same function (reference/attention.py; docs/performance.md).
AttentionKernel = Literal["plain", "sdpa"]
ATTENTION_KERNELS: tuple[str, ...] = get_args(AttentionKernel)
# A model's dtype, an export setting (tconform.export.settings.DTYPES says how each is made):
# float16 and bfloat16 trace the module in that type, int8 and int4 quantise the float32 export.
ModelDtype = Literal["float32", "float16", "bfloat16", "int8", "int4"]
MODEL_DTYPES: tuple[str, ...] = get_args(ModelDtype)


@dataclass(frozen=True)
class UserModelOption:
    """An option about a user's model, taken alike by `check`, `bench` and the pytest plugin
    (--tconform-NAME): its flag and help, here so that the plugin declares it without importing
    the command line; the command line gives it its type (tconform.commands.options)."""

    flag: str
    help: str
    metavar: str | None = None
    multiple: bool = False


USER_MODEL_OPTIONS = {
    "inputs": UserModelOption(
        "--inputs",
        "The module's inputs (.npz: arrays named after forward's parameters, or arr_0, arr_1, "
        "...), where the factory returns the module alone.",
        "FILE.npz",
    ),
    "dynamic": UserModelOption(
        "--dynamic",
        "Axes of an input the export keeps free, e.g. ids=0:batch,1:seq (repeatable); the batch "
        "and sequence axes of the others are inferred.",
        "NAME=AXES",
        multiple=True,
    ),
    "model": UserModelOption(
        "--model",
        "Check this ONNX file (made elsewhere, never modified) instead of exporting.",
        "FILE.onnx",
    ),
    "padding_mask": UserModelOption(
        "--padding-mask",
        "An input holding a (batch, sequence) mask, 1 = real token, 0 = padding "
        "(attention_mask): outputs whose leading axes are its shape are compared at real "
        "positions only; the report says how many elements were left out.",
        "INPUT",
    ),
}

# A user's model's dtypes made with a precision plan (tconform check) -> the dtype they are in.
PLANNED_DTYPES = {"float16-planned": "float16", "int8-planned": "int8"}
# The exporters and the opsets each reaches (names and numbers only: the command line offers
# them without importing torch).
EXPORTERS = ("dynamo", "torchscript")
MAX_OPSET = {"dynamo": 23, "torchscript": 20}  # the TorchScript exporter stops at opset 20
OPSETS = tuple(range(17, max(MAX_OPSET.values()) + 1))

# Where each variant option comes from in the documents: the record behind the README's table of
# variant options ("The reference model and its variant options"); tests/test_config.py checks
# that every variant field of ModelConfig has an entry and the README names it.
OPTION_SOURCES: dict[str, str] = {
    "norm": "layernorm: gamma*(x-mean)/sqrt(var+eps)+beta with the biased variance (doc 000's "
    "formula; torch.nn.LayerNorm). std: alpha*(x-mean)/(std+eps)+beta with the unbiased std "
    "and eps outside the root (the code in docs 001 and 002).",
    "placement": "post: x = Norm(x + Sublayer(x)) (docs 000 and 004, the paper's figure). "
    "pre: x = x + Sublayer(Norm(x)) (the code in docs 001 and 002).",
    "final_norm": "a Norm after the last layer of each stack (docs 001 and 002; the paper's "
    "post-norm stacks have none).",
    "attn_bias": "biases in the Q, K, V and output projections (doc 002: nn.Linear with bias; "
    "doc 001: bias=False).",
    "ffn_bias": "biases b1, b2 in max(0, xW1+b1)W2+b2 (docs 000, 002 and 004; doc 001: none).",
    "ffn_mult": "d_ff = ffn_mult * d_model: 4 in the paper and doc 002 (2048 = 4*512); "
    "1 in doc 001 (MLP(dim, dim)).",
    "head_bias": "bias in the output projection to the vocabulary (doc 002: yes; doc 001: no).",
    "embed_scale": "multiply embeddings by sqrt(d_model) (doc 004 and the paper; doc 002 does "
    "it inside its positional encoder; doc 001: no).",
    "mask_fill": "value written into masked attention scores: -inf (doc 001's triu mask) or "
    "-1e9 (doc 002's masked_fill).",
    "pe_base": "base n of the sinusoid wavelengths: 10000 (all formulas) or 100 (doc 001's "
    "printed PositionEncoding(..., n=100) run).",
    "pe_formula": "formula: sin/cos(pos / base^(2i/d)) as printed in every document. "
    "doc002_listing: doc 002's loop, which uses base^(2*j/d) for column j (j already even) and "
    "base^(2*(j+1)/d) for the cosine: a listing that contradicts its own formula.",
    "decoder_input": "target: the decoder reads the embedded target tokens (the paper, docs 002 "
    "and 003). source: doc 001's Transformer.forward, which feeds the decoder the same embedded "
    "source that went into the encoder.",
    "norm_eps": "epsilon of the normalisation (1e-6 in docs 001 and 002).",
}


@dataclass(frozen=True)
class ModelConfig:
    """Dimensions and variant options of the reference encoder-decoder Transformer."""

    src_vocab: int
    tgt_vocab: int
    d_model: int
    n_heads: int
    n_layers: int
    max_seq_len: int
    norm: Norm = "layernorm"
    norm_eps: float = 1e-6
    placement: Placement = "post"
    final_norm: bool = False
    attn_bias: bool = True
    ffn_bias: bool = True
    ffn_mult: int = 4
    head_bias: bool = True
    embed_scale: bool = True
    mask_fill: MaskFill = "-inf"
    pe_base: float = 10000.0
    pe_formula: PositionalFormula = "formula"
    decoder_input: DecoderInput = "target"

    def __post_init__(self) -> None:
        # Values arrive from manifests too: check types and ranges here, once, so a bad value
        # is a usage error naming the field instead of a crash or a "conformance failure".
        for name in ("src_vocab", "tgt_vocab", "d_model", "n_heads", "n_layers", "max_seq_len"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise UsageError(f"config field {name} = {value!r}: a positive integer is needed")
        if type(self.ffn_mult) is not int or self.ffn_mult < 1:
            raise UsageError(f"config field ffn_mult = {self.ffn_mult!r}: a positive integer")
        for name in ("final_norm", "attn_bias", "ffn_bias", "head_bias", "embed_scale"):
            if type(getattr(self, name)) is not bool:
                raise UsageError(f"config field {name} = {getattr(self, name)!r}: true or false")
        for name, field_type in (
            ("norm", Norm),
            ("placement", Placement),
            ("mask_fill", MaskFill),
            ("pe_formula", PositionalFormula),
            ("decoder_input", DecoderInput),
        ):
            allowed = get_args(field_type)
            if getattr(self, name) not in allowed:
                raise UsageError(
                    f"config field {name} = {getattr(self, name)!r}: one of {', '.join(allowed)}"
                )
        for name, positive in (("norm_eps", False), ("pe_base", True)):
            value = getattr(self, name)
            if (
                type(value) not in (int, float)
                or not math.isfinite(value)
                or value < 0
                or (positive and value == 0)
            ):
                need = "a positive number" if positive else "a number >= 0"
                raise UsageError(f"config field {name} = {value!r}: {need}")
        if self.d_model % self.n_heads:
            raise UsageError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")
        if self.d_model % 2:
            raise UsageError(f"d_model {self.d_model} must be even for sin/cos pairs")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_ff(self) -> int:
        return self.ffn_mult * self.d_model

    @property
    def fill_value(self) -> float:
        return float("-inf") if self.mask_fill == "-inf" else -1e9

    def replace(self, **changes: object) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> ModelConfig:
        if not isinstance(data, dict):
            raise UsageError(f"config is {type(data).__name__}, not an object of fields")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        missing -= set(data)
        if missing:
            raise UsageError(f"config fields missing: {', '.join(sorted(missing))}")
        unknown = set(data) - names
        if unknown:
            raise UsageError(f"unknown config fields: {', '.join(sorted(unknown))}")
        return cls(**data)  # type: ignore[arg-type]


# Option sets that reproduce what each document's code does, applied to any dimensions.
VARIANTS: dict[str, dict[str, object]] = {
    "paper": {},
    "doc001": dict(
        norm="std",
        placement="pre",
        final_norm=True,
        attn_bias=False,
        ffn_bias=False,
        ffn_mult=1,
        head_bias=False,
        embed_scale=False,
        mask_fill="-inf",
        decoder_input="source",
    ),
    "doc002": dict(
        norm="std",
        placement="pre",
        final_norm=True,
        attn_bias=True,
        ffn_bias=True,
        ffn_mult=4,
        head_bias=True,
        embed_scale=True,
        mask_fill="-1e9",
        pe_formula="doc002_listing",
    ),
}

_TINY = dict(src_vocab=29, tgt_vocab=31, d_model=16, n_heads=4, n_layers=2, max_seq_len=12)
_BASE = dict(src_vocab=37000, tgt_vocab=37000, d_model=512, n_heads=8, n_layers=6, max_seq_len=256)

PRESETS: dict[str, ModelConfig] = {
    # Small enough that goldens stay tiny and the test suite stays fast.
    "tiny": ModelConfig(**_TINY),
    "tiny-doc001": ModelConfig(**_TINY, **VARIANTS["doc001"]),  # type: ignore[arg-type]
    "tiny-doc002": ModelConfig(**_TINY, **VARIANTS["doc002"]),  # type: ignore[arg-type]
    # "Attention Is All You Need", Table 3: base and big (shared 37000-token BPE vocabulary).
    "base": ModelConfig(**_BASE),
    "big": ModelConfig(**{**_BASE, "d_model": 1024, "n_heads": 16}),
    # The model doc 002 builds and prints: Transformers(5000, 5000, 512, heads=32, N=64).
    "doc002": ModelConfig(
        src_vocab=5000,
        tgt_vocab=5000,
        d_model=512,
        n_heads=32,
        n_layers=64,
        max_seq_len=80,
        **VARIANTS["doc002"],  # type: ignore[arg-type]
    ),
}

DEFAULT_PRESET = "tiny"
DEFAULT_SEED = 20240601  # the seed of the committed goldens
MAX_SEED = 2**32 - 1


SIZES = ("src_vocab", "tgt_vocab", "d_model", "n_heads", "n_layers", "max_seq_len", "ffn_mult")


def beyond_presets(cfg: ModelConfig) -> str | None:
    """What of `cfg` is larger than every preset's (None: nothing). A config read from a manifest
    sizes what a run allocates, so it stays within the presets tconform makes goldens for: a
    crafted d_model of 2**20 is refused, not grown into until memory runs out."""
    for name in SIZES:
        largest = max(getattr(preset, name) for preset in PRESETS.values())
        if getattr(cfg, name) > largest:
            return f"{name} {getattr(cfg, name)} is larger than any preset's ({largest})"
    return None


def get_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None
