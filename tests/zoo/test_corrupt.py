"""The zoo's corruption helper (tests/zoo/corrupt.py): it finds a module's weight through the
exporter's scopes, changes only that module, and reads TorchScript node names as the exporter
writes them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from tests.zoo.corrupt import corrupt_module_weight, find_weight, torchscript_paths
from tests.zoo.models import inplace_mlp


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "paths"),
    [
        ("/layers.2/linear1/MatMul", ("", "layers.2", "layers.2.linear1")),
        ("/layer1/layer1.0/conv1/Conv", ("", "layer1", "layer1.0", "layer1.0.conv1")),
        (
            "/layer2/layer2.0/downsample/downsample.0/Conv",
            ("", "layer2", "layer2.0", "layer2.0.downsample", "layer2.0.downsample.0"),
        ),
        ("/Add", ("",)),
    ],
)
def test_torchscript_node_names_give_module_paths(name, paths):
    assert torchscript_paths(name.split("/")[1:-1]) == paths


def _export(module: nn.Module, x: torch.Tensor, path, exporter: str) -> None:
    torch.onnx.export(module, (x,), str(path), dynamo=exporter == "dynamo", external_data=False)


def _weights(path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


@pytest.mark.integration
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_one_weight_of_the_named_module_changes(tmp_path, exporter):
    module, (x,) = inplace_mlp()
    source = tmp_path / "model.onnx"
    _export(module, x, source, exporter)
    before = _weights(source)
    done = corrupt_module_weight(source, "2", tmp_path / "bad")
    after = _weights(done.path)
    assert all(np.array_equal(before[k], v) for k, v in _weights(source).items())  # read only
    changed = [k for k in before if not np.array_equal(before[k], after[k])]
    assert changed == [done.initializer]
    assert sorted(after[done.initializer].shape) == [4, 8]  # the weight, not the bias
    assert done.max_change > 0.01 and not done.shared


@pytest.mark.integration
def test_a_weight_read_outside_the_module_gets_a_private_copy(tmp_path):
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    source = tmp_path / "model.onnx"
    _export(Tied().eval(), torch.randn(2, 8), source, "torchscript")
    model = onnx.load(str(source))
    name, _, shared = find_weight(model, "b")
    assert shared
    done = corrupt_module_weight(source, "b", tmp_path / "bad")
    bad = onnx.load(str(done.path))
    readers = {n.name: list(n.input) for n in bad.graph.node if n.op_type in ("MatMul", "Gemm")}
    assert any(done.written_as in inputs for inputs in readers.values())
    assert any(name in inputs for inputs in readers.values())  # module a still reads the original
