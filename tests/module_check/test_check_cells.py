"""A user's model's matrix cells each get a verdict of their own: one that cannot be made is an
error row of that cell, not the end of the run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

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


def test_an_exporter_that_fails_is_its_cells_error_and_the_other_exporters_cells_run(tmp_path):
    """TorchScript cannot export torch.diff (aten::diff) where dynamo can: in a matrix of both,
    the TorchScript cells are error rows naming the exporter's failure, and dynamo's run."""
    import torch

    import tconform
    from tconform.request import Axes

    class Diff(torch.nn.Module):
        def forward(self, x):
            return torch.diff(x, dim=-1) * 2

    report = tconform.check(
        Diff(), (torch.randn(2, 5),), runtimes=("onnxruntime",), shapes=False,
        matrix=Axes(matrix=True, exporters=("dynamo", "torchscript")), out_dir=tmp_path / "out",
    )  # fmt: skip
    by_exporter = {r.cell.split("-")[0]: r for r in report.results if r.runtime == "onnxruntime"}
    assert by_exporter["dynamo"].status == "pass", by_exporter["dynamo"].message
    failed = by_exporter["torchscript"]
    assert failed.status == "error" and "export with torchscript failed" in failed.message
    assert report.exit_code == 1


def test_torchscript_exports_a_forward_with_a_number_default_as_that_number(tmp_path):
    """Given keyword inputs, TorchScript passed forward's parameters between them by position,
    a number default as a traced tensor: transformers' logits_to_keep=0 then indexed one
    position instead of slicing none, and the graph took an input no set holds."""
    import torch

    import tconform

    class KeepLast(torch.nn.Module):
        def forward(self, x, keep: int = 0, scale=None):
            chosen = slice(-keep, None) if isinstance(keep, int) else keep
            return x[:, chosen, :] * (2.0 if scale is None else scale)

    torch.manual_seed(0)
    report = tconform.check(
        KeepLast(), {"x": torch.randn(2, 5, 3), "scale": torch.tensor(3.0)},
        runtimes=("onnxruntime",), exporter="torchscript", shapes=False, out_dir=tmp_path / "out",
    )  # fmt: skip
    assert report.exit_code == 0, [(r.status, r.message) for r in report.results]
    import onnx

    model = onnx.load(str(tmp_path / "out" / "model.onnx"))
    assert [i.name for i in model.graph.input] == ["x", "scale"]


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


class Centred(torch.nn.Linear):
    """z - z.mean(0): every row reads every other."""

    def forward(self, x):
        z = super().forward(x)
        return z - z.mean(0, keepdim=True)


class RunningMean(torch.nn.Linear):
    """The running mean of z along axis 0 (a sequence-first layout taken for a batch): a row
    reads only the rows before it, so the batch's first rows are the example's own."""

    def forward(self, x):
        z = super().forward(x)
        count = torch.arange(1, z.shape[0] + 1, dtype=z.dtype)
        return z.cumsum(0) / count.reshape(-1, *[1] * (z.dim() - 1))


def test_a_sequence_first_module_is_pointed_to_its_batch_axis_and_judged_along_it(tmp_path):
    """x is (sequence, batch, features): axis 0 is taken for the batch (every input leads with
    its size), the running mean mixes it in every output, and the note names the option that
    says which axis is the batch; with the axes named, each row is judged along output axis 1
    (a row run alone is (sequence, 1, features))."""
    import tconform

    torch.manual_seed(0)
    module, example = RunningMean(8, 8), (torch.randn(5, 3, 8),)
    guessed = tconform.check(module, example, runtimes=("onnxruntime",), out_dir=tmp_path / "a")
    notes = " ".join(r for result in guessed.results for r in result.notes)
    assert guessed.exit_code == 0 and "x axis 0 was taken for the batch" in notes, notes
    assert "--dynamic NAME=AXIS:batch,AXIS:seq" in notes
    named = tconform.check(
        module, example, runtimes=("onnxruntime",), out_dir=tmp_path / "b",
        dynamic={"x": {0: "seq", 1: "batch"}},
    )  # fmt: skip
    (row,) = [r for r in named.results if r.input_set == "batch-consistency"]
    assert named.exit_code == 0 and row.status == "pass", row.message
    assert row.outputs and row.outputs[0].compared == 5 * 6 * 8


@pytest.mark.parametrize("mixing", [Centred, RunningMean])
def test_a_module_that_mixes_its_batch_by_design_is_not_failed_for_batch_consistency(
    tmp_path, mixing
):
    """A row alone is another value in the float64 copy too: that output's batch consistency
    is noted and not judged (a healthy module failed it), while a module whose rows stand
    alone keeps the row."""
    import tconform

    torch.manual_seed(0)
    report = tconform.check(
        mixing(8, 8), (torch.randn(3, 8),), runtimes=("onnxruntime",), out_dir=tmp_path / "out"
    )
    results = {r.input_set: r for r in report.results}
    assert report.exit_code == 0, [(r.input_set, r.status, r.message) for r in report.results]
    assert results["batch-consistency"].status == "skip"
    assert "mixes the rows of its batch" in " ".join(results["example"].notes)
    if mixing is RunningMean:
        return
    plain = tconform.check(
        torch.nn.Linear(8, 8), (torch.randn(2, 8),), runtimes=("onnxruntime",),
        out_dir=tmp_path / "plain",
    )  # fmt: skip
    (row,) = [r for r in plain.results if r.input_set == "batch-consistency"]
    assert row.status == "pass" and row.outputs


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
    assert "@python" not in results[-1]["message"]  # torch runs the module here: no worker


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
    # ONNX Runtime can run in a worker of its own, where its crash is a result: the way on
    assert "with --runtime onnxruntime@python it runs in a worker" in results[-1]["message"]


LINEAR = """
import torch


