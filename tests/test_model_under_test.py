"""The model under test (issue 8): `verify --model`, `--no-export`, folder roles, provenance, and
"nothing checked is never a pass". Every given file must be byte-identical afterwards."""

from __future__ import annotations

import hashlib
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tconform.files import atomic_write_json

pytestmark = pytest.mark.integration

QUIET = ("--no-doc", "-q")


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verify(cli, ws, *extra):
    return cli("verify", "--golden", str(ws["golden"]), "--artifacts", str(ws["artifacts"]), *extra)


def scaled_copy(source, target, factor=1.01):
    """A copy of `source` with its largest float initializer scaled: a model that runs but is
    wrong by about `factor` - 1."""
    model = onnx.load(str(source))
    weights = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    biggest = max(weights, key=lambda t: int(np.prod(t.dims)))
    biggest.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(biggest) * factor, biggest.name))
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(target))
    return target


# --- --model CASE=PATH -----------------------------------------------------------------------


def test_a_given_model_is_verified_as_it_is_with_provenance(cli, workspace, tmp_path):
    given = tmp_path / "mine" / "transformer.onnx"
    given.parent.mkdir()
    shutil.copy(workspace["artifacts"] / "transformer" / "model.onnx", given)
    before = sha(given)
    artifacts_before = {p: sha(p) for p in workspace["artifacts"].rglob("*.onnx")}
    report = tmp_path / "r.json"
    code, out, err = verify(
        cli,
        workspace,
        "--model",
        f"transformer={given}",
        *QUIET,
        "--json",
        str(report),
        "--junit",
        str(tmp_path / "r.xml"),
        "--markdown",
        str(tmp_path / "r.md"),
    )
    assert code == 0, out + err
    data = json.loads(report.read_text())
    ort_rows = [r for r in data["results"] if r["runtime"] == "onnxruntime"]
    assert {r["case"] for r in data["results"]} == {"transformer"}  # only the given case
    assert len(ort_rows) == 3
    for row in ort_rows:
        assert row["model"]["path"] == str(given)
        assert row["model"]["sha256"] == before
        assert row["model"]["origin"] == "given"
        assert row["model"]["opsets"]["ai.onnx"] == 18 and row["model"]["elem_type"] == "float32"
        assert row["model"]["producer"].startswith("pytorch")
    torch_rows = [r for r in data["results"] if r["runtime"] == "torch"]
    assert torch_rows and all(r["model"]["origin"] == "module" for r in torch_rows)
    golden_manifest = workspace["golden"] / "manifest.json"
    assert data["settings"]["golden_manifest_sha256"] == sha(golden_manifest)
    assert before[:12] in out and "given" in out
    junit = ET.parse(tmp_path / "r.xml").getroot()
    values = {p.get("name"): p.get("value") for p in junit.iter("property")}
    assert values["model.sha256"] in (before, values["model.sha256"])
    assert any(p.get("value") == before for p in junit.iter("property"))
    assert str(given) in (tmp_path / "r.md").read_text()
    assert sha(given) == before
    assert {p: sha(p) for p in workspace["artifacts"].rglob("*.onnx")} == artifacts_before


def test_a_wrong_given_model_fails_and_is_left_byte_identical(cli, workspace, tmp_path):
    faulty = scaled_copy(workspace["artifacts"] / "transformer" / "model.onnx", tmp_path / "f.onnx")
    before = sha(faulty)
    code, out, _ = verify(cli, workspace, "--model", f"transformer={faulty}", "--no-torch", *QUIET)
    assert code == 1 and "FAIL" in out
    assert sha(faulty) == before


def test_a_given_model_of_another_case_is_refused_naming_the_difference(cli, workspace, tmp_path):
    attention = Path(shutil.copy(workspace["artifacts"] / "attention" / "model.onnx", tmp_path))
    before = sha(attention)
    code, _, err = verify(cli, workspace, "--model", f"norm={attention}", *QUIET)
    assert code == 2 and str(attention) in err and "case 'norm'" in err
    assert len(err.strip().splitlines()) == 1
    assert sha(attention) == before


def test_a_given_model_in_the_artifacts_folder_the_run_exports_into_is_refused(cli, workspace):
    """The run may re-export that folder's models: a given file there could be rewritten (one
    case's model given for another, a manifest that no longer knows it). Refused before the
    run, naming the way on; with --no-export nothing is written, and it is verified."""
    norm = workspace["artifacts"] / "norm" / "model.onnx"
    before = norm.stat().st_mtime_ns, sha(norm)
    code, _, err = verify(cli, workspace, "--model", f"norm={norm}", "--case", "norm", *QUIET)
    assert code == 2 and "lies in the artifacts folder" in err and "--no-export" in err, err
    code, out, err = verify(
        cli, workspace, "--model", f"norm={norm}", "--case", "norm", "--no-export", *QUIET
    )
    assert code == 0, out + err
    assert (norm.stat().st_mtime_ns, sha(norm)) == before


def test_a_float16_model_gets_the_float16_row(cli, workspace, tmp_path):
    code, _, _ = cli("export", "--dtype", "float16", "--case", "norm", "--out", str(tmp_path / "h"))
    assert code == 0
    report = tmp_path / "r.json"
    code, out, err = verify(
        cli,
        workspace,
        "--model",
        f"norm={tmp_path / 'h' / 'norm' / 'model.onnx'}",
        "--no-torch",
        *QUIET,
        "--json",
        str(report),
    )
    assert code == 0, out + err
    rows = json.loads(report.read_text())["results"]
    assert {r["precision"] for r in rows} == {"float16"}
    # The row's atol, scaled down to each output's RMS where that is below 1 (docs/tolerances.md)
    for output in (r["outputs"][0] for r in rows):
        assert output["atol"] == pytest.approx(1e-2 * min(1.0, output["golden_rms"]))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.onnx", "no such file"),
        (lambda d: d, "is a folder"),
        (lambda d: _write(d / "text.onnx", b"hello, not a model"), "not an ONNX model"),
        (lambda d: _write(d / "empty.onnx", b""), "empty file"),
    ],
)
def test_bad_given_paths_are_one_line_errors(cli, workspace, tmp_path, make, message):
    path = make(tmp_path)
    code, _, err = verify(cli, workspace, "--model", f"norm={path}", *QUIET)
    assert code == 2 and message in err and str(path) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_truncated_given_model_is_refused_and_kept(cli, workspace, tmp_path):
    path = _write(
        tmp_path / "t.onnx",
        (workspace["artifacts"] / "decoder" / "model.onnx").read_bytes()[:3000],
    )
    before = sha(path)
    code, _, err = verify(cli, workspace, "--model", f"decoder={path}", *QUIET)
    assert code == 2 and str(path) in err and len(err.strip().splitlines()) == 1
    assert sha(path) == before


@pytest.mark.parametrize(
    ("location", "offset", "length", "says"),
    [
        ("../secret.bin", "0", "64", "outside the model's folder"),
        ("data\0.bin", "0", "64", "a name holding a NUL"),
        ("data.bin", "12x", "64", "external data offset as '12x', not a whole number"),
        ("data.bin", "0", "-64", "external data length as '-64', not a whole number"),
    ],
)
def test_external_data_outside_the_model_folder_or_not_a_byte_range_is_refused(
    cli, workspace, tmp_path, location, offset, length, says
):
    model = onnx.load(str(workspace["artifacts"] / "norm" / "model.onnx"))
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"\0" * 4096)
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    path = tmp_path / "m" / "model.onnx"
    path.parent.mkdir()
    (path.parent / "data.bin").write_bytes(b"\0" * 4096)
    onnx.save(model, str(path))
    report = tmp_path / "r.json"
    code, _, err = verify(cli, workspace, "--model", f"norm={path}", *QUIET, "--json", str(report))
    assert code == 2 and says in err and str(path) in err, err
    assert json.loads(report.read_text())["exit_code"] == 2


def test_external_data_that_does_not_hold_its_tensor_is_refused_before_it_is_read(
    cli, workspace, tmp_path
):
    """A tensor with no length reads the rest of its file: a file larger than the tensor (here
    sparse, 8 GiB) is named, never read whole until memory runs out."""
    model = onnx.load(str(workspace["artifacts"] / "norm" / "model.onnx"))
    path = tmp_path / "m" / "model.onnx"
    path.parent.mkdir()
    tensor = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "weights.bin"
    onnx.save(model, str(path))
    with open(path.parent / "weights.bin", "wb") as data:
        data.truncate(8 * 2**30)
    code, _, err = verify(cli, workspace, "--model", f"norm={path}", *QUIET)
    assert code == 2 and "weights.bin" in err and "its type and shape hold" in err, err


def test_a_model_with_its_external_data_beside_it_verifies_from_any_folder(
    cli, workspace, tmp_path
):
    """The external data file is looked for in the model's folder, not in the current one."""
    model = onnx.load(str(workspace["artifacts"] / "norm" / "model.onnx"))
    path = tmp_path / "ext" / "model.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)  # fmt: skip
    assert (path.parent / "model.onnx.data").stat().st_size > 0
    assert not (Path.cwd() / "model.onnx.data").exists()
    report = tmp_path / "r.json"
    code, out, err = verify(cli, workspace, "--model", f"norm={path}", *QUIET, "--no-torch",
                            "--json", str(report))  # fmt: skip
    assert code == 0, out + err
    rows = json.loads(report.read_text())["results"]
    assert all(
        r["model"]["external_data"] == {"model.onnx.data": sha(path.parent / "model.onnx.data")}
        for r in rows
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "softmax=x.onnx"), "unknown case 'softmax'"),
        (("--model", "norm"), "expected CASE=PATH"),
        (("--model", "norm=a.onnx", "--model", "norm=b.onnx"), "given twice"),
        (("--ep", ""), "names no execution provider"),
        (("--ep", ",,"), "names no execution provider"),
        (("--ep", "", "--no-torch"), "names no execution provider"),
    ],
)
def test_option_errors_are_exit_2(cli, workspace, args, message):
    code, _, err = verify(cli, workspace, *args, *QUIET)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


# --- the export cache never takes over a model it did not write ---------------------------------


def test_a_foreign_model_in_an_artifacts_folder_is_never_overwritten(cli, workspace, tmp_path):
    # The original repro: another case's model placed as norm in a folder with no manifest.
    folder = tmp_path / "M"
    (folder / "norm").mkdir(parents=True)
    placed = folder / "norm" / "model.onnx"
    shutil.copy(workspace["artifacts"] / "attention" / "model.onnx", placed)
    before = sha(placed)
    code, _, err = cli(
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(folder),
        "--case", "norm", *QUIET,
    )  # fmt: skip
    assert code == 2 and "not written by tconform" in err and "--model norm=" in err
    assert "--force" in err and sha(placed) == before
    # --no-export verifies it as it is: a signature mismatch, not a pass.
    code, _, err = cli(
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(folder),
        "--case", "norm", "--no-export", *QUIET,
    )  # fmt: skip
    assert code == 2 and "case 'norm'" in err and sha(placed) == before


def test_a_model_changed_in_place_is_not_replaced_by_verify(cli, workspace):
    path = workspace["artifacts"] / "transformer" / "model.onnx"
    scaled_copy(path, path)  # edited in place: the manifest's sha256 no longer matches
    before = sha(path)
    code, _, err = verify(cli, workspace, "--case", "transformer", *QUIET)
    assert code == 2 and "changed since tconform wrote it" in err
    assert sha(path) == before
    # --no-export runs it as given, and it fails honestly.
    code, out, _ = verify(cli, workspace, "--case", "transformer", "--no-export", *QUIET)
    assert code == 1 and "given" in out
    assert sha(path) == before


