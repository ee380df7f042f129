"""The weight bytes one forward pass reads (the memory floor's numerator), counted from what an
engine really holds rather than assumed from the config: the initializers of the ONNX file it
runs (int8 weights at one byte each, their scales and zero points, what stayed float32), or
the tensors of the module it runs (a quantised Linear's packed int8 weight and float bias).

At batch 1 a forward pass reads every weight once, except a table it gathers rows from (token
embeddings: 37000 rows at base), of which it reads at most one row per token."""

from __future__ import annotations

import math
from pathlib import Path

import onnx
import torch
from onnx import helper

# The bytes a float32 weight takes in a runtime that computes in another float type and
# converts the weights to it as it compiles (OpenVINO's inference precision).
HELD_FLOAT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def gathered_bytes(array_bytes: int, rows: int, tokens: int) -> int:
    """Bytes read from a table of `rows` rows of `array_bytes` in all, one row per token."""
    return array_bytes // rows * min(rows, tokens) if rows else 0


def onnx_weight_bytes(path: Path, tokens: int, float_itemsize: int = 4) -> int:
    """Bytes of the initializers in the ONNX file at `path` that a forward pass over `tokens`
    tokens reads: each in full, except the data of a Gather (an embedding table: the int8
    graph gathers from the int8 table and dequantises the rows), of which `tokens` rows.
    `float_itemsize` is what the runtime holds a float32 initializer in (2 where it computes
    in bfloat16 and converts the weights as it compiles, as OpenVINO's bf16 precision does)."""
    model = onnx.load(str(path))
    gathered = {n.input[0] for n in model.graph.node if n.op_type == "Gather"}
    total = 0
    for initializer in model.graph.initializer:
        itemsize = helper.tensor_dtype_to_np_dtype(initializer.data_type).itemsize
        if initializer.data_type == onnx.TensorProto.FLOAT:
            itemsize = float_itemsize
        nbytes = math.prod(initializer.dims) * itemsize
        if initializer.name in gathered and initializer.dims:
            total += gathered_bytes(nbytes, initializer.dims[0], tokens)
        else:
            total += nbytes
    return int(total)


def module_weight_bytes(module: torch.nn.Module, tokens: int) -> int:
    """Bytes of the tensors of `module`'s state (parameters, buffers, a dynamically quantised
    Linear's packed int8 weight and bias) that a forward pass over `tokens` tokens reads: a
    table (leaf `table`: the embeddings, the positional encoding) only `tokens` rows of it."""
    total = 0
    for name, value in module.state_dict().items():
        for tensor in _tensors(value):
            nbytes = tensor.numel() * tensor.element_size()
            if name.rsplit(".", 1)[-1] == "table" and tensor.dim() >= 1:
                total += gathered_bytes(nbytes, tensor.shape[0], tokens)
            else:
                total += nbytes
    return int(total)


def _tensors(value: object) -> list[torch.Tensor]:
    """The tensors in a state-dict value: a tensor, or the (weight, bias) tuple of packed
    quantised parameters (None for a missing bias; the dtype entry is no tensor)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []
