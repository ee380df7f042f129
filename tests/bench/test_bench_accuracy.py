"""Every bench row's outputs are judged against the float64 oracle under the tolerance row of
the precision the engine computes in: torch's dynamic int8 module and ONNX Runtime's int8 graph
face the same int8 row, and a row whose outputs are off says so."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from tconform import registry
from tconform.bench.accuracy import judge_outputs, require_within_tolerance
from tconform.bench.engines import open_engine
from tconform.bench.measure import measure
from tconform.bench.report import markdown
from tconform.bench.workload import case_workload
from tconform.compare import tolerance_for
from tconform.config import PRESETS
from tconform.errors import EXIT_FAILURE, TconformError
from tconform.execution import Subject, case_module
from tconform.export import ExportJob, ExportSettings, build_module, example_shape, export_jobs
from tconform.models import model_from_record
from tconform.results import Status
from tconform.runtimes import make_runtime

TINY = PRESETS["tiny"]
CEILING = {"gemm_gflops": 100.0, "copy_bandwidth_gbs": 10.0}
TIMING = {"warmup": 0, "runs": 2, "seconds": 0.0}
CASE = registry.get_case("feed_forward")


def _measured(engine: str, subject: Subject, params, runtime: str | None = None) -> dict:
    shape = example_shape(TINY)
    workload = case_workload(CASE, TINY, params, shape.batch, shape.src_seq, {})
    opener = partial(open_engine, make_runtime(runtime or engine), subject, workload.feeds)
    return measure(workload, engine, "cpu", opener, CEILING, TIMING)


@pytest.mark.unit
def test_torch_int8_is_judged_under_the_int8_row():
    _, params = build_module(CASE, ExportSettings(TINY))
    module = Subject(module=case_module(CASE, TINY, params))
    int8 = _measured("torch-int8", module, params)["accuracy"]
    float32 = _measured("torch", module, params)["accuracy"]
    row = tolerance_for("int8", CASE.tolerance)
    assert (int8["precision"], int8["atol"], int8["min_sqnr_db"]) == ("int8", row.atol, 27.0)
    assert int8["status"] == Status.PASS
    # it really computed in int8: its error is far beyond what float32 rounding makes
    assert int8["max_abs_err"] > 100 * float32["max_abs_err"]
    assert int8["sqnr_db"] < float32["sqnr_db"] - 40
    assert float32["precision"] == "float32" and float32["status"] == Status.PASS


@pytest.mark.unit
def test_outputs_beyond_the_floor_fail_and_say_by_how_much():
    golden = {"y": np.linspace(-1.0, 1.0, 64)}
    noisy = {"y": golden["y"] + 0.05 * np.cos(np.arange(64))}  # within atol, SQNR ~ 25 dB
    judged = judge_outputs(noisy, golden, "int8", "component")
    assert judged["status"] == Status.FAIL and judged["sqnr_db"] < judged["min_sqnr_db"]
    assert judged["max_abs_err"] == pytest.approx(0.05, rel=1e-3)
    assert judge_outputs(golden, golden, "int8", "component")["status"] == Status.PASS
    # a precision without a row is not judged, and says why
    assert judge_outputs(golden, golden, "int2", "component")["status"] == Status.SKIP
    # nor is a row whose outputs hold no element (inputs of batch 0): nothing compared
    empty = {"y": np.zeros((0, 8))}
    judged = judge_outputs(empty, empty, "float32", "component")
    assert judged["status"] == Status.SKIP and "nothing compared" in judged["reason"]


@pytest.mark.unit
def test_a_timed_row_outside_its_tolerance_fails_the_bench():
    golden = {"y": np.linspace(-1.0, 1.0, 64)}
    row = {"engine": "onnxruntime-int8", "ep": "cpu", "batch": 1, "seq": 32}
    passed = {**row, "accuracy": judge_outputs(golden, golden, "int8", "component")}
    failed = {
        **row,
        "accuracy": judge_outputs({"y": golden["y"] + 0.5}, golden, "int8", "component"),
    }
    skipped = {"engine": "openvino", "ep": "cpu", "status": Status.SKIP}  # nothing judged
    require_within_tolerance([passed, skipped])  # nothing outside: no error
    with pytest.raises(TconformError) as raised:
        require_within_tolerance([passed, failed, skipped])
    assert raised.value.exit_code == EXIT_FAILURE
    message = str(raised.value)
    assert "1 timed row(s)" in message and "onnxruntime-int8/cpu at 1x32" in message
    assert "(y: 64 of 64 elements outside atol" in message  # the comparator's words: a way on
    # a user's model's row names its input set (its sequence axis may be None)
    mine = {**failed, "seq": None, "input_set": "batch-1"}
    with pytest.raises(TconformError, match="onnxruntime-int8/cpu on input set batch-1"):
        require_within_tolerance([mine])
    # a decoding row (bench --generate) has no shape of its own
    step = {"engine": "onnxruntime-int4", "ep": "cpu", "accuracy": failed["accuracy"]}
    with pytest.raises(TconformError, match="first onnxruntime-int4/cpu: max abs error"):
        require_within_tolerance([step])
    # rows judged, none comparing anything (NaN or infinite alike everywhere): exit 3, never 0
    nan = {"y": np.full(8, np.nan)}
    unseen = {**row, "accuracy": judge_outputs(nan, nan, "float32", "component")}
    assert unseen["accuracy"]["status"] == Status.SKIP
    with pytest.raises(TconformError, match="nothing checked: no timed row") as raised:
        require_within_tolerance([unseen, skipped])
    assert raised.value.exit_code == 3
    require_within_tolerance([unseen, passed])  # one row compared: judged as it is
    # the run went on: its markdown says it failed, not that it stopped early
    error = {"exit_code": EXIT_FAILURE, "message": message}
    assert "The run failed (exit 1)" in markdown({"error": error, "results": [], "settings": {}})


@pytest.mark.integration
def test_both_int8_engines_face_one_tolerance(tmp_path):
    (record,) = export_jobs([ExportJob(CASE, ExportSettings(TINY, dtype="int8"), tmp_path)])
    _, params = build_module(CASE, ExportSettings(TINY))
    graph = model_from_record(CASE, record)
    ort = _measured("onnxruntime-int8", Subject(graph), params, runtime="onnxruntime")
    torch = _measured("torch-int8", Subject(module=case_module(CASE, TINY, params)), params)
    limits = ("precision", "tolerance", "atol", "rtol", "min_sqnr_db")
    assert [ort["accuracy"][k] for k in limits] == [torch["accuracy"][k] for k in limits]
    assert ort["accuracy"]["precision"] == "int8" and ort["accuracy"]["status"] == Status.PASS


@pytest.mark.unit
def test_the_base_preset_is_judged_by_the_row_measured_there():
    """The whole model at base reaches 1.7e-5 on a clean runtime (OpenVINO f32, every node
    float32): beyond the tiny-calibrated row, within base's own; a real mistake (1e-3) fails
    both."""
    golden = {"logits": np.full((1, 4, 8), 0.5, np.float32)}
    clean = {"logits": golden["logits"] + np.float32(1.7e-5)}
    broken = {"logits": golden["logits"] + np.float32(1e-3)}
    assert tolerance_for("float32", "model", "base").atol == 1e-4
    assert tolerance_for("float32", "model", "tiny") == tolerance_for("float32", "model")
    assert judge_outputs(clean, golden, "float32", "model")["status"] == Status.FAIL
    assert judge_outputs(clean, golden, "float32", "model", "base")["status"] == Status.PASS
    assert judge_outputs(broken, golden, "float32", "model", "base")["status"] == Status.FAIL


@pytest.mark.unit
def test_a_users_atol_blind_to_the_values_is_no_pass_in_bench_either():
    """bench judges a user's model with check's own judge: an output whose given atol is at or
    above its RMS shows nothing, and the row says so instead of `pass`, as check's result does."""
    from tconform.compare import Tolerance, compare_output

    golden = {"y": np.random.default_rng(0).standard_normal(20) * 1e-6}

    def judge_under(atol: float):
        tol = Tolerance(atol, 0.0, "set by the user", given=True)
        return lambda outputs, precision: [
            compare_output(n, np.asarray(outputs[n]), g, tol) for n, g in golden.items()
        ]

    blind = judge_outputs(
        {"y": golden["y"] * 1.5}, golden, "float32", "model", judge=judge_under(1e-3)
    )
    assert blind["status"] == "skip" and "cannot see it" in blind["reason"]
    seen = judge_outputs(golden, golden, "float32", "model", judge=judge_under(1e-9))
    assert seen["status"] == "pass"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("status", "why"),
    [
        (Status.SKIP, "onnxruntime 1.17.3 reads IR version 9 at most"),  # a fact of the release
        (Status.ERROR, "OpenVINO cannot convert or compile it: ..."),  # it rejects a sound model
    ],
)
def test_a_release_that_cannot_open_the_model_is_a_row_naming_its_versions(status, why):
    """A runtime release in a worker that cannot load the model is a row with the reason: a
    skip where the release cannot read the file's IR version (ONNX Runtime 1.17 and IR 10), an
    error where it rejects a well-formed model; and the row says which exact packages said so."""
    from tconform.bench.engines import NotOpened

    shape = example_shape(TINY)
    workload = case_workload(CASE, TINY, {}, shape.batch, shape.src_seq, {})
    versions = {"onnxruntime": "1.17.3", "numpy": "1.26.4", "python": "3.11.7"}

    def not_opened():
        raise NotOpened(why, {"versions": versions}, status)

    row = measure(workload, "onnxruntime==1.17.3", "cpu", not_opened, CEILING, TIMING)
    assert row["status"] == status and row["reason"] == why
    assert row["details"]["versions"] == versions
