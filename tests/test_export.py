"""Export: the checker-clean models, the cache key, and a cache that only replaces its own
unchanged files."""

import onnx
import pytest

from tconform import golden, registry
from tconform.config import PRESETS
from tconform.errors import UsageError
from tconform.export import (
    ExportJob,
    ExportSettings,
    export_cases,
    export_jobs,
    pool,
    read_artifacts_manifest,
)
from tconform.files import atomic_write_json

pytestmark = pytest.mark.integration

TINY = PRESETS["tiny"]


def test_every_model_passes_the_full_checker_and_has_dynamic_axes(built):
    manifest = read_artifacts_manifest(built["artifacts"])
    assert set(manifest["models"]) == set(registry.case_names())
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


def test_a_changed_model_is_never_replaced_unless_forced(tmp_path):
    cases = (registry.get_case("feed_forward"),)
    settings = ExportSettings(TINY, exporter="torchscript")
    export_cases(cases, settings, tmp_path)
    path = tmp_path / "feed_forward" / "model.onnx"
    path.write_bytes(path.read_bytes()[:100])
    changed = path.read_bytes()
    with pytest.raises(UsageError, match="changed since tconform wrote it") as raised:
        export_cases(cases, settings, tmp_path)
    assert "--model feed_forward=" in str(raised.value) and "--force" in str(raised.value)
    # Even a stale cache key (another torch, another tconform) does not unlock it.
    with pytest.raises(UsageError, match="changed since"):
        export_cases(
            cases, ExportSettings(TINY.replace(ffn_bias=False), exporter="torchscript"), tmp_path
        )
    assert path.read_bytes() == changed
    rebuilt = export_cases(cases, settings, tmp_path, force=True)
    assert not rebuilt[0].cached
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def test_a_file_tconform_did_not_write_is_never_replaced(tmp_path):
    norm, attention = registry.get_case("norm"), registry.get_case("attention")
    settings = ExportSettings(TINY, exporter="torchscript")
    export_cases((attention,), settings, tmp_path / "src")
    foreign = tmp_path / "M" / "norm" / "model.onnx"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes((tmp_path / "src" / "attention" / "model.onnx").read_bytes())
    before = foreign.read_bytes()
    with pytest.raises(UsageError, match="not written by tconform"):  # a folder with no manifest
        export_cases((norm,), settings, tmp_path / "M")
    export_cases((attention,), settings, tmp_path / "M")  # now the folder has a manifest
    with pytest.raises(UsageError, match=r"no entry in manifest\.json"):
        export_cases((norm,), settings, tmp_path / "M")
    assert foreign.read_bytes() == before
    # a folder of the user's own files and no manifest is nobody's: nothing goes there
    (tmp_path / "U").mkdir()
    (tmp_path / "U" / "notes.txt").write_text("the user's\n")
    with pytest.raises(UsageError, match=r"holds 'notes\.txt' and no artifacts manifest"):
        export_cases((norm,), settings, tmp_path / "U")
    assert sorted(p.name for p in (tmp_path / "U").iterdir()) == ["notes.txt"]


def test_a_stale_own_unchanged_model_is_re_exported(tmp_path):
    cases = (registry.get_case("norm"),)
    settings = ExportSettings(TINY, exporter="torchscript")
    export_cases(cases, settings, tmp_path)
    manifest = read_artifacts_manifest(tmp_path)
    manifest["models"]["norm"]["key"] = "0" * 64  # another tconform or torch
    atomic_write_json(tmp_path / "manifest.json", manifest)
    again = export_cases(cases, settings, tmp_path)
    assert (
        not again[0].cached
        and read_artifacts_manifest(tmp_path)["models"]["norm"]["key"] == again[0].key
    )


def test_a_folder_holds_one_exporter_opset_and_dtype(tmp_path):
    cases = (registry.get_case("norm"),)
    export_cases(cases, ExportSettings(TINY, exporter="torchscript"), tmp_path)
    for other in (
        ExportSettings(TINY, exporter="torchscript", dtype="float16"),
        ExportSettings(TINY, exporter="torchscript", opset=17),
    ):
        with pytest.raises(UsageError, match="holds torchscript opset 18 float32 models"):
            export_cases(cases, other, tmp_path)


def test_models_never_go_into_a_golden_folder(tmp_path):
    golden.write(tmp_path / "g", TINY, 1, (registry.get_case("norm"),), "tiny")
    with pytest.raises(UsageError, match="is or lies in a golden folder"):
        export_cases((registry.get_case("norm"),), ExportSettings(TINY), tmp_path / "g")


def test_bad_settings_are_usage_errors():
    with pytest.raises(UsageError, match="opset"):
        ExportSettings(TINY, exporter="torchscript", opset=21)
    with pytest.raises(UsageError, match="exporter"):
        ExportSettings(TINY, exporter="tflite")


def test_identical_models_in_two_folders_are_exported_once_and_copied(tmp_path, monkeypatch):
    case = registry.get_case("norm")
    settings = ExportSettings(TINY, exporter="torchscript")
    a, b = tmp_path / "a", tmp_path / "b"
    exports = []
    real_export_case = pool.export_case
    monkeypatch.setattr(
        pool, "export_case", lambda *args: exports.append(args) or real_export_case(*args)
    )
    first, copy = export_jobs([ExportJob(case, settings, a), ExportJob(case, settings, b)])
    assert len(exports) == 1 and copy.sha256 == first.sha256
    assert not first.cached and not copy.cached  # both files were written by this run
    assert (a / "norm" / "model.onnx").read_bytes() == (b / "norm" / "model.onnx").read_bytes()
    assert read_artifacts_manifest(b)["models"]["norm"]["key"] == first.key
    # A folder without the model is served from one that has it, in the same call.
    c = tmp_path / "c"
    reused, third = export_jobs([ExportJob(case, settings, a), ExportJob(case, settings, c)])
    assert reused.cached and len(exports) == 1
    assert third.location == str(c / "norm" / "model.onnx") and third.sha256 == first.sha256


def test_workers_are_kept_between_calls_and_relative_folders_follow_the_caller(
    tmp_path, monkeypatch
):
    """A second call reuses the first's warm worker processes, and a relative folder means
    the folder the caller is in now, not where the workers were started."""
    settings = ExportSettings(TINY, exporter="torchscript")
    names = ("norm", "feed_forward")
    jobs = [ExportJob(registry.get_case(n), settings, tmp_path / "a") for n in names]
    export_jobs(jobs, workers=2)
    workers = {p.pid for p in pool._Workers.pool._pool}
    monkeypatch.chdir(tmp_path / "a")
    others = ("embedding", "output_head")  # not current anywhere: both exported by workers
    later = [ExportJob(registry.get_case(n), settings, pool.Path("b")) for n in others]
    records = export_jobs(later, workers=2)
    assert {p.pid for p in pool._Workers.pool._pool} == workers
    assert not any(r.cached for r in records)
    assert [r.location for r in records] == [str(pool.Path("b", n, "model.onnx")) for n in others]
    assert all((tmp_path / "a" / "b" / n / "model.onnx").is_file() for n in others)


def _own_layout(folder):
    """What tconform's other commands leave in the default artifacts folder before any export:
    their locks, check's exports, the document checks', the bench's and the generation models."""
    for lock in (".generation.lock", "check/.mine.model.lock", "bench/.tiny.lock"):
        (folder / lock).parent.mkdir(parents=True, exist_ok=True)
        (folder / lock).write_bytes(b"")
    for marker in (
        "check/mine.model/check.json",
        "doc/doc001/manifest.json",
        "bench/tiny/manifest.json",
        "bench/base/generation/manifest.json",
        "generation/manifest.json",
        "generation-fill-1000000000.0/manifest.json",
    ):
        (folder / marker).parent.mkdir(parents=True, exist_ok=True)
        (folder / marker).write_text("{}")


def test_the_default_folder_after_other_commands_takes_exports(tmp_path):
    """Whichever command ran first (check, bench, verify --generation), export and verify go
    on in the same artifacts folder; a user's file among them, or a link at a lock's name, is
    still refused."""
    cases, settings = (registry.get_case("norm"),), ExportSettings(TINY, exporter="torchscript")
    _own_layout(tmp_path / "A")
    export_cases(cases, settings, tmp_path / "A")
    assert (tmp_path / "A" / "norm" / "model.onnx").is_file()

    _own_layout(tmp_path / "B")
    (tmp_path / "B" / "bench" / "tiny-notes.txt").write_text("the user's\n")
    with pytest.raises(UsageError, match=r"holds 'bench' and no artifacts manifest"):
        export_cases(cases, settings, tmp_path / "B")
    _own_layout(tmp_path / "C")
    (tmp_path / "C" / ".elsewhere.lock").symlink_to(tmp_path / "B")
    with pytest.raises(UsageError, match=r"holds '\.elsewhere\.lock' and no artifacts manifest"):
        export_cases(cases, settings, tmp_path / "C")
