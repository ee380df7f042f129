import onnx
import pytest

from tconform import registry
from tconform.config import PRESETS
from tconform.errors import UsageError
from tconform.export import ExportJob, ExportSettings, export_cases, export_jobs, read_manifest

TINY = PRESETS["tiny"]


def test_every_model_passes_the_full_checker_and_has_dynamic_axes(built):
    manifest = read_manifest(built["artifacts"])
    assert set(manifest["models"]) == set(registry.CASE_NAMES)
    for name, entry in manifest["models"].items():
        model = onnx.load(str(built["artifacts"] / name / "model.onnx"))
        onnx.checker.check_model(model, full_check=True)
        assert model.ir_version <= 10
        assert [i.name for i in model.graph.input] == entry["inputs"]
        first = model.graph.input[0].type.tensor_type.shape.dim[0]
        assert first.dim_param, f"{name}: batch axis is not dynamic"


def test_cache_reuses_and_a_config_change_re_exports(tmp_path):
    cases = (registry.get_case("norm"),)
    first = export_cases(cases, ExportSettings(TINY, exporter="torchscript"), tmp_path)
    again = export_cases(cases, ExportSettings(TINY, exporter="torchscript"), tmp_path)
    assert not first[0].cached and again[0].cached and again[0].sha256 == first[0].sha256
    changed = export_cases(
        cases, ExportSettings(TINY.replace(norm="std"), exporter="torchscript"), tmp_path
    )
    assert not changed[0].cached and changed[0].sha256 != first[0].sha256


def test_truncated_model_is_an_error_for_verify_and_rebuilt_by_export(tmp_path):
    cases = (registry.get_case("feed_forward"),)
    settings = ExportSettings(TINY, exporter="torchscript")
    export_cases(cases, settings, tmp_path)
    path = tmp_path / "feed_forward" / "model.onnx"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(UsageError, match="sha256 differs"):
        export_cases(cases, settings, tmp_path, repair=False)
    rebuilt = export_cases(cases, settings, tmp_path)
    assert not rebuilt[0].cached
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def test_bad_settings_are_usage_errors():
    with pytest.raises(UsageError, match="opset"):
        ExportSettings(TINY, exporter="torchscript", opset=21)
    with pytest.raises(UsageError, match="exporter"):
        ExportSettings(TINY, exporter="tflite")


def test_identical_models_in_two_folders_are_exported_once_and_copied(tmp_path):
    case = registry.get_case("norm")
    settings = ExportSettings(TINY, exporter="torchscript")
    a, b = tmp_path / "a", tmp_path / "b"
    first, copy = export_jobs([ExportJob(case, settings, a), ExportJob(case, settings, b)])
    assert not first.cached and copy.cached and copy.sha256 == first.sha256
    assert (a / "norm" / "model.onnx").read_bytes() == (b / "norm" / "model.onnx").read_bytes()
    assert read_manifest(b)["models"]["norm"]["key"] == first.key
    # A folder without the model is served from one that has it, in the same call.
    c = tmp_path / "c"
    _, third = export_jobs([ExportJob(case, settings, a), ExportJob(case, settings, c)])
    assert third.cached and third.location == str(c / "norm" / "model.onnx")
