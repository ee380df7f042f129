"""`tconform bench PACKAGE.MODULE:FACTORY`: a user's model timed on ONNX Runtime's graph variants
of its dtype cells and on torch, each row judged against the model's float64 copy under the
tolerance row of the precision it computed in. A model that float16 cannot hold shows
that row failing, and `best` passes over it; the report keeps its schema (input sets, null
axes the model lacks); tconform's own cases, shapes and graphs are refused for a user's model,
one line each, as is an input set the model does not have."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from tconform.bench import ceiling
from tconform.bench.compare import compare_reports, load_report
from tconform.bench.engines import MODULE_ENGINES, parse_engines
from tconform.bench.report import BenchReport, write_json, write_markdown, write_plot
from tconform.bench.run import bench_settings, module_elsewhere
from tconform.bench.workload import Workload
from tconform.commands.bench import bench_in_child
from tconform.errors import EXIT_USAGE, UsageError
from tconform.request import Tolerances, UserModel
from tconform.runtimes import ModuleTarget

# A user's package in the current folder. `gains` multiplies by 1e5, beyond float16's largest
# value (65504): its float16 conversion clamps the constant (onnxruntime.transformers.float16's
# max_finite_val), and every output comes out 0.66 times what it should be.
FACTORIES = """
import torch
from torch import nn

