"""The real-model tier (`pytest -m zoo`): `tconform check` on the models users bring, built from
config (tests/zoo/models.py). For each model: the check passes, localising it names nothing and
shows no FAIL row, and no repro bundle is written; one weight matrix scaled by 1.01 in the
export, and another module's weight corrupted, are each named as the first divergence, exactly
by module path (also behind in-place ops and beside a norm the exporter merged away), with a
repro bundle that reproduces the failure with plain onnxruntime on a small part of the model.
And the float16, padding and exporter cases."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import numpy_helper
from onnxruntime.transformers.float16 import convert_float_to_float16

import tconform
from tests.zoo.corrupt import corrupt_module_weight, scale_module_weight
from tests.zoo.models import EXPORTERS, TARGETS, ZOO, llama_left_padded, t5

pytestmark = pytest.mark.zoo

CLEAN = [name for name in ZOO if name != "llama_left_padded"]  # its own test, below


@pytest.fixture(scope="module", params=CLEAN)
def checked(request, tmp_path_factory):
    """One model, checked and localised on its unmodified export, at the example's shape (the
    shapes it never had: tests/module_check/test_check_shapes.py; localisation runs on one
    input set whatever the run's shapes)."""
    module, inputs = ZOO[request.param]()
    folder = tmp_path_factory.mktemp(request.param)
    exporter = EXPORTERS.get(request.param, "auto")
    report = tconform.check(
        module,
        inputs,
        out_dir=folder / "export",
        localise=True,
        exporter=exporter,
        repro=folder / "repro",
        shapes=False,
    )
    return request.param, module, inputs, folder, report


def test_the_model_passes_and_a_corrupted_weight_is_named(checked, tmp_path):
    """One test per model (its check is built once, not once per xdist worker)."""
    _passes_naming_nothing(checked)
    _corrupted_weights_are_named(checked, tmp_path)


def _notes(report) -> list[str]:
    return [note for r in report.results for note in r.notes]


def _passes_naming_nothing(checked) -> None:
    _, _, _, folder, report = checked
    assert report.exit_code == 0, [(r.runtime, r.status, r.message) for r in report.results]
    assert {r.runtime for r in report.results} == {"onnxruntime", "torch"}
    (loc,) = report.localisations
    assert loc.first is None and loc.verdict.startswith("no divergence"), loc.verdict
    assert not [b.label for b in loc.boundaries if b.status == "fail"]
    assert not loc.observer.changed, loc.observer.describe()
    assert not (folder / "repro").exists()  # a bundle only for a module proven wrong
    assert any("no bundle from this run: no module is named" in n for n in _notes(report))
    matched = [b for b in loc.boundaries if b.status == "pass"]
    assert len(matched) >= len(loc.boundaries) // 2, [b.label for b in loc.boundaries]
    model = report.results[0].model
    assert model.origin == "exported" and Path(model.path) == folder / "export" / "model.onnx"


def _reproduces(bundle: Path) -> bool:
    """The bundle on plain onnxruntime: some output outside the tolerance its record states
    (each output's own atol: the row's, scaled to the output's RMS)."""
    record = json.loads((bundle / "bundle.json").read_text())
    session = onnxruntime.InferenceSession(str(bundle / "model.onnx"))
    data = bundle / "test_data_set_0"

    def read(path: Path):
        tensor = onnx.TensorProto()
        tensor.ParseFromString(path.read_bytes())
        return tensor.name, numpy_helper.to_array(tensor)

    feeds = dict(read(p) for p in sorted(data.glob("input_*.pb")))
    expected = dict(read(p) for p in sorted(data.glob("output_*.pb")))
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, feeds), strict=True))
    return any(
        not np.allclose(outputs[n], want, atol=record["atol_by_output"][n], rtol=record["rtol"])
        for n, want in expected.items()
    )


