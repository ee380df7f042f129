"""Bad input is one line and exit 2; the generation goldens are checked for drift."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from gen_helpers import GOLDEN_DIR, TINY
from onnx import helper, numpy_helper

from tconform.export import ExportSettings, export_case
from tconform.files import sha256_file
from tconform.generation.golden import CHECKPOINT
from tconform.reference.incremental import DecoderStepModel
from tconform.registry import STEP
from tconform.weights import read_record

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--generate", "12"], "max new tokens 12"),
        (["--generate", "4", "--strategy", "beam", "--beam-width", "0"], "--beam-width"),
        (["--generate", "4", "--strategy", "beam", "--beam-width", "32"], "beam width 32"),
        (["--generate", "4", "--strategy", "sample", "--top-p", "0"], "--top-p"),
        (["--generate", "4", "--strategy", "sample", "--top-p", "1.5"], "--top-p"),
        (["--generate", "4", "--strategy", "sample", "--top-k", "0"], "--top-k"),
        (["--generate", "4", "--end-token", "31"], "end token (--end-token) 31"),
        (["--generate", "4", "--end-token", "-1"], "--end-token"),
        (["--generate", "0"], "--generate"),
    ],
)
def test_bad_generation_input_is_one_line_and_exit_2(cli, args, says):
    code, out, err = cli("bench", "--preset", "tiny", "--ep", "cpu", *args)
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert says in err
    assert "Traceback" not in err + out
    assert lines[-1].startswith(("tconform: error:", "Error:"))


def test_golden_generation_check_passes_on_the_committed_goldens(cli):
    code, out, _ = cli("golden", "--generation", "--check", "--out", str(GOLDEN_DIR))
    assert code == 0 and "matches a regeneration" in out


def _rewrite_token(folder, case: str) -> None:
    """Change one stored token and record the new file's sha256: a consistent but wrong golden."""
    from tconform.files import sha256_bytes

    path = folder / case / "test_data_set_0" / "output_0.pb"
    tokens = numpy_helper.to_array(onnx.load_tensor_from_string(path.read_bytes()))
    tokens = tokens.copy()
    tokens[0, 0] = (tokens[0, 0] + 1) % 31
    data = numpy_helper.from_array(np.asarray(tokens), "tokens").SerializeToString()
    path.write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["cases"][case]["sha256"]["test_data_set_0/output_0.pb"] = sha256_bytes(data)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_golden_generation_check_detects_tampering(cli, tmp_path):
    folder = tmp_path / "golden-generation"
    shutil.copytree(GOLDEN_DIR, folder)
    _rewrite_token(folder, "right_padding-greedy")
    code, out, _ = cli("golden", "--generation", "--check", "--out", str(folder))
    assert code == 1 and "right_padding-greedy" in out and "tokens differs" in out

    corrupt = tmp_path / "corrupt"
    shutil.copytree(GOLDEN_DIR, corrupt)
    path = corrupt / "ends-greedy" / "test_data_set_0" / "output_2.pb"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    code, _, err = cli("golden", "--generation", "--check", "--out", str(corrupt))
    assert code == 2 and "sha256" in err


