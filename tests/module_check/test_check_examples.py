"""`tconform check` on modules written outside tconform (examples/): PyTorch's own
nn.TransformerEncoder and a small GPT-style decoder pass on the CPU provider; a corrupted
export fails with exit 1 and localisation names the corrupted submodule, from the CLI and from
`tconform.check` alike; the model under test is never modified."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

import tconform
from tconform.cli import cli as tconform_cli
from tconform.files import sha256_file
from tconform.module_check.inputs import load_factory
from tconform.runtimes.onnxruntime import unavailable_reason

pytestmark = pytest.mark.integration

# example -> (the submodule a test corrupts, how): a LayerNorm's epsilon, or one weight
EXAMPLES = {
    "examples.tiny_gpt:make": ("blocks.2.ln_1", "epsilon"),
    "examples.torch_encoder:make": ("layers.2.linear1", "weight"),
}


def _in_scope(node: onnx.NodeProto, path: str, torchscript_name: str | None) -> bool:
    """Whether the exporter placed `node` in module `path`: read directly from the dynamo
    exporter's metadata (or a TorchScript node name), independently of tconform's reader."""
    if torchscript_name is not None:
        return node.name.startswith(torchscript_name + "/")
    namespace = next((p.value for p in node.metadata_props if p.key == "namespace"), "")
    return f"/{path}: " in namespace


def corrupt(source, target, path: str, how: str, torchscript_name: str | None = None) -> None:
    """Copy `source` to `target` with one fault in module `path` (the onnx Python API).
    `torchscript_name`: the module's node-name prefix in a TorchScript export."""
    model = onnx.load(str(source))
    nodes = [n for n in model.graph.node if _in_scope(n, path, torchscript_name)]
    if how == "epsilon":
        norm = next(n for n in nodes if n.op_type == "LayerNormalization")
        next(a for a in norm.attribute if a.name == "epsilon").f = 0.5
    else:
        weights = {i.name: i for i in model.graph.initializer}
        matmul = next(n for n in nodes if n.op_type in ("MatMul", "Gemm"))
        weight = weights[next(name for name in matmul.input if name in weights)]
        array = numpy_helper.to_array(weight).copy()
        array.flat[0] *= 3.0
        weight.CopyFrom(numpy_helper.from_array(array, weight.name))
    onnx.save(model, str(target))