def _corrupted_weights_are_named(checked, tmp_path) -> None:
    """The first target's weight matrix scaled by 1.01, the second's corrupted by noise."""
    name, module, inputs, folder, _ = checked
    scaled, noisy = TARGETS[name]
    for target, corrupt in ((scaled, scale_module_weight), (noisy, corrupt_module_weight)):
        corrupted = corrupt(folder / "export" / "model.onnx", target, tmp_path / target)
        bundle = tmp_path / f"repro-{target}"
        report = tconform.check(
            module,
            inputs,
            onnx_model=corrupted.path,
            runtimes=("onnxruntime",),
            repro=bundle,
            shapes=False,
        )
        (loc,) = report.localisations
        assert report.exit_code == 1
        assert loc.first is not None and target in loc.first.modules, (target, loc.verdict)
        assert loc.first.isolated_status == "fail"  # it computes wrong, on exact inputs too
        assert loc.first.finding == "function"  # in float64 too: more than rounding
        assert _reproduces(bundle), target
        bundled = len(onnx.load(str(bundle / "model.onnx")).graph.node)
        whole = len(onnx.load(str(corrupted.path)).graph.node)
        assert bundled <= max(1, whole // 4), (bundled, whole)  # a small part of the model


@pytest.mark.parametrize("checked", ["inplace_mlp"], indirect=True)  # one model is enough
def test_the_bundles_own_script_needs_only_onnxruntime(checked, tmp_path):
    _, module, inputs, folder, _ = checked
    corrupted = corrupt_module_weight(folder / "export" / "model.onnx", "2", tmp_path)
    tconform.check(
        module, inputs, onnx_model=corrupted.path, repro=tmp_path / "bundle", shapes=False
    )
    run = subprocess.run(
        [sys.executable, "reproduce.py"], cwd=tmp_path / "bundle", capture_output=True, text=True
    )
    assert run.returncode == 1 and "outside atol" in run.stdout, run.stdout + run.stderr


def test_a_left_padded_decoder_fails_naming_padding_and_passes_with_the_mask(tmp_path):
    # transformers' default attention (sdpa): ONNX Runtime and PyTorch differ at the padded
    # query positions, whose outputs no framework defines.
    module, inputs = llama_left_padded("sdpa")
    report = tconform.check(  # at the example's shape: the padding is the example's
        module,
        inputs,
        out_dir=tmp_path / "export",
        runtimes=("onnxruntime",),
        repro=tmp_path / "r",
        shapes=False,
    )
    (ort,) = report.results
    assert report.exit_code == 1 and ort.status == "fail"
    assert "lies where attention_mask is 0" in ort.message
    assert "--padding-mask attention_mask" in ort.message
    (loc,) = report.localisations  # padding only: no module is named, no bundle written
    assert loc.padding_only and loc.first is None and not (tmp_path / "r").exists(), loc.verdict
    assert not [b.label for b in loc.boundaries if b.status == "fail"]
    assert "first divergence" not in ort.message
    # a real mistake beside the padding: named exactly, at the real positions
    target = TARGETS["llama_left_padded"][0]
    scaled = scale_module_weight(tmp_path / "export" / "model.onnx", target, tmp_path / "scaled")
    report = tconform.check(
        module, inputs, onnx_model=scaled.path, runtimes=("onnxruntime",), shapes=False
    )
    (loc,) = report.localisations
    assert not loc.padding_only and loc.real_positions == "attention_mask"
    assert loc.first is not None and target in loc.first.modules, loc.verdict
    masked = tconform.check(
        module,
        inputs,
        onnx_model=tmp_path / "export" / "model.onnx",
        padding_mask="attention_mask",
        localise=True,
        shapes=False,
    )
    assert masked.exit_code == 0, [r.message for r in masked.results]
    assert masked.localisations[0].first is None
    ort = next(r for r in masked.results if r.runtime == "onnxruntime")
    padded = int((inputs["attention_mask"] == 0).sum())
    left_out = sum(o.excluded for o in ort.outputs)
    assert left_out == padded * ort.outputs[0].shape[-1] > 0
    assert f"{ort.input_set}: {left_out} of " in "\n".join(ort.notes)  # which set, at the note


@pytest.mark.parametrize("checked", ["llama"], indirect=True)  # one model is enough
def test_a_float16_conversion_names_nothing_clean_and_the_module_corrupted(checked, tmp_path):
    """onnxruntime's float16 converter (inputs and outputs kept float32): judged by the float16
    row, a clean conversion shows no FAIL row and names nothing; a corrupted weight is named."""
    _, module, inputs, folder, _ = checked
    half = tmp_path / "half.onnx"
    converted = convert_float_to_float16(
        onnx.load(str(folder / "export" / "model.onnx")), keep_io_types=True
    )
    onnx.save(converted, str(half))
    ort = ("onnxruntime",)
    report = tconform.check(module, inputs, onnx_model=half, runtimes=ort, localise=True)
    (loc,) = report.localisations
    assert report.exit_code == 0 and report.results[0].precision == "float16"
    assert loc.first is None and not [b.label for b in loc.boundaries if b.status == "fail"]
    target = "model.model.layers.1.self_attn.o_proj"
    corrupted = corrupt_module_weight(half, target, tmp_path / "bad")
    report = tconform.check(module, inputs, onnx_model=corrupted.path, runtimes=ort)
    (loc,) = report.localisations
    assert report.exit_code == 1 and loc.first is not None and loc.first.path == target


def test_auto_falls_back_to_torchscript_where_dynamo_fails(tmp_path):
    module, inputs = t5("sdpa")  # dynamo fails inside torch on this T5
    with pytest.raises(tconform.errors.UsageError, match="--exporter torchscript"):
        tconform.check(module, inputs, out_dir=tmp_path / "dynamo", exporter="dynamo")
    report = tconform.check(module, inputs, out_dir=tmp_path / "auto", shapes=False)
    assert report.exit_code == 0
    assert report.settings["exporter"] == "torchscript"
    assert "dynamo failed" in report.settings["exporter_reason"]
    ort = next(r for r in report.results if r.runtime == "onnxruntime")
    assert any("exported by TorchScript (--exporter auto)" in n for n in ort.notes)
