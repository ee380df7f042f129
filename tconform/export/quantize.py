"""The int8 and int4 dtypes: a float32 export quantised by ONNX Runtime's own tools.

`onnxruntime.quantization.quantize_dynamic` is what a user of ONNX Runtime runs to get an int8
model: every MatMul with a weight becomes DynamicQuantizeLinear (the activation to uint8, its
scale and zero point computed per call) + MatMulInteger with the int8 weight + the rescale to
float32, and every Gather from a weight table reads an int8 table through DequantizeLinear. Ops
without weights (attention's activation products, softmax, norms) stay float32, as do the
inputs and outputs. The settings are `settings.INT8_QUANTIZATION` (why reduce_range: there).

`onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer` is what a user of ONNX
Runtime (and ONNX Runtime GenAI's model builder) runs for weight-only int4: every MatMul with a
weight becomes one `MatMulNBits` node holding the weight in 4-bit blocks with a float32 scale
per block; the activations, the embedding tables and everything else stay float32. The
settings are `settings.INT4_QUANTIZATION`.

The quantiser's new nodes carry no metadata, so they would belong to no module scope and
localisation (tconform.localise.scopes) could not place a Linear's MatMulInteger in the Linear:
`restore_scopes` gives each the module scope its consumers share.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Sequence
from pathlib import Path

import onnx

from tconform.export.settings import INT4_QUANTIZATION, INT8_QUANTIZATION

# The 4-bit quantiser logs every node it quantises on a logger of its own.
_NBITS_LOGGER = "onnxruntime.quantization.matmul_nbits_quantizer"


@contextlib.contextmanager
def quiet_quantizer():
    """The quantisers log advice (run pre-processing first) and progress on the root logger and
    their own, and print; tconform reports instead. The 4-bit quantiser's module also calls
    logging.basicConfig when imported (a root handler at INFO, which would print every later
    library's INFO lines): a handler added meanwhile is removed and the levels restored."""
    root = logging.getLogger()
    loggers = [root, logging.getLogger(_NBITS_LOGGER)]
    levels = [logger.level for logger in loggers]
    handlers = list(root.handlers)
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def quantize_int8(source: Path, target: Path, exclude: Sequence[str] = ()) -> None:
    """`source` (a float32 ONNX file) quantised to int8 weights into `target`, but for the
    nodes named in `exclude` (quantize_dynamic's nodes_to_exclude), which stay float32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    settings = dict(INT8_QUANTIZATION)
    weight_type = getattr(QuantType, str(settings.pop("weight_type")))
    graph = onnx.load(str(source), load_external_data=False).graph
    exclude = [*exclude, *_onnx_attention_nodes(graph)]
    # Without the shapes the exporter recorded (the dynamo exporter records its weights'): the
    # quantiser turns a Gemm with transB into a MatMul of the transposed weight, and ONNX's shape
    # inference, which it runs next, then fails on the recorded shape ("Inferred shape and
    # existing shape differ in dimension 0: (64) vs (3)", Electra's head); it infers its own.
    model = onnx.load(str(source))
    del model.graph.value_info[:]
    with quiet_quantizer():
        quantize_dynamic(
            model, target, weight_type=weight_type, nodes_to_exclude=exclude, **settings
        )
    model = onnx.load(str(target))
    restore_scopes(model.graph, graph)
    onnx.save(model, str(target))


def _onnx_attention_nodes(graph: onnx.GraphProto) -> list[str]:
    """The names of ONNX's own `Attention` nodes (opset 23, the sdpa export). quantize_dynamic
    matches op types without their domain and rewrites such a node as ONNX Runtime's contrib
    QAttention, which has other inputs and attributes and does not load; left alone, the node
    stays float32 like the rest of attention and its projections are quantised as usual."""
    onnx_ops = ("", "ai.onnx")
    # an unnamed node cannot be excluded by name ("" would exclude every unnamed node)
    return [
        n.name for n in graph.node if n.op_type == "Attention" and n.domain in onnx_ops and n.name
    ]


def quantize_int4(source: Path, target: Path) -> None:
    """`source` (a float32 ONNX file) with its MatMul weights in 4-bit blocks into `target`."""
    settings = {k: v for k, v in INT4_QUANTIZATION.items() if k != "tool"}
    with quiet_quantizer():
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            MatMulNBitsQuantizer,
        )

        config = DefaultWeightOnlyQuantConfig(**settings)
        quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), algo_config=config)
        quantizer.process()
    model = quantizer.model.model
    restore_scopes(model.graph, onnx.load(str(source), load_external_data=False).graph)
    onnx.save(model, str(target))


# dtype -> the quantiser that makes it from the float32 export
QUANTIZERS = {"int8": quantize_int8, "int4": quantize_int4}


NAMESPACE = "namespace"  # the dynamo exporter's record of a node's module scope


def restore_scopes(graph: onnx.GraphProto, source: onnx.GraphProto | None = None) -> None:
    """Give each node without a namespace the module scope of the `source` graph's node (the
    graph before quantisation) that made the same tensor: the rescale Mul of a quantised
    MatMul makes the MatMul's output, so it takes the MatMul's scope (a Linear without a bias,
    as in Llama and T5, has no other node left to place its chain). Then each node still
    without one takes the module scopes its consumers' namespaces share (their common leading
    segments; the last segment is a node's own op, not a module). The graph is in topological
    order, so walking it backwards settles consumers first: the rescale Mul of a quantised
    Linear takes the scope of the Linear's bias Add, the Cast and MatMulInteger before it the
    Mul's, and an activation's DynamicQuantizeLinear shared by three projections the attention
    module around them."""
    made_by = {
        name: namespace
        for node in (source.node if source is not None else ())
        if (namespace := _namespace(node)) is not None
        for name in node.output
    }
    for node in graph.node:
        known = next((made_by[name] for name in node.output if name in made_by), None)
        if known is not None and _namespace(node) is None:
            _set_scope(node, known.split("/")[:-1])
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in reversed(graph.node):
        if any(p.key == NAMESPACE for p in node.metadata_props):
            continue
        scopes = [
            _namespace(user).split("/")[:-1]
            for name in node.output
            for user in consumers.get(name, [])
            if _namespace(user) is not None
        ]
        if not scopes:
            continue  # feeds only graph outputs: no module to give it
        shared = []
        for segments in zip(*scopes, strict=False):
            if any(s != segments[0] for s in segments):
                break
            shared.append(segments[0])
        if shared:
            _set_scope(node, shared)


def _set_scope(node: onnx.NodeProto, modules: list[str]) -> None:
    """Record `modules` (namespace segments) as the node's scope, itself its last segment."""
    prop = node.metadata_props.add()
    prop.key, prop.value = NAMESPACE, "/".join([*modules, f"{node.name}: {node.op_type}"])


def _namespace(node: onnx.NodeProto) -> str | None:
    return next((p.value for p in node.metadata_props if p.key == NAMESPACE), None)
