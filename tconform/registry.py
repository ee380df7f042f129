"""The component registry: the one list of what tconform exports, checks and times.

Each case names a torch module factory, the oracle function that computes the same thing in
float64, its inputs and outputs (with symbolic axes, from which dynamic ONNX axes and example
inputs are derived), its tolerance class, its matrix-multiply FLOP count (bench's ceiling share)
and any weight-initialisation rule of its own. export, golden, verify, bench and the tests all
iterate over `CASES`; adding a component is one entry here (docs/design.md has the checklist).
`GENERATION_CASES` are the three models of incremental decoding (tconform.generation), cases
too, so that export handles them like every other model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from tconform import costs, oracle, reference, weights
from tconform.config import ModelConfig
from tconform.errors import UsageError
from tconform.oracle import Params, scope
from tconform.oracle import incremental as oracle_incremental
from tconform.reference import incremental as reference_incremental

# Axes that vary between input sets and stay dynamic in the exported models.
DYNAMIC_AXES = ("batch", "src_seq", "tgt_seq", "past_seq")


@dataclass(frozen=True)
class TensorSpec:
    """A named tensor with symbolic axes. kind says how example data is drawn:
    float, src_ids, tgt_ids, src_keep, tgt_keep (padding masks), attn_mask or position (the
    position of a decoding step's new token, one per sequence)."""

    name: str
    axes: tuple[str, ...]
    kind: str = "float"


@dataclass(frozen=True)
class Shape:
    batch: int
    src_seq: int
    tgt_seq: int

    def resolve(self, axes: tuple[str, ...], cfg: ModelConfig) -> tuple[int, ...]:
        sizes = {
            "batch": self.batch,
            "src_seq": self.src_seq,
            "tgt_seq": self.tgt_seq,
            "heads": cfg.n_heads,
            "d_head": cfg.d_head,
            "d_model": cfg.d_model,
            "src_vocab": cfg.src_vocab,
            "tgt_vocab": cfg.tgt_vocab,
            "layers": cfg.n_layers,
            "past_seq": self.tgt_seq,  # a decoding step's cache holds tgt_seq earlier positions
            "one": 1,
        }
        return tuple(sizes[a] for a in axes)


@dataclass(frozen=True)
class Case:
    name: str
    component: str
    build: Callable[[ModelConfig], nn.Module]
    oracle: Callable[..., tuple[np.ndarray, ...]]
    inputs: Callable[[ModelConfig], tuple[TensorSpec, ...]]
    outputs: Callable[[ModelConfig], tuple[TensorSpec, ...]]
    tolerance: str  # a row of tconform.compare.TOLERANCES
    # Matrix-multiply FLOP of one forward pass, from the config (tconform/costs.py); None: torch's
    # FlopCounterMode counts them on the reference module.
    flops: Callable[[ModelConfig, Shape], int] | None = None
    # Initialisation rules for this case's own parameters, by the parameter's last name part,
    # ahead of the defaults in tconform/weights.py: leaf -> (shape, rng) -> float64 array.
    weight_init: Mapping[str, Callable[[tuple[int, ...], np.random.Generator], np.ndarray]] = field(
        default_factory=dict,
        hash=False,  # a case is hashed by its other fields
    )

    def make_params(self, cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
        """The case's deterministic float32-representable weights (tconform/weights.py)."""
        return weights.make_params(self.build(cfg), seed, self.weight_init)

    def flop_count(self, cfg: ModelConfig, shape: Shape) -> int:
        """Matrix-multiply FLOP of one forward pass at `shape`."""
        if self.flops is not None:
            return self.flops(cfg, shape)
        from torch.utils.flop_counter import FlopCounterMode

        with torch.device("meta"):  # counts shapes only: no memory, no arithmetic
            module = self.build(cfg).eval()
            args = [
                torch.empty(shape.resolve(s.axes, cfg), dtype=_META_DTYPES.get(s.kind, torch.bool))
                for s in self.inputs(cfg)
            ]
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                module(*args)
        return counter.get_total_flops()

    def parameter_shapes(self, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every learned parameter, from the module built without memory."""
        with torch.device("meta"):
            return {n: tuple(p.shape) for n, p in self.build(cfg).named_parameters()}

    def weight_bytes_read(self, cfg: ModelConfig, shape: Shape) -> int:
        """float32 weight bytes one forward pass must read from memory (the memory floor): every
        parameter, except that of an embedding table (leaf `table`) only the gathered rows,
        at most one per token."""
        tokens = shape.batch * max(shape.src_seq, shape.tgt_seq)
        count = 0
        for name, dims in self.parameter_shapes(cfg).items():
            if name.rsplit(".", 1)[-1] == "table":
                rows, width = dims
                count += min(rows, tokens) * width
            else:
                count += int(np.prod(dims, dtype=np.int64))
        return count * FLOAT32_BYTES


FLOAT32_BYTES = 4
_META_DTYPES = {"float": torch.float32, "src_ids": torch.int64, "tgt_ids": torch.int64}


def _fixed(*specs: TensorSpec) -> Callable[[ModelConfig], tuple[TensorSpec, ...]]:
    return lambda cfg: specs


X_SRC = TensorSpec("x", ("batch", "src_seq", "d_model"))
Y_TGT = TensorSpec("y", ("batch", "tgt_seq", "d_model"))
MEMORY = TensorSpec("memory", ("batch", "src_seq", "d_model"))
SRC_KEEP = TensorSpec("src_keep", ("batch", "src_seq"), "src_keep")
TGT_KEEP = TensorSpec("tgt_keep", ("batch", "tgt_seq"), "tgt_keep")
SRC_IDS = TensorSpec("src_ids", ("batch", "src_seq"), "src_ids")
TGT_IDS = TensorSpec("tgt_ids", ("batch", "tgt_seq"), "tgt_ids")
OUT_SRC = TensorSpec("out", ("batch", "src_seq", "d_model"))
OUT_TGT = TensorSpec("out", ("batch", "tgt_seq", "d_model"))
LOGITS = TensorSpec("logits", ("batch", "tgt_seq", "tgt_vocab"))
PROBS = TensorSpec("probs", ("batch", "tgt_seq", "tgt_vocab"))


def _transformer_inputs(cfg: ModelConfig) -> tuple[TensorSpec, ...]:
    if cfg.decoder_input == "source":  # doc 001: the decoder reads the source, no target input
        return (SRC_IDS, SRC_KEEP)
    return (SRC_IDS, SRC_KEEP, TGT_IDS, TGT_KEEP)


def _transformer_outputs(cfg: ModelConfig) -> tuple[TensorSpec, ...]:
    if cfg.decoder_input == "source":  # the outputs then follow the source length
        return tuple(TensorSpec(o.name, ("batch", "src_seq", "tgt_vocab")) for o in (LOGITS, PROBS))
    return (LOGITS, PROBS)


def _no_matmuls(cfg: ModelConfig, shape: Shape) -> int:
    return 0


def _tupled(function: Callable, call: Callable | None = None) -> Callable:
    """A case's oracle: `call(p, cfg, *inputs)` (default: the function itself), its outputs as
    a tuple, named after the oracle `function` it computes with, so that provenance names
    what ran."""

    def run(p, cfg, *inputs):
        out = (call or function)(p, cfg, *inputs)
        return out if isinstance(out, tuple) else (out,)

    return functools.update_wrapper(run, function)


CASES: tuple[Case, ...] = (
    Case(
        "embedding",
        "token embedding",
        lambda cfg: reference.TokenEmbedding(cfg, cfg.src_vocab),
        _tupled(oracle.token_embedding),
        _fixed(SRC_IDS),
        _fixed(OUT_SRC),
        "component",
        flops=_no_matmuls,
    ),
    Case(
        "positional_encoding",
        "sinusoidal positional encoding",
        reference.PositionalEncoding,
        _tupled(oracle.positional_encoding),
        _fixed(X_SRC),
        _fixed(OUT_SRC),
        "component",
        flops=_no_matmuls,
    ),
    Case(
        "attention",
        "scaled dot-product attention",
        reference.ScaledDotProductAttention,
        _tupled(
            oracle.scaled_dot_product_attention,
            lambda p, cfg, q, k, v, mask: oracle.scaled_dot_product_attention(
                q, k, v, mask, cfg.fill_value
            ),
        ),
        _fixed(
            TensorSpec("q", ("batch", "heads", "tgt_seq", "d_head")),
            TensorSpec("k", ("batch", "heads", "src_seq", "d_head")),
            TensorSpec("v", ("batch", "heads", "src_seq", "d_head")),
            TensorSpec("mask", ("batch", "heads", "tgt_seq", "src_seq"), "attn_mask"),
        ),
        _fixed(
            TensorSpec("out", ("batch", "heads", "tgt_seq", "d_head")),
            TensorSpec("weights", ("batch", "heads", "tgt_seq", "src_seq")),
        ),
        "component",
        flops=lambda cfg, s: 2 * (2 * s.batch * s.tgt_seq * s.src_seq * cfg.d_model),
    ),
    Case(
        "mha_self",
        "multi-head self-attention with padding mask",
        reference.SelfAttention,
        _tupled(
            oracle.multi_head_attention,
            lambda p, cfg, x, keep: oracle.multi_head_attention(scope(p, "attn"), cfg, x, x, keep),
        ),
        _fixed(X_SRC, SRC_KEEP),
        _fixed(OUT_SRC),
        "component",
        flops=lambda cfg, s: costs.attention_flops(cfg, s.batch, s.src_seq, s.src_seq),
    ),
    Case(
        "mha_causal",
        "masked (causal) multi-head self-attention with padding mask",
        lambda cfg: reference.SelfAttention(cfg, causal=True),
        _tupled(
            oracle.multi_head_attention,
            lambda p, cfg, y, keep: oracle.multi_head_attention(
                scope(p, "attn"), cfg, y, y, keep, causal=True
            ),
        ),
        _fixed(Y_TGT, TGT_KEEP),
        _fixed(OUT_TGT),
        "component",
        flops=lambda cfg, s: costs.attention_flops(cfg, s.batch, s.tgt_seq, s.tgt_seq),
    ),
    Case(
        "mha_cross",
        "encoder-decoder (cross) multi-head attention",
        reference.MultiHeadAttention,
        _tupled(oracle.multi_head_attention),
        _fixed(Y_TGT, MEMORY, SRC_KEEP),
        _fixed(OUT_TGT),
        "component",
        flops=lambda cfg, s: costs.attention_flops(cfg, s.batch, s.tgt_seq, s.src_seq),
    ),
    Case(
        "feed_forward",
        "position-wise feed-forward",
        reference.FeedForward,
        _tupled(oracle.feed_forward),
        _fixed(X_SRC),
        _fixed(OUT_SRC),
        "component",
        flops=lambda cfg, s: costs.feed_forward_flops(cfg, s.batch, s.src_seq),
    ),
    Case(
        "norm",
        "normalisation (layernorm or std variant)",
        reference.Norm,
        _tupled(oracle.norm),
        _fixed(X_SRC),
        _fixed(OUT_SRC),
        "component",
        flops=_no_matmuls,
    ),
    Case(
        "encoder_layer",
        "encoder layer",
        reference.EncoderLayer,
        _tupled(oracle.encoder_layer),
        _fixed(X_SRC, SRC_KEEP),
        _fixed(OUT_SRC),
        "layer",
        flops=lambda cfg, s: costs.encoder_layer_flops(cfg, s.batch, s.src_seq),
    ),
    Case(
        "decoder_layer",
        "decoder layer",
        reference.DecoderLayer,
        _tupled(oracle.decoder_layer),
        _fixed(Y_TGT, MEMORY, SRC_KEEP, TGT_KEEP),
        _fixed(OUT_TGT),
        "layer",
        flops=lambda cfg, s: costs.decoder_layer_flops(cfg, s.batch, s.src_seq, s.tgt_seq),
    ),
    Case(
        "encoder",
        "encoder stack",
        reference.Encoder,
        _tupled(oracle.encoder),
        _fixed(X_SRC, SRC_KEEP),
        _fixed(OUT_SRC),
        "stack",
        flops=lambda cfg, s: cfg.n_layers * costs.encoder_layer_flops(cfg, s.batch, s.src_seq),
    ),
    Case(
        "decoder",
        "decoder stack",
        reference.Decoder,
        _tupled(oracle.decoder),
        _fixed(Y_TGT, MEMORY, SRC_KEEP, TGT_KEEP),
        _fixed(OUT_TGT),
        "stack",
        flops=lambda cfg, s: (
            cfg.n_layers * costs.decoder_layer_flops(cfg, s.batch, s.src_seq, s.tgt_seq)
        ),
    ),
    Case(
        "output_head",
        "output head (linear + softmax)",
        reference.OutputHead,
        _tupled(oracle.output_head),
        _fixed(Y_TGT),
        _fixed(LOGITS, PROBS),
        "component",
        flops=lambda cfg, s: costs.head_flops(cfg, s.batch, s.tgt_seq),
    ),
    Case(
        "transformer",
        "whole encoder-decoder model",
        reference.Transformer,
        _tupled(oracle.transformer),
        _transformer_inputs,
        _transformer_outputs,
        "model",
        flops=lambda cfg, s: costs.transformer_flops(cfg, s.batch, s.src_seq, s.tgt_seq),
    ),
)


# --- the models of incremental decoding ----------------------------------------------------
# Not in CASES: they have no per-component goldens; the generation goldens
# (tconform.generation.golden) check them through whole decoded sequences instead. They are
# cases so that the export machinery (cache keys, manifest, checker, workers) handles them like
# every other model.

CACHE_AXES = ("layers", "batch", "heads", "past_seq", "d_head")
CROSS_AXES = ("layers", "batch", "heads", "src_seq", "d_head")
LOG_PROBS = TensorSpec("log_probs", ("batch", "one", "tgt_vocab"))

ENCODER = Case(
    "gen_encoder",
    "encoder for generation: memory and every layer's cross-attention keys/values",
    reference_incremental.EncoderModel,
    oracle_incremental.encode,
    _fixed(SRC_IDS, SRC_KEEP),
    _fixed(
        TensorSpec("memory", ("batch", "src_seq", "d_model")),
        TensorSpec("cross_k", CROSS_AXES),
        TensorSpec("cross_v", CROSS_AXES),
    ),
    "model",
)

STEP = Case(
    "gen_step",
    "decoder step with a key/value cache",
    reference_incremental.DecoderStepModel,
    oracle_incremental.decoder_step,
    _fixed(
        TensorSpec("tgt_ids", ("batch", "one"), "tgt_ids"),
        TensorSpec("position", ("batch",), "position"),
        SRC_KEEP,
        TensorSpec("past_keep", ("batch", "past_seq"), "tgt_keep"),
        TensorSpec("new_keep", ("batch", "one"), "tgt_keep"),
        TensorSpec("past_k", CACHE_AXES),
        TensorSpec("past_v", CACHE_AXES),
        TensorSpec("cross_k", CROSS_AXES),
        TensorSpec("cross_v", CROSS_AXES),
    ),
    _fixed(
        LOG_PROBS,
        TensorSpec("present_k", ("layers", "batch", "heads", "tgt_seq", "d_head")),
        TensorSpec("present_v", ("layers", "batch", "heads", "tgt_seq", "d_head")),
    ),
    "model",
)

PREFIX = Case(
    "gen_prefix",
    "decoder without a cache: the whole prefix every step",
    reference_incremental.PrefixDecoderModel,
    lambda p, cfg, *inputs: (oracle_incremental.prefix_decoder(p, cfg, *inputs),),
    _fixed(
        TensorSpec("tgt_ids", ("batch", "tgt_seq"), "tgt_ids"),
        TensorSpec("tgt_keep", ("batch", "tgt_seq"), "tgt_keep"),
        TensorSpec("memory", ("batch", "src_seq", "d_model")),
        SRC_KEEP,
    ),
    _fixed(LOG_PROBS),
    "model",
)

GENERATION_CASES: tuple[Case, ...] = (ENCODER, STEP, PREFIX)


def generation_case(name: str) -> Case:
    """The generation model called `name` (what `verify --generation --model NAME=PATH` takes)."""
    return _named(GENERATION_CASES, name, "generation model")


def exporting_command(name: str) -> str:
    """The command that exports the case (or generation model) called `name` where it is
    missing: `tconform export` knows the registry's cases, `verify --generation` its models."""
    if name in {case.name for case in GENERATION_CASES}:
        return "tconform verify --generation"
    return "tconform export"


def case_names() -> tuple[str, ...]:
    return tuple(c.name for c in CASES)


def get_case(name: str) -> Case:
    return _named(CASES, name, "case")


def _named(cases: tuple[Case, ...], name: str, what: str) -> Case:
    for case in cases:
        if case.name == name:
            return case
    raise UsageError(f"unknown {what} {name!r}; choose from {', '.join(c.name for c in cases)}")


def select_cases(names: tuple[str, ...] | list[str] | None) -> tuple[Case, ...]:
    """The named cases in registry order, or all of them when no name is given."""
    if not names:
        return CASES
    wanted = {get_case(n).name for n in names}
    return tuple(c for c in CASES if c.name in wanted)


def exportable_names() -> tuple[str, ...]:
    """Every case an artifacts folder can hold: the registry's and the generation models."""
    return (*case_names(), *(case.name for case in GENERATION_CASES))


def exportable_case(name: str) -> Case:
    """The registry case or generation model called `name` (how export workers find a case)."""
    return _named((*CASES, *GENERATION_CASES), name, "case")


# --- example inputs ----------------------------------------------------------------------


def keep_lengths(batch: int, seq: int) -> list[int]:
    """Real-token count per sequence: the first is full, later ones are shorter (padded), and
    every sequence keeps at least one real token so that no attention row is fully masked."""
    return [max(1, seq - b * (seq // 3 + 1)) for b in range(batch)]


def make_inputs(
    case: Case, cfg: ModelConfig, shape: Shape, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Example inputs for `case` at `shape`: float32-representable floats, int64 ids, bool masks."""
    arrays: dict[str, np.ndarray] = {}
    for spec in case.inputs(cfg):
        dims = shape.resolve(spec.axes, cfg)
        if spec.kind == "float":
            arrays[spec.name] = rng.normal(0.0, 1.0, dims).astype(np.float32)
        elif spec.kind in ("src_ids", "tgt_ids"):
            vocab = cfg.src_vocab if spec.kind == "src_ids" else cfg.tgt_vocab
            arrays[spec.name] = rng.integers(0, vocab, dims, dtype=np.int64)
        elif spec.kind in ("src_keep", "tgt_keep"):
            batch, seq = dims
            keep = np.zeros(dims, dtype=bool)
            for b, length in enumerate(keep_lengths(batch, seq)):
                keep[b, :length] = True
            arrays[spec.name] = keep
        elif spec.kind == "attn_mask":
            mask = rng.random(dims) < 0.7
            rows = mask.reshape(-1, dims[-1])
            rows[np.arange(rows.shape[0]), rng.integers(0, dims[-1], rows.shape[0])] = True
            arrays[spec.name] = mask
        elif spec.kind == "position":
            arrays[spec.name] = np.full(dims, shape.tgt_seq, dtype=np.int64)
        else:
            raise ValueError(f"unknown input kind {spec.kind!r}")
    return arrays


_ITEM_BYTES = {"float": 4, "src_ids": 8, "tgt_ids": 8, "position": 8}  # masks: 1 byte (bool)


def io_bytes(case: Case, cfg: ModelConfig, shape: Shape) -> int:
    """Bytes of the case's float32 inputs and outputs at `shape`: the least a run holds."""
    specs = (*case.inputs(cfg), *case.outputs(cfg))
    return sum(
        int(np.prod(shape.resolve(s.axes, cfg), dtype=np.int64)) * _ITEM_BYTES.get(s.kind, 1)
        for s in specs
    )


def run_oracle(case: Case, cfg: ModelConfig, params: Params, inputs: dict[str, np.ndarray]):
    """The case's outputs in float64, in output order."""
    args = [
        inputs[s.name].astype(np.float64) if s.kind == "float" else inputs[s.name]
        for s in case.inputs(cfg)
    ]
    return tuple(np.asarray(o, dtype=np.float64) for o in case.oracle(params, cfg, *args))