def test_no_export_verifies_the_folder_and_refuses_a_missing_model(cli, workspace, tmp_path):
    report = tmp_path / "r.json"
    code, _, _ = verify(
        cli, workspace, "--no-export", "--case", "norm", *QUIET, "--json", str(report)
    )
    assert code == 0
    rows = json.loads(report.read_text())["results"]
    assert {r["model"]["origin"] for r in rows if r["runtime"] == "onnxruntime"} == {"cached"}
    shutil.rmtree(workspace["artifacts"] / "encoder")
    code, _, err = verify(cli, workspace, "--no-export", "--case", "encoder", *QUIET)
    assert code == 2 and "missing" in err and "--no-export" in err
    assert not (workspace["artifacts"] / "encoder").exists()


# --- folder roles -------------------------------------------------------------------------------


def test_export_refuses_a_golden_folder(cli, workspace):
    before = sha(workspace["golden"] / "manifest.json")
    code, _, err = cli("export", "--out", str(workspace["golden"]), "--case", "norm")
    assert code == 2 and "is or lies in a golden folder" in err
    assert sha(workspace["golden"] / "manifest.json") == before


def test_verify_refuses_a_golden_folder_as_artifacts(cli, workspace):
    code, _, err = cli(
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(workspace["golden"]),
        "--case", "norm", *QUIET,
    )  # fmt: skip
    assert code == 2 and "is or lies in a golden folder" in err


