"""The int8 and bfloat16 dtypes: made with the field's tools (onnxruntime.quantization; torch
export in bfloat16), recorded in the manifest and the cache key, recognised as what they
compute in, and judged by their own rows on the runtimes that run them."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tconform import registry
from tconform.config import PRESETS
from tconform.errors import UsageError
from tconform.export import ExportSettings, cache_key, export_cases
from tconform.models import derived_file, given_model, model_from_record
from tconform.provenance import quantized_share
from tconform.weights import load_checkpoint

pytestmark = pytest.mark.integration

TINY = PRESETS["tiny"]
GOLDEN = Path(__file__).resolve().parents[1] / "golden"  # the committed tiny goldens
CASES = tuple(registry.get_case(n) for n in ("feed_forward", "positional_encoding", "embedding"))


@pytest.fixture(scope="module")
def int8(tmp_path_factory):
    folder = tmp_path_factory.mktemp("int8")
    return folder, export_cases(CASES, ExportSettings(TINY, dtype="int8"), folder)


def test_int8_is_onnxruntimes_quantisation_recorded_and_read_back(int8):
    folder, records = int8
    ff, pe, _ = records
    manifest = json.loads((folder / "manifest.json").read_text())
    entry = manifest["models"]["feed_forward"]
    assert manifest["dtype"] == "int8" and entry["quantization"]["reduce_range"] is True
    graph = onnx.load(str(folder / "feed_forward" / "model.onnx"))
    ops = {n.op_type for n in graph.graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops and "MatMul" not in ops
    assert quantized_share(graph) > 0.9
    # What it computes in, read from the file: int8 for the quantised feed-forward, float32
    # for the positional encoding (no weight to quantise), int8 for the embedding (its int8
    # table is gathered, then dequantised).
    pairs = zip(CASES, records, strict=True)
    read = [model_from_record(case, record).precision for case, record in pairs]
    assert read == ["int8", "float32", "int8"]
    as_given = given_model(registry.get_case("feed_forward"), TINY, folder / ff.path)
    assert as_given.precision == "int8" and as_given.io_type == "float32"
    assert derived_file(folder / pe.path).precision == "float32"
    # The quantiser's settings are part of the cache key; float32 and int8 never share one.
    f32 = ExportSettings(TINY)
    assert cache_key(CASES[0], f32) != cache_key(CASES[0], ExportSettings(TINY, dtype="int8"))


def test_int8_and_bfloat16_verify_under_their_own_rows(int8, cli, tmp_path):
    folder, _ = int8
    common = ("--golden", str(GOLDEN), "--no-doc", "--no-torch", "--json")
    code, out, err = cli(
        "verify", "--artifacts", str(folder), *common, str(tmp_path / "int8.json"),
        "--case", "feed_forward", "--case", "positional_encoding",
        "--runtime", "onnxruntime", "--runtime", "openvino",
    )  # fmt: skip
    assert code == 0, out + err
    results = json.loads((tmp_path / "int8.json").read_text())["results"]
    precisions = {(r["case"], r["runtime"]): r["precision"] for r in results}
    assert precisions[("feed_forward", "onnxruntime")] == "int8"
    assert precisions[("feed_forward", "openvino")] == "int8"
    assert precisions[("positional_encoding", "onnxruntime")] == "float32"
    ff = [o for r in results if r["case"] == "feed_forward" for o in r["outputs"]]
    assert all(o["min_sqnr_db"] == 27.0 and o["sqnr_db"] > 27.0 for o in ff)

    export_cases(CASES[:1], ExportSettings(TINY, dtype="bfloat16"), tmp_path / "b")
    code, out, err = cli(
        "verify", "--artifacts", str(tmp_path / "b"), *common, str(tmp_path / "b.json"),
        "--case", "feed_forward", "--runtime", "onnxruntime", "--runtime", "openvino",
    )  # fmt: skip
    assert code == 0, out + err
    results = json.loads((tmp_path / "b.json").read_text())["results"]
    by_runtime = {r["runtime"]: r for r in results}
    # ONNX Runtime's CPU provider has no bfloat16 MatMul: a skip with the reason, never a pass.
    assert by_runtime["onnxruntime"]["status"] == "skip"
    assert "no bfloat16 kernel for MatMul" in by_runtime["onnxruntime"]["message"]
    ov = by_runtime["openvino"]
    assert ov["status"] == "pass" and ov["precision"] == "bfloat16"
    assert ov["model"]["elem_type"] == "bfloat16"


def test_a_checkpoint_export_holds_the_trained_weights(tmp_path):
    case = registry.generation_case("gen_encoder")  # the encoder: the quickest to export
    settings = ExportSettings(TINY, checkpoint="reverse")
    assert cache_key(case, settings) != cache_key(case, ExportSettings(TINY))
    (record,) = export_cases((case,), settings, tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["checkpoint"] == "reverse" and record.checkpoint == "reverse"
    _, params = load_checkpoint("reverse")
    graph = onnx.load(record.location)
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in graph.graph.initializer}
    table = params["src_embed.table"].astype(np.float32)
    assert any(v.shape == table.shape and np.array_equal(v, table) for v in stored.values())
    with pytest.raises(UsageError, match="holds no parameter"):
        export_cases((registry.get_case("norm"),), settings, tmp_path / "norm")
    with pytest.raises(UsageError, match="another config"):
        ExportSettings(TINY.replace(d_model=32, n_heads=4), checkpoint="reverse")
    with pytest.raises(UsageError, match="another config"):  # a run setting, but not the fill
        ExportSettings(TINY.replace(norm_eps=1e-5), checkpoint="reverse")
    # The mask fill decides only fully masked rows: the trained weights serve either fill.
    assert ExportSettings(TINY.replace(mask_fill="-1e9"), checkpoint="reverse").checkpoint
    with pytest.raises(UsageError, match="unknown checkpoint"):
        ExportSettings(TINY, checkpoint="no-such")


def test_int4_is_onnxruntimes_weight_only_quantisation_judged_by_its_own_row(cli, tmp_path):
    """--dtype int4: MatMulNBits from onnxruntime.quantization's 4-bit quantiser, recorded,
    read back as int4 from the file, and verified under the int4 row on ONNX Runtime and
    OpenVINO; onnx.reference has no MatMulNBits: a skip with the reason, never a pass."""
    folder = tmp_path / "int4"
    (record,) = export_cases(CASES[:1], ExportSettings(TINY, dtype="int4"), folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["models"]["feed_forward"]["quantization"]["bits"] == 4
    graph = onnx.load(record.location)
    ops = [n.op_type for n in graph.graph.node]
    assert ops.count("MatMulNBits") == 2 and "MatMul" not in ops
    assert model_from_record(CASES[0], record).precision == "int4"
    assert quantized_share(graph) > 0.9
    assert given_model(CASES[0], TINY, Path(record.location)).precision == "int4"
    f32 = ExportSettings(TINY)
    assert cache_key(CASES[0], f32) != cache_key(CASES[0], ExportSettings(TINY, dtype="int4"))
    code, out, err = cli(
        "verify", "--artifacts", str(folder), "--golden", str(GOLDEN), "--no-doc",
        "--no-torch", "--json", str(tmp_path / "int4.json"), "--case", "feed_forward",
        "--runtime", "onnxruntime", "--runtime", "openvino", "--runtime", "onnx-reference",
    )  # fmt: skip
    assert code == 0, out + err
    results = json.loads((tmp_path / "int4.json").read_text())["results"]
    judged = [r for r in results if r["runtime"] != "onnx-reference"]
    assert judged and all(r["status"] == "pass" and r["precision"] == "int4" for r in judged)
    assert all(o["min_sqnr_db"] == 9.0 for r in judged for o in r["outputs"])
    reference = [r for r in results if r["runtime"] == "onnx-reference"]
    assert all(r["status"] == "skip" and "MatMulNBits" in r["message"] for r in reference)