def run_cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(tconform_cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module", params=list(EXAMPLES))
def checked(request, tmp_path_factory):
    """One `tconform check TARGET` run per example, exporting into a fresh folder."""
    target = request.param
    folder = tmp_path_factory.mktemp("check")
    code, out, err = run_cli(
        "check", target, "--out", str(folder / "export"), "--json", str(folder / "r.json"),
        "--junit", str(folder / "r.xml"), "--markdown", str(folder / "r.md"), "-q",
    )  # fmt: skip
    return {"target": target, "folder": folder, "code": code, "out": out, "err": err}


def test_the_example_passes_on_cpu_with_an_error_table_and_provenance(checked):
    assert checked["code"] == 0, checked["out"] + checked["err"]
    out = checked["out"]
    assert "max abs err" in out and "tol used" in out
    assert re.search(r"^(\d+) results: \1 pass$", out, re.M), out  # every shape passes
    assert "provenance:" in out and "(exported, sha256" in out and "(module, float64" in out
    report = json.loads((checked["folder"] / "r.json").read_text())
    rows = {r["runtime"]: r for r in report["results"] if r["input_set"] == "example"}
    sets = {r["input_set"] for r in report["results"]}
    assert {"example", "batch-1", "batch-consistency"} <= sets  # shapes it never had, too
    ort = rows["onnxruntime"]
    assert ort["ep_actual"] == ["CPUExecutionProvider"] and ort["reference"] == "float64"
    assert ort["model"]["origin"] == "exported"
    assert ort["model"]["sha256"] == sha256_file(checked["folder"] / "export" / "model.onnx")
    assert rows["torch"]["model"]["origin"] == "module"
    assert report["settings"]["reference_model"]["origin"] == "module"
    assert all(0 < o["tolerance_used"] < 1 for r in rows.values() for o in r["outputs"])
    assert "localisation" not in report.get("details", {})  # only on a failure or with --localise
    assert (checked["folder"] / "r.xml").exists() and "| ort-cpu |" in (
        checked["folder"] / "r.md"
    ).read_text()


def test_a_corrupted_export_fails_and_localisation_names_the_submodule(checked, tmp_path):
    path, how = EXAMPLES[checked["target"]]
    bad = tmp_path / "corrupted.onnx"
    corrupt(checked["folder"] / "export" / "model.onnx", bad, path, how)
    before = sha256_file(bad)
    code, out, err = run_cli(
        "check", checked["target"], "--model", str(bad), "--json", str(tmp_path / "r.json"),
        "--markdown", str(tmp_path / "r.md"), "-q",
    )  # fmt: skip
    assert code == 1, out + err
    assert f"first divergence: {path} (" in out
    markdown = (tmp_path / "r.md").read_text()
    assert "### Localisation on" in markdown and f"first divergence: {path} (" in markdown
    assert f"| `{path}` |" in markdown  # its row among the boundaries outside tolerance
    assert sha256_file(bad) == before  # the model under test is read-only
    report = json.loads((tmp_path / "r.json").read_text())
    (loc,) = report["details"]["localisation"]
    assert loc["first_divergence"]["path"] == path
    assert loc["first_divergence"]["inputs_status"] == "pass"
    ort = next(r for r in report["results"] if r["runtime"] == "onnxruntime")
    assert ort["status"] == "fail" and ort["model"]["origin"] == "given"
    assert f"first divergence: {path}" in ort["message"]

    # The Python API returns the same verdict.
    module, example_inputs, _ = load_factory(checked["target"])
    api = tconform.check(module, example_inputs, onnx_model=bad, name=checked["target"])
    assert api.exit_code == 1 == code
    assert [r.status for r in api.results] == [r["status"] for r in report["results"]]
    assert api.localisations[0].first is not None
    assert api.localisations[0].first.path == path


def test_the_torchscript_export_localises_by_node_names(tmp_path):
    module, example_inputs, _ = load_factory("examples.torch_encoder:make")
    report = tconform.check(
        module, example_inputs, exporter="torchscript", out_dir=tmp_path, localise=True
    )
    # TorchScript traces the sequence length into the attention's Reshape targets: the model
    # declares the axis free and runs only at the example's length, which the shapes it never
    # had show (an error at each other length; every batch passes).
    statuses = {r.input_set: r.status for r in report.results if r.runtime == "onnxruntime"}
    assert {s for name, s in statuses.items() if name.startswith("seq-")} == {"error"}
    assert {s for name, s in statuses.items() if not name.startswith("seq-")} == {"pass"}
    assert report.exit_code == 1
    (loc,) = report.localisations
    assert loc.scope_source == "TorchScript node names" and loc.first is None
    assert len(loc.matched) >= 20  # every layer's attention, norms and linears
    bad = tmp_path / "corrupted.onnx"
    corrupt(tmp_path / "model.onnx", bad, "layers.2.linear1", "weight", "/layers.2/linear1")
    report = tconform.check(module, example_inputs, onnx_model=bad, shapes=False)
    assert report.exit_code == 1
    assert report.localisations[0].first.path == "layers.2.linear1"


def test_dynamic_axes_and_inputs_from_a_file(tmp_path):
    """Exported with dynamic batch and sequence axes, the model is checked again (read-only,
    via --model) on inputs of another shape from an .npz file."""
    target = "examples.tiny_gpt:make"
    code, out, err = run_cli(
        "check",
        target,
        "--dynamic",
        "idx=0:batch,1:seq",
        "--out",
        str(tmp_path),
        "--no-shapes",
        "-q",
    )  # fmt: skip  (one input set here: the other shape comes from the file below)
    assert code == 0, out + err
    ids = np.random.default_rng(0).integers(0, 64, (3, 5))
    np.savez(tmp_path / "inputs.npz", idx=ids)
    # the file's own shape alone: the one this test is about
    code, out, err = run_cli(
        "check", target, "--model", str(tmp_path / "model.onnx"), "--no-shapes",
        "--inputs", str(tmp_path / "inputs.npz"), "--tolerance", "output=1e-4,1e-4", "-q",
    )  # fmt: skip
    assert code == 0, out + err
    assert "inputs.npz" in out and "(given, sha256" in out


@pytest.mark.gpu
def test_cuda_is_checked_where_it_runs_and_never_passed_where_it_does_not(checked):
    model = str(checked["folder"] / "export" / "model.onnx")
    args = ("check", checked["target"], "--model", model, "--ep", "cpu,cuda", "--no-torch", "-q")
    code, out, err = run_cli(*args)
    reason = unavailable_reason("cuda")
    if reason is None:  # a machine with a usable CUDA provider
        assert code == 0, out + err
        assert "ort-cuda" in out and "cuda " in out  # nodes placed on the CUDA provider
    else:
        assert code == 3, out + err
        assert "UNAVAILABLE" in out
        code, out, err = run_cli(*args, "--allow-missing-ep")
        assert code == 0 and "SKIP" in out
        passed, skipped = re.search(r"results: (\d+) pass, (\d+) skip", out).groups()
        assert passed == skipped  # every shape of the CPU passes, of CUDA skips