def make():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3), torch.randn(2, 4)
"""


def test_a_given_model_that_names_its_outputs_otherwise_is_checked_at_every_batch(
    cli, tmp_path, monkeypatch
):
    """A model made elsewhere with a free batch and its own output name: its batch-consistency
    set (keyed by the model's names) is judged under the tolerance of the module's output in
    that place; it ended the check with "KeyError: 'renamed'"."""
    import json

    import torch

    (tmp_path / "linear_model.py").write_text(LINEAR)
    monkeypatch.chdir(tmp_path)
    module = torch.nn.Linear(4, 3)
    torch.onnx.export(
        module, (torch.randn(2, 4),), tmp_path / "given.onnx", input_names=["x"],
        output_names=["renamed"], dynamic_axes={"x": {0: "b"}, "renamed": {0: "b"}}, dynamo=False,
    )  # fmt: skip
    report = tmp_path / "r.json"
    code, out, err = cli(
        "check", "linear_model:make", "--model", "given.onnx", "--no-torch", "-q",
        "--tolerance", "output=1e-9,0", "--json", str(report),
    )  # fmt: skip
    assert code == 1, out + err  # the given model's weights are not the factory's
    results = {r["input_set"]: r for r in json.loads(report.read_text())["results"]}
    assert results["batch-consistency"]["status"] == "pass"  # the model against itself
    # the module's own tolerance, set for its output by the module's name, judged it
    (judged,) = results["batch-consistency"]["outputs"]
    assert (judged["name"], judged["atol"], judged["rtol"]) == ("renamed", 1e-9, 0.0)


TWO_LAYERS = """
import torch


def make():
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    return layers, torch.randn(2, 4)
"""


def test_a_given_model_with_external_data_is_localised(cli, tmp_path, monkeypatch):
    """torch.onnx.export writes external data by default; localising such a model made its
    copy with a symbolic link to the data, which ONNX Runtime 1.31 refuses ("External data
    path escapes model directory"), and no module was named."""
    import importlib
    import json
    import sys

    import onnx
    import torch
    from onnx import numpy_helper

    (tmp_path / "two_layer_model.py").write_text(TWO_LAYERS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    module, example = importlib.import_module("two_layer_model").make()
    sys.modules.pop("two_layer_model")
    exported = tmp_path / "plain.onnx"
    torch.onnx.export(module, (example,), exported, input_names=["x"], dynamo=False)
    model = onnx.load(str(exported))
    (weight,) = [i for i in model.graph.initializer if i.name == "2.weight"]
    scaled = numpy_helper.to_array(weight) * np.float32(1.5)
    weight.CopyFrom(numpy_helper.from_array(scaled, weight.name))
    (tmp_path / "given").mkdir()
    onnx.save(model, str(tmp_path / "given" / "bad.onnx"), save_as_external_data=True,
              location="bad.onnx.data", size_threshold=0)  # fmt: skip
    report = tmp_path / "r.json"
    code, out, err = cli(
        "check", "two_layer_model:make", "--model", "given/bad.onnx", "--no-torch",
        "--no-shapes", "--localise", "-q", "--json", str(report),
    )  # fmt: skip
    assert code == 1, out + err
    (result,) = json.loads(report.read_text())["results"]
    assert "first divergence: 2 (torch.nn.modules.linear.Linear)" in result["message"], result
    assert not [n for n in result["notes"] if "could not run" in n]


ONE_ROW = """
import torch


class OneRow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        if x.shape[0] == 1:  # traced at batch 1, the export keeps this branch alone
            return self.fc(x[0]).unsqueeze(0)
        return self.fc(x)


def make():
    torch.manual_seed(0)
    return OneRow().eval(), torch.randn(1, 4, 8)
"""


def test_an_export_that_fixed_a_batch_of_1_is_static_and_other_batches_are_skipped(
    cli, tmp_path, monkeypatch
):
    """Traced at the example's batch of 1, dynamo kept the input's batch free but fixed the
    output's at 1: batch 2 was a FAIL ("shape [1, 4, 5] != golden [2, 4, 5]") on a healthy
    module, and localisation broke on it. The export is made static instead, and the other
    batch is a skip naming the way on (an example of batch 2 or more)."""
    import json

    (tmp_path / "one_row_model.py").write_text(ONE_ROW)
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "r.json"
    code, out, err = cli("check", "one_row_model:make", "--no-torch", "-q", "--json", str(report))
    assert code == 0, out + err
    data = json.loads(report.read_text())
    statuses = {r["input_set"]: r["status"] for r in data["results"]}
    assert statuses == {"example": "pass", "batch-2": "skip", "batch-consistency": "skip"}
    batch_2 = next(r for r in data["results"] if r["input_set"] == "batch-2")
    # the way on is a larger example: --dynamic would trace it at batch 1 again
    message = batch_2["message"]
    assert "trace it with an example of batch 2 or more" in message and "--dynamic" not in message
    assert any("torch.export specialises sizes 0 and 1" in n for n in batch_2["notes"])


def test_a_given_model_whose_output_has_another_shape_is_localised(cli, tmp_path, monkeypatch):
    """A file that fixed its output's batch at 1 fails at batch 2 by shape; localisation
    named its module by the isolated run's own words, where it ended with "AttributeError:
    'NoneType' object has no attribute 'max_abs_err'" (a shape has no figures)."""
    import importlib
    import json
    import sys

    import torch

    (tmp_path / "one_row_model.py").write_text(ONE_ROW)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    module, example = importlib.import_module("one_row_model").make()
    sys.modules.pop("one_row_model")
    batch = torch.export.Dim.AUTO
    torch.onnx.export(
        module, (example,), tmp_path / "given.onnx", input_names=["x"],
        dynamic_shapes={"x": {0: batch}}, dynamo=True,
    )  # fmt: skip
    report = tmp_path / "r.json"
    code, out, err = cli(
        "check", "one_row_model:make", "--model", "given.onnx", "--no-torch", "--localise",
        "-q", "--json", str(report),
    )  # fmt: skip
    assert code == 1, out + err
    failed = next(r for r in json.loads(report.read_text())["results"] if r["status"] == "fail")
    assert "shape [1, 4, 5] != golden [2, 4, 5]" in failed["message"]
    assert not [n for n in failed["notes"] if "could not run" in n], failed["notes"]
    assert "it fails too (shape [1, 4, 5] != golden [2, 4, 5])" in out


def test_a_given_model_that_fixed_a_dimension_says_to_export_it_again(cli, tmp_path, monkeypatch):
    """A file made elsewhere at a static batch: the other batches are a skip whose way on is
    a new export of that file (tconform's --dynamic exports nothing of it)."""
    import importlib
    import json
    import sys

    import torch

    (tmp_path / "linear_model.py").write_text(LINEAR)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    module, example = importlib.import_module("linear_model").make()
    sys.modules.pop("linear_model")
    torch.onnx.export(module, (example,), tmp_path / "static.onnx", dynamo=False)
    report = tmp_path / "r.json"
    code, out, err = cli(
        "check", "linear_model:make", "--model", "static.onnx", "--no-torch", "-q",
        "--json", str(report),
    )  # fmt: skip
    assert code == 0, out + err
    skipped = [r for r in json.loads(report.read_text())["results"] if r["status"] == "skip"]
    assert skipped and all("export the file again with that axis dynamic" in r["message"]
                           for r in skipped)  # fmt: skip


def test_axes_given_without_a_batch_say_the_batch_was_not_checked(cli, tmp_path, monkeypatch):
    """--dynamic naming an input's axes replaces what is inferred for it: with no batch among
    them the batch checks were dropped without a word."""
    (tmp_path / "linear_model.py").write_text(LINEAR)
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(
        "check", "linear_model:make", "--dynamic", "input=1:width", "--no-torch", "--exporter",
        "torchscript", "-q",
    )  # fmt: skip
    assert code == 0, out + err
    assert "batch-N, batch-consistency: not checked: the axes given" in out, out + err
    # and the free axis it names is said to be checked at no other size
    assert "input axis 1 (width): free in the export, not checked at another size" in out


def test_check_shards_merge_into_the_whole_run(cli, tmp_path, monkeypatch):
    """`check --shard K/N` runs a balanced share of the check's units, and `report merge`
    makes the shards one report: the whole run's results, unit for unit, in its order."""
    (tmp_path / "shardmodel.py").write_text(
        "import torch\n\ndef make():\n    torch.manual_seed(0)\n"
        "    return torch.nn.Linear(4, 3), torch.randn(2, 4)\n"
    )
    monkeypatch.chdir(tmp_path)
    common = ("check", "shardmodel:make", "--exporter", "torchscript", "-q")
    runs = {name: tmp_path / f"{name}.json" for name in ("whole", "s1", "s2", "merged")}
    assert cli(*common, "--json", str(runs["whole"]))[0] == 0
    for k in (1, 2):
        code, out, err = cli(*common, "--shard", f"{k}/2", "--json", str(runs[f"s{k}"]))
        assert code == 0, out + err
    code, out, err = cli(
        "report", "merge", str(runs["s1"]), str(runs["s2"]), "--json", str(runs["merged"])
    )
    assert code == 0, out + err
    whole, merged = (json.loads(runs[n].read_text()) for n in ("whole", "merged"))
    shards = [json.loads(runs[f"s{k}"].read_text())["results"] for k in (1, 2)]
    assert shards[0] and shards[1]  # each shard checked a share
    key = lambda r: (r["runtime"], r["input_set"], r["status"])  # noqa: E731
    assert [key(r) for r in merged["results"]] == [key(r) for r in whole["results"]]
    assert merged["command"] == "check" and merged["exit_code"] == 0


def _checked(cli, tmp_path, monkeypatch, name: str, source: str, *args: str):
    """`tconform check NAME:make ARGS` on the module `source`, written as NAME.py in a
    folder of its own: (exit code, stdout and stderr, the JSON report's results)."""
    import json

    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "r.json"
    code, out, err = cli("check", f"{name}:make", *args, "-q", "--json", str(report))
    return code, out + err, json.loads(report.read_text())["results"]


FLAGS = """
import torch


class Flags(torch.nn.Module):
    def forward(self, x):
        return x * 2, x > 0, x.argmax(-1)


def make():
    torch.manual_seed(0)
    return Flags(), torch.randn(2, 5)
"""


def test_bool_and_integer_outputs_are_checked_at_every_batch(cli, tmp_path, monkeypatch):
    """Outputs of bool and integer type go through the batch checks as any other: finding
    whether the module mixes its batch's rows ended the check with exit 2, "numpy boolean
    subtract, the `-` operator, is not supported"."""
    code, said, results = _checked(
        cli, tmp_path, monkeypatch, "flags", FLAGS, "--runtime", "onnxruntime"
    )
    assert code == 0, said
    assert {r["input_set"] for r in results} >= {"example", "batch-4", "batch-consistency"}
    assert all(r["status"] == "pass" for r in results)


CONV = """
import torch


def make():
    torch.manual_seed(0)
    return torch.nn.Conv1d(4, 4, 3, padding=1), torch.randn(2, 4, 8)
"""


def test_a_cell_whose_opset_lacks_the_type_is_skipped_naming_the_opset(cli, tmp_path, monkeypatch):
    """ONNX's Conv takes bfloat16 from opset 22: at opset 18 no bfloat16 Conv can exist, and
    both exporters say so. That cell is a skip naming the opset that has it; it was an error
    row, exit 1, though nothing had failed."""
    from tconform.suites.module import _type_not_in_opset

    code, said, results = _checked(
        cli, tmp_path, monkeypatch, "conv", CONV, "--matrix", "--dtype", "float32,bfloat16",
        "--runtime", "onnxruntime", "--no-shapes",
    )  # fmt: skip
    assert code == 0, said
    assert [(r["precision"], r["status"]) for r in results] == [
        ("float32", "pass"),
        ("bfloat16", "skip"),
    ]
    assert results[1]["message"] == _type_not_in_opset(
        "(op_type:Conv, node name: c): X typestr: T, has unsupported type: tensor(bfloat16)", 18
    )
    assert "ONNX Conv takes no bfloat16 at opset 18" in results[1]["message"]
    assert "--opset 22" in results[1]["message"]
    assert _type_not_in_opset("export with dynamo failed: no such op", 18) == ""


def test_a_float64_module_that_fails_is_localised_under_the_bounds_given(tmp_path):
    """A float64 module has no row: the bounds given judge it, and a failure is localised under
    them (localising it asked for the float64 row anyway: exit 2, "no float64 tolerance row")."""
    import torch
    from onnx import TensorProto

    import tconform

    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8).double().eval()
    path = _linear_file(linear, tmp_path / "wrong_bias.onnx", 0.5, TensorProto.DOUBLE)
    inputs = torch.randn(2, 8, dtype=torch.float64)
    for bounds in ({"atol": 1e-9, "rtol": 1e-9}, {"tolerances": {"output": (1e-9, 1e-9)}}):
        report = tconform.check(
            linear, inputs, onnx_model=path, runtimes=("onnxruntime",), shapes=False,
            localise=True, **bounds,
        )  # fmt: skip
        assert report.exit_code == 1 and report.results[0].precision == "float64"
        (found,) = report.localisations
        assert found.first is not None and found.first.path == ""  # the Linear is the module


def test_a_float64_modules_reduced_cells_are_not_applicable(tmp_path):
    """The converters read float32 tensors: a float64 module's export came out of them
    unchanged, and its float16 cell passed having run float64."""
    import torch

    import tconform
    from tconform.request import Axes

    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8).double().eval()
    report = tconform.check(
        linear, torch.randn(2, 8, dtype=torch.float64), runtimes=("onnxruntime", "torch"),
        matrix=Axes(matrix=True, dtypes=("float32", "float16")), atol=1e-9, rtol=1e-9,
        shapes=False, out_dir=tmp_path / "out",
    )  # fmt: skip
    rows = {(r.runtime, r.cell): r for r in report.results}
    assert report.exit_code == 0
    (ran,) = [r for (name, cell), r in rows.items() if name == "onnxruntime" and r.status == "pass"]
    assert ran.precision == "float64"
    (half,) = [r for (name, cell), r in rows.items() if name == "onnxruntime" and r is not ran]
    assert (
        half.status == "skip" and "not applicable: the module computes in float64" in half.message
    )
    (own,) = [r for (name, _), r in rows.items() if name == "torch"]
    assert "a float64 module is its own float64 copy" in own.message


def _linear_file(linear, path, shift: float = 0.0, elem: int = 1):
    """`linear` as MatMul + Add in an ONNX file of its own (`elem`: its TensorProto type,
    float32 by default), its bias moved by `shift`."""
    import onnx
    from onnx import helper, numpy_helper

    weight = linear.weight.detach().numpy().T.copy()
    bias = linear.bias.detach().numpy() + shift
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["output"])],
        "linear",
        [helper.make_tensor_value_info("input", elem, [2, 8])],
        [helper.make_tensor_value_info("output", elem, [2, 8])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, path)
    return path


def test_a_given_model_runs_at_every_graph_optimisation_level_asked_for(tmp_path):
    """--model F --matrix --graph-opts disable,basic: the file at each level (the first alone
    ran, while the settings listed both), each a cell of its own that the problems name."""
    import torch

    import tconform
    from tconform.report.table import render
    from tconform.request import Axes

    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8).eval()
    path = _linear_file(linear, tmp_path / "wrong_bias.onnx", shift=0.5)
    report = tconform.check(
        linear, torch.randn(2, 8), onnx_model=path, runtimes=("onnxruntime",), shapes=False,
        matrix=Axes(matrix=True, graph_opts=("disable", "basic")), localise=False,
    )  # fmt: skip
    assert [(r.cell, r.status) for r in report.results] == [
        ("given-disable", "fail"),
        ("given-basic", "fail"),
    ]
    shown = render(report.results)
    assert "[onnxruntime/cpu given-disable example]" in shown
    assert "[onnxruntime/cpu given-basic example]" in shown


BRANCHES_ON_THE_BATCH = """
import torch


class Branches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # on the whole batch: a row alone may take the other branch
            return self.linear(x)
        return self.linear(x) * 2


def make():
    torch.manual_seed(0)
    rows = torch.stack([torch.ones(3, 4), -0.5 * torch.ones(3, 4)])  # row 1 alone: sum < 0
    return Branches().eval(), rows + 0.01 * torch.randn(2, 3, 4)
"""


def test_a_module_that_branches_on_its_whole_batch_has_no_batch_consistency_to_keep(
    cli, tmp_path, monkeypatch
):
    """Row 0 alone takes the batch's branch, row 1 alone the other: the module itself mixes
    its rows, which each row run alone shows (batch-1, row 0, did not): not judged, and the
    unmodified module passes; its batch-consistency row was a FAIL at 3.5e6 % of tolerance."""
    code, said, results = _checked(
        cli, tmp_path, monkeypatch, "branches", BRANCHES_ON_THE_BATCH, "--runtime", "torch"
    )
    assert code == 0, said
    (row,) = [r for r in results if r["input_set"] == "batch-consistency"]
    assert row["status"] == "skip"
    assert any("the module mixes the rows of its batch" in n for n in row["notes"])