def test_goldens_of_other_weights_are_drift_and_refused(cli, tmp_path):
    """A manifest recording another checkpoint sha256 (other weights) is drift for `--check`
    and refused by `verify --generation` before anything is exported; one recording no
    checkpoint (seeded weights, before the checkpoint) is refused by both."""
    folder = tmp_path / "golden-generation"
    shutil.copytree(GOLDEN_DIR, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    recorded = manifest["checkpoint"]
    assert recorded == {"name": CHECKPOINT, "sha256": read_record(CHECKPOINT)["sha256"]}
    manifest["checkpoint"] = {**recorded, "sha256": "0" * 64}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    code, out, _ = cli("golden", "--generation", "--check", "--out", str(folder))
    assert code == 1 and "checkpoint 'reverse'" in out and "DRIFT" in out
    artifacts = tmp_path / "artifacts"
    code, _, err = cli(
        "verify", "--generation", "--golden-generation", str(folder), "--artifacts", str(artifacts)
    )
    assert code == 2 and "remake the goldens" in err and not artifacts.exists()
    del manifest["checkpoint"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    for args in (["golden", "--generation", "--check", "--out"], ["verify", "--generation",
                 "--artifacts", str(artifacts), "--golden-generation"]):  # fmt: skip
        code, _, err = cli(*args, str(folder))
        assert code == 2 and "records no checkpoint" in err, args


def test_golden_generation_writes_a_checkable_folder(cli, tmp_path):
    folder = tmp_path / "fresh"
    code, out, _ = cli("golden", "--generation", "--out", str(folder))
    assert code == 0 and "16 generation goldens" in out
    assert cli("golden", "--generation", "--out", str(folder))[0] == 2  # no silent overwrite
    assert cli("golden", "--generation", "--check", "--out", str(folder))[0] == 0


def test_bench_generate_reports_per_token_figures_floor_and_plot(cli, tmp_path):
    """`bench --generate` on the tiny preset: every engine row carries the per-token figures,
    where the cache lived, and the floor; the JSON and the plot are written. (Its models hold
    seeded weights, a folder of their own: the goldens' hold the checkpoint's.)"""
    report_path, plot = tmp_path / "gen.json", tmp_path / "gen.png"
    code, out, err = cli(
        "bench", "--preset", "tiny", "--ep", "cpu", "--generate", "4", "--threads", "1",
        "--artifacts", str(tmp_path / "bench"),
        "--json", str(report_path), "--plot", str(plot),
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(report_path.read_text())
    rows = {row["engine"]: row for row in report["rows"]}
    assert set(rows) == {"onnxruntime", "torch"}
    assert {row["cache_on"] for row in rows.values()} == {"numpy"}  # IO binding is for CUDA
    for row in rows.values():
        assert len(row["cached_by_prefix_ms"]) == len(row["no_cache_by_prefix_ms"]) == 4
        assert 0 < row["cached_p50_ms"] <= row["cached_p90_ms"]
        assert row["cache_bytes"] > 0 and row["floor_ratio"] > 0 and row["tokens_per_s"] > 0
        # judged against the float64 oracle's steps, fed its tokens
        assert row["precision"] == "float32" and row["accuracy"]["status"] == "pass"
        assert row["ep"] == "cpu"
        assert row["step_weight_bytes"] > 0 and row["memory_floor_ms"] > 0
    assert rows["torch"]["vs_torch_cached"] == 1.0
    # every row names the exact bytes of the three models it decoded with
    ran = rows["onnxruntime"]["models"]
    assert set(ran) == {"gen_encoder", "gen_step", "gen_prefix"}
    for model in ran.values():
        assert len(model["sha256"]) == 64 and model["origin"] in {"exported", "cached"}
    assert report["fastest_verified"]["engine"] in rows
    assert report["memory_floor_ms"] > 0 and "memory floor per token" in out
    assert plot.read_bytes().startswith(b"\x89PNG")


class ShiftedStep(DecoderStepModel):
    """A decoder step whose positional encoding is one position off."""

    def position_encoding(self, position):
        return super().position_encoding(position + 1)


def test_a_given_decoder_step_model_is_verified_read_only(cli, generation_artifacts, tmp_path):
    """`verify --generation --model gen_step=PATH`: an off-by-one position decoder fails every
    golden of its mask fill (greedy, beam and sampled alike), names itself as given in every
    cached row, and is left as it was."""
    wrong = tmp_path / "step.onnx"
    record = export_case(
        replace(STEP, build=ShiftedStep), ExportSettings(TINY, checkpoint=CHECKPOINT), tmp_path
    )
    shutil.copyfile(record.staged, wrong)
    before = sha256_file(wrong)
    report = tmp_path / "report.json"
    code, out, err = cli(
        "verify", "--generation", "--golden-generation", str(GOLDEN_DIR), "--ep", "cpu",
        "--no-torch", "--artifacts", str(generation_artifacts), "--model", f"gen_step={wrong}",
        "--json", str(report), "-q",
    )  # fmt: skip
    assert code == 1, out + err
    assert sha256_file(wrong) == before
    results = json.loads(report.read_text())["results"]
    given = [r for r in results if r["model"]["origin"] == "given"]
    assert given and all(r["model"]["sha256"] == before for r in given)
    assert all("with the key/value cache" in r["component"] for r in given)
    assert {r["status"] for r in given} == {"fail"}
    # The whole-prefix decoder is tconform's own export, and still passes.
    assert {r["status"] for r in results if "without a cache" in r["component"]} == {"pass"}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--case", "norm"], "no generation golden 'norm'; choose from ends-beam3"),
        (["--model", "norm=x.onnx"], "unknown generation model 'norm'"),
        (["--model", "gen_step=missing.onnx"], "missing.onnx: no such file"),
        (["--no-export", "--artifacts", "EMPTY"], "missing (--no-export exports nothing"),
        (["--localise"], "--generation judges decoded tokens"),
        (["--matrix"], "--generation has no matrix"),
    ],
)
def test_generation_options_are_honoured_or_refused(cli, tmp_path, args, says):
    args = [str(tmp_path / "empty") if a == "EMPTY" else a for a in args]
    code, out, err = cli("verify", "--generation", "--golden-generation", str(GOLDEN_DIR), *args)
    assert code == 2 and says in err, err
    assert "Traceback" not in out + err
    assert not (tmp_path / "empty").exists() or not any((tmp_path / "empty").iterdir())


def _degenerate_step(source: Path, target: Path, value: float) -> None:
    """The decoder step with its log-probabilities replaced by `value` everywhere."""
    model = onnx.load(str(source))
    graph = model.graph
    for node in graph.node:
        node.output[:] = ["log_probs_raw" if o == "log_probs" else o for o in node.output]
    fill = numpy_helper.from_array(np.array([value], np.float32))
    graph.node.extend(
        [
            helper.make_node("Shape", ["log_probs_raw"], ["log_probs_shape"]),
            helper.make_node("ConstantOfShape", ["log_probs_shape"], ["log_probs"], value=fill),
        ]
    )
    onnx.save(model, str(target))


@pytest.mark.parametrize(("value", "says"), [(-np.inf, "-inf for every token"), (np.nan, "")])
def test_a_step_model_of_no_distribution_fails_verify_generation(
    cli, tmp_path, generation_artifacts, value, says
):
    """A decoder step whose log-probabilities are -inf everywhere (no distribution) or NaN: every
    strategy (greedy, beam, sampling) fails it with a message; nothing crashes (issue 20)."""
    step = tmp_path / "step.onnx"
    _degenerate_step(generation_artifacts / "generation" / "gen_step" / "model.onnx", step, value)
    before = sha256_file(step)
    report = tmp_path / "g.json"
    code, out, err = cli(
        "verify", "--generation", "--golden-generation", str(GOLDEN_DIR),
        "--ep", "cpu", "--no-torch", "--artifacts", str(generation_artifacts),
        "--model", f"gen_step={step}", "--json", str(report), "-q",
    )  # fmt: skip
    assert code == 1, out + err
    assert "Traceback" not in out + err and not err.strip()
    data = json.loads(report.read_text(), parse_constant=lambda name: pytest.fail(name))
    given = [r for r in data["results"] if r["model"]["origin"] == "given"]
    assert given and {r["status"] for r in given} == {"fail"}
    strategies = {r["component"].split(",")[1].strip() for r in given}
    assert {"greedy", "beam3"} <= strategies and any(s.startswith("sample") for s in strategies)
    assert all(says in r["message"] for r in given)
    assert sha256_file(step) == before