def test_golden_force_replaces_only_golden_folders(cli, workspace, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for target in (mine, workspace["artifacts"]):
        code, _, err = cli("golden", "--force", "--case", "norm", "--out", str(target))
        assert code == 2 and "replaces only golden folders" in err
    assert (mine / "notes.txt").read_text() == "keep me"
    assert (workspace["artifacts"] / "manifest.json").exists()
    code, _, _ = cli("golden", "--force", "--case", "norm", "--out", str(workspace["golden"]))
    assert code == 0


def test_a_float16_export_does_not_switch_a_float32_folder(cli, workspace):
    manifest_before = sha(workspace["artifacts"] / "manifest.json")
    code, _, err = cli(
        "export", "--dtype", "float16", "--case", "norm", "--out", str(workspace["artifacts"])
    )
    assert code == 2 and "holds dynamo opset 18 float32 models" in err
    assert sha(workspace["artifacts"] / "manifest.json") == manifest_before


# --- nothing checked is never a pass ------------------------------------------------------------


def _edit_golden_manifest(ws, edit):
    manifest = json.loads((ws["golden"] / "manifest.json").read_text())
    edit(manifest)
    atomic_write_json(ws["golden"] / "manifest.json", manifest)


def test_a_golden_case_without_input_sets_is_exit_2(cli, workspace):
    def empty_norm(manifest):
        manifest["cases"]["norm"]["sets"] = {}
        manifest["cases"]["norm"]["sha256"] = {}

    _edit_golden_manifest(workspace, empty_norm)
    shutil.rmtree(workspace["golden"] / "norm")
    code, _, err = verify(cli, workspace, "--case", "norm", *QUIET)
    assert code == 2 and "no input sets" in err


def test_a_case_deleted_from_the_goldens_fails_verify_and_check(cli, workspace):
    _edit_golden_manifest(workspace, lambda m: m["cases"].pop("decoder"))
    shutil.rmtree(workspace["golden"] / "decoder")
    code, _, err = verify(cli, workspace, *QUIET)
    assert code == 2 and "no goldens for case 'decoder'" in err
    code, _, err = verify(cli, workspace, "--case", "decoder", *QUIET)
    assert code == 2 and "no goldens for case 'decoder'" in err
    code, out, _ = cli("golden", "--check", "--out", str(workspace["golden"]))
    assert code == 1 and "decoder" in out and "DRIFT" in out


def test_files_a_golden_case_does_not_list_are_exit_2(cli, workspace):
    extra = workspace["golden"] / "norm" / "test_data_set_9" / "output_0.pb"
    extra.parent.mkdir()
    extra.write_bytes(b"")
    code, _, err = verify(cli, workspace, "--case", "norm", *QUIET)
    assert code == 2 and str(extra) in err and "not listed" in err


def test_golden_check_compares_the_sets_too(cli, workspace):
    def drop_set(manifest):
        entry = manifest["cases"]["norm"]
        entry["sets"].pop("test_data_set_2")
        for rel in [k for k in entry["sha256"] if k.startswith("test_data_set_2/")]:
            entry["sha256"].pop(rel)

    _edit_golden_manifest(workspace, drop_set)
    shutil.rmtree(workspace["golden"] / "norm" / "test_data_set_2")
    code, out, _ = cli("golden", "--check", "--out", str(workspace["golden"]))
    assert code == 1 and "input sets differ" in out


# --- the deployed model: what ONNX Runtime's own tools make of the export -----------------------


def _fused_by_the_transformers_optimizer(source, target):
    from onnxruntime.transformers.optimizer import optimize_model

    from tconform.config import PRESETS

    cfg = PRESETS["tiny"]
    fused = optimize_model(
        str(source), model_type="bert", num_heads=cfg.n_heads, hidden_size=cfg.d_model
    )
    fused.save_model_to_file(str(target))
    return {n.op_type for n in onnx.load(str(target)).graph.node}


def _optimised_offline_by_a_session(source, target):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(target)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return {n.op_type for n in onnx.load(str(target)).graph.node}


@pytest.mark.parametrize(
    ("optimise", "fused_op"),
    [
        (_fused_by_the_transformers_optimizer, "SkipLayerNormalization"),
        (_optimised_offline_by_a_session, "FusedMatMul"),
    ],
)
def test_a_deployed_optimised_model_verifies_with_model(
    cli, workspace, tmp_path, optimise, fused_op
):
    deployed = tmp_path / "deployed.onnx"
    assert fused_op in optimise(workspace["artifacts"] / "transformer" / "model.onnx", deployed)
    before = sha(deployed)
    report = tmp_path / "r.json"
    code, out, err = verify(
        cli, workspace, "--model", f"transformer={deployed}", "--no-torch", *QUIET,
        "--json", str(report),
    )  # fmt: skip
    assert code == 0, out + err
    rows = json.loads(report.read_text())["results"]
    assert {r["model"]["sha256"] for r in rows} == {before}
    assert sha(deployed) == before


def float32_io(source, target):
    """`source` (a float16 model) behind float32 inputs and outputs, as a float16 conversion
    that keeps the IO types makes it: Casts at the edges, float16 weights inside."""
    model = onnx.load(str(source))
    graph, f16, f32 = model.graph, onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    casts_in, casts_out = [], []
    for value in graph.input:
        if value.type.tensor_type.elem_type == f16:
            inner = value.name + "_f16"
            for node in graph.node:
                node.input[:] = [inner if n == value.name else n for n in node.input]
            casts_in.append(onnx.helper.make_node("Cast", [value.name], [inner], to=f16))
            value.type.tensor_type.elem_type = f32
    for value in graph.output:
        inner = value.name + "_f16"
        for node in graph.node:
            node.output[:] = [inner if n == value.name else n for n in node.output]
        casts_out.append(onnx.helper.make_node("Cast", [inner], [value.name], to=f32))
        value.type.tensor_type.elem_type = f32
    nodes = [*casts_in, *graph.node, *casts_out]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(target))
    return target


def _verified_rows(cli, workspace, tmp_path, model: str):
    """`verify --model CASE=PATH --no-torch`: its exit code and the JSON report's results."""
    report = tmp_path / "r.json"
    code, out, err = verify(
        cli, workspace, "--model", model, "--no-torch", *QUIET, "--json", str(report)
    )
    assert code in (0, 1), out + err
    return code, json.loads(report.read_text())["results"]


def test_a_float16_model_with_float32_inputs_and_outputs_gets_the_float16_row(
    cli, workspace, tmp_path
):
    code, _, _ = cli("export", "--dtype", "float16", "--case", "norm", "--out", str(tmp_path / "h"))
    assert code == 0
    model = float32_io(tmp_path / "h" / "norm" / "model.onnx", tmp_path / "norm-f32io.onnx")
    before = sha(model)
    code, rows = _verified_rows(cli, workspace, tmp_path, f"norm={model}")
    assert code == 0
    assert {r["precision"] for r in rows} == {"float16"}
    assert {r["model"]["elem_type"] for r in rows} == {"float32"}
    assert {r["model"]["compute_elem_type"] for r in rows} == {"float16"}
    assert all(any("float16 computation with float32" in n for n in r["notes"]) for r in rows)
    assert sha(model) == before


