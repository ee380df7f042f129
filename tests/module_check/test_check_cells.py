"""A user's model's matrix cells each get a verdict of their own: one that cannot be made is an
error row of that cell, not the end of the run."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_a_converter_that_fails_is_its_cells_error_and_the_other_cells_still_run(
    tmp_path, monkeypatch
):
    """One dtype's converter failing (ONNX Runtime's quantiser refused some dynamo exports)
    gives that cell an error row naming it; it no longer ends the whole matrix run."""
    import torch

    import tconform
    from tconform.module_check import convert as converters
    from tconform.request import Axes

    def refuses(*_args, **_kwargs):
        raise RuntimeError("InferenceError: the quantiser's own complaint")

    monkeypatch.setattr(converters, "quantize_int8", refuses)
    torch.manual_seed(0)
    report = tconform.check(
        torch.nn.Linear(4, 3), (torch.randn(2, 4),), runtimes=("onnxruntime",), shapes=False,
        matrix=Axes(matrix=True, exporters=("torchscript",), dtypes=("float32", "int8")),
        out_dir=tmp_path / "out",
    )  # fmt: skip
    by_dtype = {r.cell.split("-")[2]: r for r in report.results}
    assert by_dtype["float32"].status == "pass"
    failed = by_dtype["int8"]
    assert failed.status == "error" and failed.precision == "int8"
    assert "quantize_dynamic failed" in failed.message and "own complaint" in failed.message
    assert report.exit_code == 1


def test_a_module_that_rejects_a_batch_of_one_has_no_batch_consistency_row(tmp_path):
    """Batch consistency runs each row alone; where the module rejects a batch of one (its
    batch-1 set a note), that is a note too, not an error row of the module's own making."""
    import torch

    import tconform

    class NotOne(torch.nn.Linear):
        def forward(self, x):
            if x.shape[0] == 1:
                raise RuntimeError("batch one not supported")
            return super().forward(x)

    torch.manual_seed(0)
    report = tconform.check(
        NotOne(8, 8), (torch.randn(2, 5, 8),), runtimes=("onnxruntime", "torch"),
        exporter="torchscript", out_dir=tmp_path / "out",
    )  # fmt: skip
    assert report.exit_code == 0, [(r.input_set, r.status, r.message) for r in report.results]
    sets = {r.input_set for r in report.results}
    assert "batch-1" not in sets and "batch-consistency" not in sets and "batch-4" in sets
    notes = " ".join(report.results[0].notes)
    assert "batch-1: not checked" in notes and "batch-consistency: not checked" in notes


CRASHES_IN_TORCH = """
import ctypes

import torch


class Crashes(torch.nn.Linear):
    def forward(self, x):
        if torch.is_inference_mode_enabled():  # only where the torch runtime runs it
            ctypes.string_at(0)  # a segmentation fault, as a runtime's native code makes one
        return super().forward(x)


def make():
    torch.manual_seed(0)
    return Crashes(4, 3), torch.randn(2, 4)
"""


def test_a_crash_while_a_runtime_runs_is_that_lanes_verdict_and_the_lanes_before_keep_theirs(
    cli, tmp_path, monkeypatch
):
    """The check's process dies mid-lane (ONNX Runtime segfaulted on a float16 model): that
    lane is a crash result and exit 1, the lanes that ended keep their results; it was exit 2
    and "nothing was checked"."""
    import json

    (tmp_path / "crashing_model.py").write_text(CRASHES_IN_TORCH)
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "r.json"
    code, out, err = cli(
        "check", "crashing_model:make", "--runtime", "onnxruntime", "--runtime", "torch",
        "--exporter", "torchscript", "--no-shapes", "-q", "--json", str(report),
    )  # fmt: skip
    assert code == 1, out + err
    assert err.strip().splitlines()[-1].startswith("tconform: error: crashing_model:make: the")
    assert "SIGSEGV" in err and "while torch ran" in err and "Traceback" not in err
    results = json.loads(report.read_text())["results"]
    assert [(r["runtime"], r["status"]) for r in results] == [
        ("onnxruntime", "pass"),
        ("torch", "crash"),
    ]
    assert "the lanes after it were not checked" in results[-1]["message"]


CRASHES_WHEN_LOCALISED = """
import ctypes

import torch


class Crashes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 3)

    def forward(self, x):
        if self.inner._forward_hooks:  # only while localisation captures the module's calls
            ctypes.string_at(0)  # a segmentation fault, as a runtime's native code makes one
        return self.inner(x)


def make():
    torch.manual_seed(0)
    return Crashes(), torch.randn(2, 4)
"""


def test_a_crash_while_a_lane_is_localised_keeps_the_lanes_results(cli, tmp_path, monkeypatch):
    """The check's process dies while localising (after its lane ended): the lane keeps its
    results, the localisation is a crash row naming what was localised, exit 1; it was exit 2,
    "nothing was checked", and the results were lost."""
    import json

    (tmp_path / "crashing_model.py").write_text(CRASHES_WHEN_LOCALISED)
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "r.json"
    code, out, err = cli(
        "check", "crashing_model:make", "--runtime", "onnxruntime", "--localise", "always",
        "--exporter", "torchscript", "--no-shapes", "-q", "--json", str(report),
    )  # fmt: skip
    assert code == 1, out + err
    assert "SIGSEGV" in err and "while ort-cpu was localised" in err, err
    assert "Traceback" not in err
    results = json.loads(report.read_text())["results"]
    assert [(r["input_set"], r["status"]) for r in results] == [
        ("example", "pass"),
        ("localisation", "crash"),
    ]
