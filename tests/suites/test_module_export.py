"""How a user's module is exported (tconform.suites.module.ModuleSuite._export): the axes it
keeps free, and with "auto" which exporter, in which order."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tconform.errors import UsageError
from tconform.module_check.exporting import export_module
from tconform.module_check.inputs import ModuleInputs
from tconform.suites import module as suite_module
from tconform.suites.module import ModuleSuite
from tconform.units import Cell

pytestmark = pytest.mark.unit

FREE = {"x": {0: "batch", 1: "seq"}}  # what tconform inferred
DECLARED: dict = {}  # what the user declared: nothing


def _suite(calls: list, works) -> SimpleNamespace:
    """Enough of a ModuleSuite for _export, whose exporter `works(exporter, axes)` or fails."""

    def export_module(module, inputs, names, path, exporter, opset, axes, where):
        calls.append((exporter, axes))
        if not works(exporter, axes):
            raise UsageError(f"m:f: export with {exporter} failed: no")

    fake = SimpleNamespace(axes=FREE, declared=DECLARED, where="m:f", output_names=("y",),
                           inputs=None, export_axes=None)  # fmt: skip
    fake._reason = lambda exc: ModuleSuite._reason(fake, exc)
    fake._export_with = lambda *args: ModuleSuite._export_with(fake, *args)
    fake.export_module = export_module
    return fake


@pytest.fixture
def suite(monkeypatch):
    def make(works):
        calls: list = []
        fake = _suite(calls, works)
        monkeypatch.setattr(suite_module, "export_module", fake.export_module)
        monkeypatch.setattr(suite_module, "_require_batch_kept_free", lambda *a: None)
        return fake, calls

    return make


def _export(fake, exporter: str = "auto"):
    cell = Cell(exporter, 18, "float32")
    return ModuleSuite._export(fake, None, None, Path("m.onnx"), cell, lambda line: None)


def test_auto_tries_dynamo_at_the_examples_shape_before_torchscript(suite):
    """dynamo cannot keep the inferred axes free, TorchScript could trace them (and may bake a
    length in while declaring its axis free: every other length then errs, a Funnel model):
    dynamo at the example's shape comes first."""
    fake, calls = suite(lambda exporter, axes: exporter == "dynamo" and axes == DECLARED)
    ran, why = _export(fake)
    assert ran == "dynamo" and fake.export_axes == DECLARED
    assert [exporter for exporter, _ in calls] == ["dynamo"] * len(calls)
    assert calls[-1] == ("dynamo", DECLARED) and calls[0] == ("dynamo", FREE)
    assert why.startswith("exported at the example's shape (the inferred batch and sequence")


def test_auto_falls_back_to_torchscript_where_dynamo_fails_at_every_shape(suite):
    fake, calls = suite(lambda exporter, axes: exporter == "torchscript")
    ran, why = _export(fake)
    assert ran == "torchscript" and fake.export_axes == FREE  # every axis it was asked for
    assert calls[-1] == ("torchscript", FREE) and ("dynamo", DECLARED) in calls
    since = "since dynamo failed: export with dynamo failed: no"
    assert why == f"exported by TorchScript (--exporter auto), {since}"


def test_when_every_exporter_fails_both_reasons_are_said(suite):
    fake, _ = suite(lambda exporter, axes: False)
    with pytest.raises(UsageError) as raised:
        _export(fake)
    assert str(raised.value) == (
        "m:f: export with torchscript failed: no; before it, export with dynamo failed: no"
    )


def test_one_exporter_asked_for_is_the_only_one_tried(suite):
    fake, calls = suite(lambda exporter, axes: False)
    with pytest.raises(UsageError, match="export with dynamo failed"):
        _export(fake, "dynamo")
    assert {exporter for exporter, _ in calls} == {"dynamo"}


class _Branches(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # the tracer keeps the example's side only
            return x * 2
        return -x


def test_torchscript_names_what_its_tracer_froze(tmp_path):
    """The traced graph takes the example's branch for every input: a check that passes on
    inputs like the example's says so, not just the export log."""
    x = torch.ones(2, 3)
    path = tmp_path / "model.onnx"
    inputs = ModuleInputs((x,), {}, ("x",))
    frozen = export_module(_Branches(), inputs, ["y"], path, "torchscript", 18)
    assert frozen == ("Converting a tensor to a Python boolean",)
    assert export_module(torch.nn.Linear(3, 3), inputs, ["y"], path, "torchscript", 18) == ()


def test_a_frozen_value_is_a_note_of_the_export(suite, monkeypatch):
    fake, _ = suite(lambda exporter, axes: True)
    monkeypatch.setattr(suite_module, "export_module", lambda *a: ("Iterating over a tensor",))
    _, why = _export(fake, "torchscript")
    assert why.startswith("the TorchScript tracer froze values of the example (Iterating over")
    assert "inputs that take others are not checked" in why


def test_an_axis_the_exporter_left_static_names_the_exporter_not_yet_tried():
    """--dynamic is no way on for an axis the exporter was asked to keep free and could not."""
    fell_back = SimpleNamespace(axes=FREE, export_axes=DECLARED, _size_one_hint=lambda: "")

    def way_on(fake, ran: str, asked: str) -> str:
        return ModuleSuite._fixed_way_on(fake, ran, Cell(asked, 18, "float32"))

    kept = SimpleNamespace(axes=FREE, export_axes=FREE, _size_one_hint=lambda: "")
    assert way_on(kept, "dynamo", "auto") == ""
    assert way_on(fell_back, "dynamo", "auto").endswith("--exporter torchscript may")
    assert way_on(fell_back, "torchscript", "torchscript").endswith("--exporter dynamo may")
    assert way_on(fell_back, "torchscript", "auto").startswith("neither dynamo nor TorchScript")


class _Variadic(torch.nn.Module):
    def forward(self, *tensors):
        return tensors[0] * 2


def test_a_forward_taking_star_args_keeps_its_axes_free(tmp_path):
    """torch.export keys dynamic shapes by forward's parameters: the inputs that fill *args
    go as one tuple under its name (they went by their own names, and dynamo refused)."""
    import onnx

    path = tmp_path / "model.onnx"
    inputs = ModuleInputs((torch.ones(2, 3),), {}, ("input_0",))
    export_module(_Variadic(), inputs, ["y"], path, "dynamo", 18, {"input_0": {0: "batch"}})
    (given,) = onnx.load(str(path)).graph.input
    assert given.type.tensor_type.shape.dim[0].dim_param  # free, not fixed at 2