class Gains(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("gain", torch.tensor(1e5))

    def forward(self, x):
        return self.fc(x) * self.gain

def gains():
    torch.manual_seed(0)
    return Gains(), torch.randn(3, 8)

class Padded(nn.Module):
    def forward(self, x, mask):
        beyond = x * 1e20 * 1e20  # infinite in float32, finite in the float64 copy
        return torch.where(mask[..., None] == 0, beyond, x)

def padded():
    torch.manual_seed(0)
    mask = torch.ones(2, 4, dtype=torch.long)
    mask[0, :2] = 0  # left padding
    return Padded(), (torch.randn(2, 4, 3), mask)

def ends_itself():
    import os
    os._exit(0)

def module_only():
    torch.manual_seed(0)
    return nn.Linear(8, 8)
"""


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    (tmp_path / "user_models_for_bench.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)
    return "user_models_for_bench"


def settings(target: str, *engines: str, input_sets=(), tolerances=None, **model):
    """Bench settings for a user's model (`model`: UserModel's inputs, padding_mask, model)."""
    return bench_settings(
        None, (), (), engines, "cpu", 1, {}, 0, 2, 0.05, None,
        module=UserModel(target, **model), input_sets=input_sets, tolerances=tolerances,
    )  # fmt: skip


@pytest.mark.unit
def test_a_users_model_has_only_its_own_graph_variants():
    assert parse_engines((), for_module=True) == MODULE_ENGINES
    assert {"torch", "torch-compile", "torch-int8", "onnxruntime-int8"} <= set(MODULE_ENGINES)
    with pytest.raises(UsageError, match="'onnxruntime-sdpa' times a graph only tconform's"):
        parse_engines(("onnxruntime-sdpa",), for_module=True)
    with pytest.raises(UsageError, match="--shape chooses among tconform's own cases"):
        bench_settings(
            None, (), ((1, 4),), (), "cpu", 1, {}, 0, 2, 0.05, None, module=UserModel("a:b")
        )
    with pytest.raises(UsageError, match="--input-set names the input sets of a user's model"):
        bench_settings("tiny", (), (), (), "cpu", 1, {}, 0, 2, 0.05, None, input_sets=("x",))
    plain = settings("a.b:c", "torch")
    assert plain.exports == ()  # nothing exported for torch alone
    assert plain.module.shapes is False  # the example's shape only: no other shape is made
    assert settings("a.b:c", "torch", input_sets=("batch-1",)).module.shapes is True


@pytest.mark.unit
def test_a_module_on_a_provider_the_run_does_not_time_has_skipped_torch_rows():
    on_cuda = Workload("m", "model", 1, None, {}, dict, ModuleTarget(dict, ()), input_set="example",
                       module_ep="cuda")  # fmt: skip
    engines = ("onnxruntime", "torch", "torch-int8")
    rows = module_elsewhere(engines, ("cpu",), on_cuda)
    assert [(r["engine"], r["ep"], r["status"]) for r in rows] == [
        ("torch", "cuda", "skip"), ("torch-int8", "cuda", "skip"),
    ]  # fmt: skip
    assert "the module is on cuda" in rows[0]["reason"] and rows[0]["input_set"] == "example"
    assert module_elsewhere(engines, ("cpu", "cuda"), on_cuda) == []


@pytest.mark.integration
def test_every_row_is_judged_and_best_passes_over_a_failing_conversion(
    user_package, tmp_path, monkeypatch
):
    # A small ceiling measurement keeps the test fast; its value is not asserted.
    monkeypatch.setattr(ceiling, "GEMM_SIZE", 128)
    monkeypatch.setattr(ceiling, "COPY_BYTES", 2**20)
    monkeypatch.setattr(ceiling, "PROBE_SECONDS", 0.1)
    target = f"{user_package}:gains"
    chosen = settings(
        target, "onnxruntime", "onnxruntime-fp16", "torch", input_sets=("example", "batch-1")
    )
    sent: list = []
    # The child's work, in this process; each message pickled as the pipe to the command does.
    report = bench_in_child(
        lambda message: sent.append(pickle.loads(pickle.dumps(message))), chosen
    )

    rows = {(r["engine"], r["input_set"]): r for r in report["results"]}
    assert set(rows) == {
        (e, s) for e in ("onnxruntime", "onnxruntime-fp16", "torch") for s in ("example", "batch-1")
    }
    for (engine, input_set), row in rows.items():
        assert row["status"] == "pass" and row["case"] == target, row
        assert (row["batch"], row["seq"]) == ((3 if input_set == "example" else 1), None)
        assert row["tokens_per_s"] is None  # no sequence axis: no tokens to count
        assert row["gflop"] == pytest.approx(2 * row["batch"] * 8 * 8 / 1e9)
        judged = row["accuracy"]
        assert judged["precision"] == row["precision"] and judged["tolerance"] == "model"
        expected = "fail" if engine == "onnxruntime-fp16" else "pass"
        assert judged["status"] == expected, (engine, judged)
    fp16 = rows[("onnxruntime-fp16", "example")]
    assert fp16["precision"] == "float16" and fp16["details"]["dtype"] == "float16"
    assert fp16["details"]["sha256"] == report["settings"]["model"]["files"]["float16"]["sha256"]
    assert rows[("onnxruntime", "batch-1")]["weight_bytes_from"] == "engine"  # batch 1: a floor
    for best in report["best"]:  # the float16 row never wins, however fast it ran
        assert best["best_engine"] == "onnxruntime"
        assert best["best_torch_engine"] == "torch" and "vs_best_torch" in best
    assert {b["input_set"] for b in report["best"]} == {"example", "batch-1"}

    # The command's process receives the report as it grows, and last as it ends.
    snapshots = [payload for kind, payload in sent if kind == "report"]
    assert [len(s["results"]) for s in snapshots] == [0, 1, 2, 3, 4, 5, 6, 6]
    assert snapshots[-1] == report
    assert any(kind == "progress" and "float64 copy" in line for kind, line in sent)

    written = BenchReport(data=report)
    # each row's verdict is a column of the table, not only a field of the JSON
    verdicts = {
        line.split()[1]: line.split()[4]
        for line in written.render().splitlines()
        if line.startswith(target) and line.split()[2] == "cpu"  # the table's rows
    }
    assert verdicts == {"onnxruntime": "pass", "onnxruntime-fp16": "fail", "torch": "pass"}
    write_json(tmp_path / "b.json", written)
    write_markdown(tmp_path / "b.md", written)
    write_plot(tmp_path / "b.png", written)
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["schema"] == "tconform-bench/5" and data["settings"]["module"] == target
    assert data["settings"]["input_sets"] == ["example", "batch-1"]
    assert data["settings"]["model"]["reference"] == "float64"
    assert "preset" not in data["settings"]
    assert f"model `{target}`" in (tmp_path / "b.md").read_text()
    assert "| onnxruntime-fp16 | cpu | float16 | fail |" in (tmp_path / "b.md").read_text()
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    # A report of a model compares with itself: every row, its input set the shape.
    again = load_report(tmp_path / "b.json")
    compared = compare_reports(again, again)
    assert len(compared) == len(rows) and {r["input_set"] for r in compared} == {
        "example",
        "batch-1",
    }


@pytest.mark.integration
def test_the_tolerance_a_user_sets_judges_the_rows_as_in_check(user_package, monkeypatch):
    """`gains`' float16 conversion is 0.66 times what it should be: failed by the float16
    row, passed under an rtol of 0.5 the user set, as check would judge it."""
    monkeypatch.setattr(ceiling, "GEMM_SIZE", 128)
    monkeypatch.setattr(ceiling, "COPY_BYTES", 2**20)
    monkeypatch.setattr(ceiling, "PROBE_SECONDS", 0.1)
    loose = Tolerances(rtol=0.5)
    chosen = settings(f"{user_package}:gains", "onnxruntime-fp16", tolerances=loose)
    (row,) = bench_in_child(lambda message: None, chosen)["results"]
    assert row["accuracy"]["status"] == "pass", row["accuracy"]
    with pytest.raises(UsageError, match="judge a user's model"):
        bench_settings("tiny", (), (), (), "cpu", 1, {}, 0, 2, 0.05, None, tolerances=loose)


@pytest.mark.integration
def test_a_padding_mask_leaves_the_padded_positions_out_of_each_rows_verdict(
    user_package, monkeypatch
):
    """`bench PKG:FACTORY --padding-mask mask` judges the rows as check does: `padded` is
    garbage (infinite in float32) at its padded positions only, a failed row without the
    mask and a pass with it; it was not an option of bench."""
    monkeypatch.setattr(ceiling, "GEMM_SIZE", 128)
    monkeypatch.setattr(ceiling, "COPY_BYTES", 2**20)
    monkeypatch.setattr(ceiling, "PROBE_SECONDS", 0.1)
    target, sets = f"{user_package}:padded", ("example",)
    verdicts = {}
    for mask in (None, "mask"):
        chosen = settings(target, "torch", input_sets=sets, padding_mask=mask)
        (row,) = bench_in_child(lambda message: None, chosen)["results"]
        verdicts[mask] = row["accuracy"]["status"]
    assert verdicts == {None: "fail", "mask": "pass"}


@pytest.mark.integration
def test_a_model_made_elsewhere_is_timed_as_it_is(user_package, tmp_path, monkeypatch):
    """`bench PKG:FACTORY --model FILE`, as check takes it: the file runs where the plain
    export would, judged against the module's float64 copy; an engine that runs a model
    tconform makes from its export is refused, naming it."""
    import importlib
    import sys

    import torch

    monkeypatch.setattr(ceiling, "GEMM_SIZE", 128)
    monkeypatch.setattr(ceiling, "COPY_BYTES", 2**20)
    monkeypatch.setattr(ceiling, "PROBE_SECONDS", 0.1)
    monkeypatch.syspath_prepend(str(tmp_path))  # the user's package, in this process too
    module, example = importlib.import_module(user_package).gains()
    sys.modules.pop(user_package)  # each test's package is its own folder's
    given = tmp_path / "made_elsewhere.onnx"
    torch.onnx.export(module.eval(), (example,), given, dynamo=False)
    chosen = settings(f"{user_package}:gains", "onnxruntime", model=given)
    (row,) = bench_in_child(lambda message: None, chosen)["results"]
    assert row["accuracy"]["status"] == "pass", row["accuracy"]
    assert row["details"]["model"] == str(given)
    with pytest.raises(UsageError, match="--engine onnxruntime-fp16 times a model tconform makes"):
        settings(f"{user_package}:gains", "onnxruntime-fp16", model=given)


@pytest.mark.integration
def test_a_module_given_its_inputs_in_a_file_is_timed_at_them_and_at_batch_1(
    user_package, tmp_path, monkeypatch
):
    """`bench PKG:FACTORY --inputs FILE`, as tconform check takes a module alone: `example`
    is the file's set (named after it), and the shapes made from it are timed too."""
    monkeypatch.setattr(ceiling, "GEMM_SIZE", 128)
    monkeypatch.setattr(ceiling, "COPY_BYTES", 2**20)
    monkeypatch.setattr(ceiling, "PROBE_SECONDS", 0.1)
    inputs = tmp_path / "five.npz"
    np.savez(inputs, input=np.random.default_rng(0).standard_normal((5, 8), np.float32))
    chosen = settings(
        f"{user_package}:module_only", "onnxruntime", "torch",
        input_sets=("example", "batch-1"), inputs=inputs,
    )  # fmt: skip
    report = bench_in_child(lambda message: None, chosen)
    rows = {(r["engine"], r["input_set"]): r for r in report["results"]}
    assert set(rows) == {(e, s) for e in ("onnxruntime", "torch") for s in ("five.npz", "batch-1")}
    assert all(row["status"] == "pass" for row in rows.values()), rows
    assert {row["batch"] for row in rows.values()} == {5, 1}


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["not a target"], ["expected PACKAGE.MODULE:FACTORY"]),
        (["{pkg}:gains", "--shape", "1x4"], ["--shape chooses among tconform's own cases"]),
        (["{pkg}:gains", "--preset", "tiny"], ["--preset chooses among tconform's own"]),
        (["{pkg}:gains", "--engine", "onnxruntime-fused"], ["only tconform's own cases"]),
        (
            ["{pkg}:gains", "--generate", "4"],
            ["--compare and --generate are for tconform's own model"],
        ),
        # the child runs the factory and its float64 copy, then refuses before any export
        (["{pkg}:gains", "--input-set", "seq-4"], ["has no such input set", "batch-"]),
        # a name of no input set at all: refused with the options, before the child starts
        (["{pkg}:gains", "--input-set", "batch"], ["'batch' is no input set", "seq-N"]),
        (["--dynamic", "x=0:batch"], ["--dynamic is for a user's model"]),
        (["{pkg}:ends_itself"], ["the bench's process exited with status 0", "factory"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, user_package, tmp_path, args, needles):
    args = [a.format(pkg=user_package) for a in args]
    code, out, err = cli("bench", *args, "--json", str(tmp_path / "r.json"))
    assert code == EXIT_USAGE, out + err
    assert "Traceback" not in out + err, err
    last = err.strip().splitlines()[-1]  # after the progress lines of the child, if it ran
    assert last.startswith("tconform: error: "), err
    for needle in needles:
        assert needle in last, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit_code"] == EXIT_USAGE and report["results"] == []
    assert not (tmp_path / "artifacts").exists()  # refused before anything was exported


@pytest.mark.unit
@pytest.mark.parametrize(
    ("engine", "way_on"),
    [
        (
            "onnxruntime-fp16",
            "; give it as --engine onnxruntime-fp16@python to run it in a worker process of its "
            "own, where a crash is that engine's row",
        ),
        ("onnxruntime-fp16@python", ""),  # in a worker already: its crash is a row
        ("torch", ""),  # the module runs in the bench's process: no worker to name
    ],
)
def test_a_crash_while_timing_is_that_engines_crash_row_and_exit_1(monkeypatch, engine, way_on):
    """The bench's process dies inside one engine's timing (ONNX Runtime 1.23+ segfaults
    opening some float16 models): that engine's row is `crash`, the rows before keep theirs,
    exit 1; it was exit 2 naming the phase before (the ceilings) and no row."""
    import tconform.child
    from tconform.commands.bench import in_child
    from tconform.errors import EXIT_FAILURE, TconformError

    timed = {"case": "m:f", "engine": "onnxruntime", "ep": "cpu", "status": "pass"}
    starting = {"case": "m:f", "engine": engine, "ep": "cpu", "input_set": "example"}

    def crashes_while_timing(function, args, on_message, what, ended_early):
        on_message(("progress", "m:f: measuring the cpu GEMM ceilings ..."))
        on_message(("start", ({**timed, "status": None}, "timing m:f example onnxruntime/cpu")))
        on_message(("report", {"results": [timed]}))
        on_message(("start", (starting, f"timing m:f example {engine}/cpu")))
        raise UsageError(ended_early("crashed (SIGSEGV: a segmentation fault in native code)"))

    monkeypatch.setattr(tconform.child, "run_in_child", crashes_while_timing)
    into: dict = {}
    with pytest.raises(TconformError) as raised:
        in_child(settings("m:f", "torch"), into, lambda line: None)
    message = (
        "m:f: the bench's process crashed (SIGSEGV: a segmentation fault in native code) while "
        f"timing m:f example {engine}/cpu; the rows after it were not timed{way_on}"
    )
    assert str(raised.value) == message and raised.value.exit_code == EXIT_FAILURE
    assert into["results"] == [timed, {**starting, "status": "crash", "reason": message}]


@pytest.mark.unit
def test_a_process_that_ends_between_timings_is_a_usage_error_naming_the_phase(monkeypatch):
    import tconform.child
    from tconform.commands.bench import in_child

    def ends_in_the_factory(function, args, on_message, what, ended_early):
        on_message(("progress", "m:f: importing 'm' and calling the factory"))
        raise UsageError(ended_early("exited with status 0"))

    monkeypatch.setattr(tconform.child, "run_in_child", ends_in_the_factory)
    into: dict = {}
    with pytest.raises(UsageError, match="while importing 'm' and calling the factory, before"):
        in_child(settings("m:f", "torch"), into, lambda line: None)
    assert into == {}
