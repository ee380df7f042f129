"""Small PyTorch modules and hand-built ONNX graphs whose node scopes mirror them, as an exporter
would record them, so that a localisation's verdict is known in advance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from torch import nn


class Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class Chain(nn.Module):
    """y = b(a(x) + offset), a: x*2, b: h*3."""

    def __init__(self, offset: float = 1.0) -> None:
        super().__init__()
        self.offset = offset
        self.a = Scale(2.0)
        self.b = Scale(3.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) + self.offset)


def scoped_node(op, inputs, outputs, scope, style="dynamo", **attributes) -> onnx.NodeProto:
    """A node with the dynamo exporter's `namespace` metadata (scope: the module paths inside the
    root, outermost first) or TorchScript's node name; no scope at all where `scope` is None
    (a node an optimiser made)."""
    node = helper.make_node(op, inputs, outputs, name=f"node_{outputs[0]}", **attributes)
    if scope is None:
        return node
    if style == "dynamo":
        parts = [": test.Net", *(f"{p}: test.Module" for p in scope)]
        entry = node.metadata_props.add()
        entry.key, entry.value = "namespace", "/".join([*parts, f"{op.lower()}: aten.op"])
    else:
        node.name = "/" + "/".join([*scope, f"{op}_{outputs[0]}"])
    return node


def save_model(
    path: Path,
    nodes: list[onnx.NodeProto],
    inputs: dict[str, tuple[int, list[int]]],
    outputs: dict[str, list[int]],
    initializers: dict[str, np.ndarray],
) -> Path:
    """The graph as a checked model at `path`; inputs: name -> (element type, shape); outputs
    (float32): name -> shape."""
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info(n, t, shape) for n, (t, shape) in inputs.items()],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
