"""The fault catalogue: named mistakes in tconform's exported models, and what an output
comparison can say about each.

Each fault is a plain function ModelProto -> new ModelProto made from the graph edits of
tconform.studies.faults, written for tconform's dynamo exports at opset 18 (`tconform export`,
float32). `FAULTS` lists them with the cases they apply to and whether an output comparison can
see them at all: some mistakes are mathematically invisible (a dropped key-projection bias
shifts every score of a query by the same amount, which softmax cancels), and a conformance tool
should say so rather than hide them. docs/sensitivity.md has the measured table
(scripts/sensitivity.py, tconform.studies.sensitivity).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from tconform.oracle.positional import sinusoid_table
from tconform.studies.faults import (
    bypass,
    cast_round_trip,
    constant_input,
    elem_type,
    find_node,
    find_nodes,
    gelu,
    initializer,
    initializer_input,
    insert_after,
    module_of,
    producer,
    reads_initializer,
    replace_initializer,
    replace_input,
    replace_node,
    reverse_axis,
    scale_input,
    set_attribute,
)

# What an output comparison under tconform's float32 tolerances can say about a fault.
DETECTABLE = "detectable"  # lands far past the line: verify must fail
INVISIBLE = "invisible"  # mathematically no change to any output, only float32 rounding
MARGINAL = "marginal"  # measured within MARGIN_FACTOR of the line: caught or missed by a hair
MARGIN_FACTOR = 3.0

# ---------------------------------------------------------------------------------------------
# The faults, for tconform's dynamo exports. Each changes the first match in graph order, except
# where the mistake is a setting that a model applies everywhere (an epsilon, a fill value, a
# table): those change every node that uses it.

_ATTENTION = "ScaledDotProductAttention"
_LAYERS = ("EncoderLayer", "DecoderLayer")


def _in_module(name: str) -> Callable[[onnx.NodeProto], bool]:
    """A find_node filter: the innermost module's own name is `name` ('w_k' in 'layers.0.w_k')."""
    return lambda node: module_of(node)[0].rsplit(".", 1)[-1] == name


def _without_initializer(model: onnx.ModelProto, node: onnx.NodeProto) -> int:
    """The index of the one input of `node` that is computed, not an initializer."""
    computed = [i for i, name in enumerate(node.input) if initializer(model, name) is None]
    if len(computed) != 1:
        raise LookupError(f"{node.op_type} {node.name!r} has {len(computed)} computed inputs")
    return computed[0]


def softmax_wrong_axis(model: onnx.ModelProto) -> onnx.ModelProto:
    node = find_node(model, "Softmax", module_class=_ATTENTION)
    return set_attribute(model, node, "axis", -2)


def scale_by_dk(model: onnx.ModelProto) -> onnx.ModelProto:
    node = find_node(model, "Div", module_class=_ATTENTION)
    root_dk = constant_input(model, node, 1)
    return replace_input(model, node, 1, root_dk * root_dk)


def causal_mask_transposed(model: onnx.ModelProto) -> onnx.ModelProto:
    return set_attribute(model, find_node(model, "Trilu"), "upper", 1)


def layernorm_eps(model: onnx.ModelProto, epsilon: float = 1e-5) -> onnx.ModelProto:
    faulty = model
    for node in find_nodes(model, "LayerNormalization"):
        faulty = set_attribute(faulty, node, "epsilon", epsilon)
    return faulty


def one_weight_scaled(model: onnx.ModelProto, factor: float = 1.001) -> onnx.ModelProto:
    node = find_node(model, "MatMul", where=reads_initializer(model))
    index = initializer_input(model, node)
    largest = int(np.abs(constant_input(model, node, index)).argmax())
    return scale_input(model, node, index, factor, element=largest)


def residual_dropped(model: onnx.ModelProto) -> onnx.ModelProto:
    # x + sublayer(x): the exporter keeps the operands in source order, the residual first.
    node = find_node(model, "Add", module_class=_LAYERS)
    return bypass(model, node, keep_input=1)


def gelu_for_relu(model: onnx.ModelProto) -> onnx.ModelProto:
    relu = find_node(model, "Relu")
    dtype = helper.tensor_dtype_to_np_dtype(elem_type(model, relu.input[0]))
    return replace_node(model, relu, functools.partial(gelu, dtype=dtype))


def pe_base(model: onnx.ModelProto, base: float = 100.0) -> onnx.ModelProto:
    node = find_node(model, "Slice", module_class="PositionalEncoding")
    length, d_model = constant_input(model, node, 0).shape
    table = sinusoid_table(length, d_model, base).astype(np.float32)
    return replace_initializer(model, node.input[0], table)


def heads_reversed(model: onnx.ModelProto) -> onnx.ModelProto:
    def merges_heads(node: onnx.NodeProto) -> bool:
        # (B, h, S, d_head) -> (B, S, h, d_head) right after the attention's context MatMul;
        # the same permutation also splits heads, after a Reshape.
        source = producer(model, node.input[0])
        perm = next(
            (helper.get_attribute_value(a) for a in node.attribute if a.name == "perm"), None
        )
        return perm == [0, 2, 1, 3] and source is not None and source.op_type == "MatMul"

    node = find_node(model, "Transpose", module_class="MultiHeadAttention", where=merges_heads)
    return insert_after(model, node.input[0], reverse_axis(1))


def float16_round_trip(model: onnx.ModelProto) -> onnx.ModelProto:
    node = find_node(model, "MatMul")
    back = elem_type(model, node.output[0])  # float32; bfloat16 in a bfloat16 export
    return insert_after(model, node.output[0], cast_round_trip(TensorProto.FLOAT16, back))


def value_weight_transposed(model: onnx.ModelProto) -> onnx.ModelProto:
    node = find_node(model, "MatMul", where=_in_module("w_v"))
    weight = constant_input(model, node, 1)
    return replace_input(model, node, 1, np.ascontiguousarray(weight.T))


def attention_mask_dropped(model: onnx.ModelProto) -> onnx.ModelProto:
    # Where(not keep, fill, scores): keep the scores.
    return bypass(model, find_node(model, "Where", module_class=_ATTENTION), keep_input=2)


def key_bias_dropped(model: onnx.ModelProto) -> onnx.ModelProto:
    node = find_node(model, "Add", where=_in_module("w_k"))
    return bypass(model, node, keep_input=_without_initializer(model, node))


def mask_fill(model: onnx.ModelProto, value: float = -1e9) -> onnx.ModelProto:
    faulty = model
    for node in find_nodes(model, "Where", module_class=_ATTENTION):
        fill = constant_input(faulty, node, 1)
        faulty = replace_input(faulty, node, 1, np.full_like(fill, value))
    return faulty


@dataclass(frozen=True)
class Fault:
    name: str
    description: str
    cases: tuple[str, ...]  # the registry cases it applies to
    expected: str  # DETECTABLE or INVISIBLE
    reason: str
    inject: Callable[[onnx.ModelProto], onnx.ModelProto]
    marginal: tuple[str, ...] = ()  # cases where it was measured to land near the line

    def expectation(self, case: str) -> str:
        return MARGINAL if case in self.marginal else self.expected