def test_float16_weights_cast_back_to_float32_keep_the_float32_row(cli, workspace, tmp_path):
    """Every weight stored in float16 and Cast back before use: the model computes in float32,
    so it is judged by the float32 row, where the rounded weights fail."""
    model = onnx.load(str(workspace["artifacts"] / "feed_forward" / "model.onnx"))
    graph = model.graph
    casts = []
    for tensor in graph.initializer:
        if tensor.data_type == onnx.TensorProto.FLOAT and len(tensor.dims) == 2:
            half = numpy_helper.from_array(
                numpy_helper.to_array(tensor).astype(np.float16), tensor.name + "_f16"
            )
            casts.append(onnx.helper.make_node("Cast", [half.name], [tensor.name], to=1))
            tensor.CopyFrom(half)
    assert len(casts) == 2
    nodes = [*casts, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    path = tmp_path / "ff-f16-weights.onnx"
    onnx.save(model, str(path))
    report = tmp_path / "r.json"
    code, out, err = verify(cli, workspace, "--model", f"feed_forward={path}", "--no-torch",
                            *QUIET, "--json", str(report))  # fmt: skip
    assert code == 1, out + err
    rows = json.loads(report.read_text())["results"]
    assert {r["precision"] for r in rows} == {"float32"}
    assert {r["model"]["compute_elem_type"] for r in rows} == {"float32"}


def test_a_dead_int8_weight_does_not_earn_the_int8_row(cli, workspace, tmp_path):
    """norm's gain 1 % off fails the float32 row; an unused 100 000-element int8 initializer
    read by a DequantizeLinear whose output goes nowhere must not make it an int8 model (whose
    row would let the error through): the row is earned by what reaches the outputs."""
    model = onnx.load(str(workspace["artifacts"] / "norm" / "model.onnx"))
    gain = next(t for t in model.graph.initializer if t.name == "gain")
    gain.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(gain) * 1.01, "gain"))
    dead = numpy_helper.from_array(np.ones((1000, 100), np.int8), "dead_int8")
    scale = numpy_helper.from_array(np.array(0.01, np.float32), "dead_scale")
    model.graph.initializer.extend([dead, scale])
    model.graph.node.append(
        onnx.helper.make_node("DequantizeLinear", ["dead_int8", "dead_scale"], ["nowhere"])
    )
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    code, rows = _verified_rows(cli, workspace, tmp_path, f"norm={path}")
    assert code == 1
    assert {(r["precision"], r["model"]["compute_elem_type"]) for r in rows} == {("float32",) * 2}


@pytest.mark.parametrize("claim", [{"compute_type": "int8"}, {"dtype": "int8"}])
def test_an_edited_artifacts_manifest_does_not_earn_a_looser_row(cli, workspace, tmp_path, claim):
    """norm's gain 1 % off in tconform's own artifacts folder, with the manifest edited to
    match the new bytes and to claim int8: the row comes from the file, never the manifest."""
    folder = workspace["artifacts"]
    path = folder / "norm" / "model.onnx"
    model = onnx.load(str(path))
    gain = next(t for t in model.graph.initializer if t.name == "gain")
    gain.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(gain) * 1.01, "gain"))
    onnx.save(model, str(path))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["models"]["norm"].update(sha256=sha(path), **claim)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    report = tmp_path / "r.json"
    code, out, err = verify(cli, workspace, "--case", "norm", "--no-export", "--no-torch",
                            *QUIET, "--json", str(report))  # fmt: skip
    assert code == 1, out + err
    rows = json.loads(report.read_text())["results"]
    assert {(r["precision"], r["model"]["compute_elem_type"]) for r in rows} == {("float32",) * 2}
