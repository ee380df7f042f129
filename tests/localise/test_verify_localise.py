"""`tconform verify --localise`: a fault injected into the exported whole model fails verify
and is named down to the sublayer, with tconform check's machinery."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import numpy_helper

from tconform.config import PRESETS
from tconform.files import atomic_write_json, sha256_file

pytestmark = pytest.mark.integration

TINY = PRESETS["tiny"]
FAULT = "decoder.layers.1.ffn.w1"


@pytest.fixture
def faulty_transformer(workspace):
    """Goldens and an exported `transformer` (a private copy of the session's) whose FAULT
    weight has one row scaled; the artifacts manifest records the new bytes, as if the exporter
    had written them."""
    artifacts = workspace["artifacts"]
    path = artifacts / "transformer" / "model.onnx"
    model = onnx.load(str(path))
    weights = {i.name: i for i in model.graph.initializer}
    matmul = next(
        n
        for n in model.graph.node
        if n.op_type == "MatMul"
        and any(p.key == "namespace" and f"/{FAULT}: " in p.value for p in n.metadata_props)
    )
    weight = weights[next(name for name in matmul.input if name in weights)]
    array = numpy_helper.to_array(weight).copy()
    array[0] *= 1.5
    weight.CopyFrom(numpy_helper.from_array(array, weight.name))
    onnx.save(model, str(path))
    manifest = json.loads((artifacts / "manifest.json").read_text())
    manifest["models"]["transformer"]["sha256"] = sha256_file(path)
    atomic_write_json(artifacts / "manifest.json", manifest)
    return workspace


def test_verify_localise_names_the_faulty_sublayer(cli, faulty_transformer, tmp_path):
    code, out, err = cli(
        "verify",
        "--golden", str(faulty_transformer["golden"]),
        "--artifacts", str(faulty_transformer["artifacts"]),
        "--case", "transformer", "--no-torch", "--no-doc", "-q", "--localise",
        "--json", str(tmp_path / "r.json"),
    )  # fmt: skip
    assert code == 1, out + err
    assert f"first divergence: {FAULT} (" in out
    report = json.loads((tmp_path / "r.json").read_text())
    (loc,) = report["details"]["localisation"]  # one per failing case and provider
    assert loc["first_divergence"]["path"] == FAULT
    failing = [r for r in report["results"] if r["status"] == "fail"]
    assert failing and all(any(FAULT in n for n in r["notes"]) for r in failing)