FAULTS: tuple[Fault, ...] = (
    Fault(
        "softmax_wrong_axis",
        "attention softmax over the queries (axis -2) instead of the keys",
        ("attention", "mha_self", "transformer"),
        DETECTABLE,
        "weights no longer sum to 1 over the keys; a padded key column becomes NaN",
        softmax_wrong_axis,
    ),
    Fault(
        "scale_1_over_dk",
        "scores divided by d_k instead of sqrt(d_k)",
        ("attention", "mha_cross", "transformer"),
        DETECTABLE,
        "scores halved at d_k = 4: a flatter softmax",
        scale_by_dk,
    ),
    Fault(
        "causal_mask_transposed",
        "causal mask upper- instead of lower-triangular (triu for tril)",
        ("mha_causal", "transformer"),
        DETECTABLE,
        "each position attends to its future instead of its past",
        causal_mask_transposed,
    ),
    Fault(
        "layernorm_eps_1e-5",
        "LayerNorm epsilon 1e-5 (torch.nn's default) instead of the config's 1e-6",
        ("norm", "encoder_layer", "transformer"),
        DETECTABLE,
        "1/sqrt(var + eps) moves by (1e-5 - 1e-6) / (2 var) relative: 4.5e-6 at unit variance, "
        "close to rtol 3e-6..1e-5; past the line on norm's inputs, at it after a layer's sum",
        layernorm_eps,
        marginal=("encoder_layer", "transformer"),
    ),
    Fault(
        "weight_x1.001",
        "one weight (the largest element of the first weight matrix) times 1.001",
        ("feed_forward", "mha_self", "output_head", "transformer"),
        DETECTABLE,
        "changes its products by about 1e-3 x 0.6-0.9 (the weight) x |input|, far above float32 "
        "rounding",
        one_weight_scaled,
    ),
    Fault(
        "residual_dropped",
        "the first layer's first residual connection dropped (Norm(sublayer(x)))",
        ("encoder_layer", "transformer"),
        DETECTABLE,
        "the layer's input no longer reaches its output",
        residual_dropped,
    ),
    Fault(
        "gelu_for_relu",
        "GELU (erf form) instead of ReLU in the first feed-forward network",
        ("feed_forward", "transformer"),
        DETECTABLE,
        "GELU differs from ReLU by up to 0.17 near zero",
        gelu_for_relu,
    ),
    Fault(
        "pe_base_100",
        "positional-encoding table recomputed with base 100 instead of 10000",
        ("positional_encoding", "transformer"),
        DETECTABLE,
        "every position but 0 gets other sinusoids (position 0 is sin 0, cos 0 in any base)",
        pe_base,
    ),
    Fault(
        "heads_reversed",
        "attention heads concatenated in reverse order before the output projection",
        ("mha_self", "mha_cross", "transformer"),
        DETECTABLE,
        "W_O multiplies each head's context with another head's rows",
        heads_reversed,
    ),
    Fault(
        "float16_round_trip",
        "a Cast to float16 and back after the first MatMul",
        ("feed_forward", "mha_self", "transformer"),
        DETECTABLE,
        "float16 keeps 11 significant bits: 2.4e-4 relative rounding against rtol 3e-6 to 1e-5",
        float16_round_trip,
    ),
    Fault(
        "value_weight_transposed",
        "the first value projection's weight transposed (W^T for W)",
        ("mha_cross", "encoder_layer", "transformer"),
        DETECTABLE,
        "the nn.Linear (out, in) layout mix-up: another matrix unless W is symmetric",
        value_weight_transposed,
    ),
    Fault(
        "attention_mask_dropped",
        "the first attention's masked_fill dropped (padding and causal masks ignored)",
        ("attention", "mha_self", "mha_causal", "transformer"),
        DETECTABLE,
        "padded (and future) keys get weight; only the sets with masked keys can show it",
        attention_mask_dropped,
    ),
    Fault(
        "key_bias_dropped",
        "the first key projection's bias dropped",
        ("mha_self", "mha_causal", "mha_cross", "encoder_layer", "transformer"),
        INVISIBLE,
        "q·(k + b) = q·k + q·b shifts all scores of one query by the same amount, which "
        "softmax cancels: only float32 rounding changes",
        key_bias_dropped,
    ),
    Fault(
        "mask_fill_-1e9",
        "masked scores filled with -1e9 instead of -inf",
        ("attention", "mha_causal", "transformer"),
        INVISIBLE,
        "exp(-1e9 - max) is exactly 0 in float32, as exp(-inf) is, while no attention row is "
        "fully masked (the goldens keep one real token per row; a fully masked row would be NaN "
        "with -inf and uniform with -1e9)",
        mask_fill,
    ),
)


def get_fault(name: str) -> Fault:
    for fault in FAULTS:
        if fault.name == name:
            return fault
    raise LookupError(f"unknown fault {name!r}; choose from {', '.join(f.name for f in FAULTS)}")
