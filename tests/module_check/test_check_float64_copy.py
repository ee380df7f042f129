"""The float64 copy of any module: exact where float64 runs, float32 where it cannot,
and refused where the module is not deterministic."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tconform.errors import UsageError
from tconform.module_check.float64_copy import build_float64_copy
from tconform.module_check.inputs import as_inputs
from tconform.runtimes.torch_session import eval_mode, flatten_outputs

pytestmark = pytest.mark.unit


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.drop(self.linear(x)), ids + 1


class CastsToFloat32(nn.Module):
    """Creates a float32 tensor in forward: its float64 copy mixes dtypes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ torch.ones(4, 2, dtype=torch.float32)


class Noisy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)


def _linear64(linear: nn.Linear, x: torch.Tensor):
    w, b = linear.weight.detach().double(), linear.bias.detach().double()
    return torch.nn.functional.linear(x.double(), w, b).numpy()


def _inputs(module, *tensors):
    return as_inputs(module, tensors, "test")


def test_the_reference_is_the_module_in_float64():
    torch.manual_seed(0)
    module = Scaled().eval()
    x, ids = torch.randn(2, 4), torch.tensor([1, 2])
    ref = build_float64_copy(module, _inputs(module, x, ids), "test")
    assert ref.kind == "float64" and ref.notes == []
    assert (ref.outputs["output_0"] == _linear64(module.linear, x)).all()
    assert ref.outputs["output_1"].dtype.kind == "i"  # integers stay integers
    assert module.linear.weight.dtype == torch.float32  # the user's module is not converted


def test_the_calls_are_captured_only_when_asked_for_from_a_run_of_the_same_outputs():
    torch.manual_seed(0)
    module = Scaled().eval()
    x, ids = torch.randn(2, 4), torch.tensor([1, 2])
    ref = build_float64_copy(module, _inputs(module, x, ids), "test")
    assert ref._calls is None  # a check that localises nothing never holds them
    calls = {(c.path, c.call): c for c in ref.calls}
    assert set(calls) == {("", 0), ("linear", 0), ("drop", 0)}
    assert (calls[("linear", 0)].outputs[0] == ref.outputs["output_0"]).all()
    assert ref.calls is ref.calls  # captured once


def test_a_module_in_training_mode_is_checked_in_eval_mode_and_left_as_it_was():
    torch.manual_seed(0)
    module = Scaled().train()
    x, ids = torch.randn(2, 4), torch.tensor([1, 2])
    ref = build_float64_copy(module, _inputs(module, x, ids), "test")
    assert any("training mode" in n for n in ref.notes)
    assert module.training and module.drop.training  # the user's module is not changed
    assert (ref.outputs["output_0"] == _linear64(module.linear, x)).all()  # no dropout


def test_where_float64_cannot_run_the_reference_is_float32_and_says_so():
    module = CastsToFloat32()
    ref = build_float64_copy(module, _inputs(module, torch.randn(3, 4)), "test")
    assert ref.kind == "float32"
    assert "reference: float32" in ref.notes[0] and "could not run" in ref.notes[0]


def test_a_module_that_draws_random_numbers_in_eval_mode_has_nothing_to_judge_it_against():
    module = Noisy()
    with pytest.raises(UsageError, match="not deterministic"):
        build_float64_copy(module, _inputs(module, torch.randn(3, 4)), "test")


def test_eval_mode_restores_each_submodules_own_mode():
    module = Scaled().train()
    module.drop.eval()
    with eval_mode(module):
        assert not module.training and not module.linear.training
    assert module.training and module.linear.training and not module.drop.training


def test_outputs_flatten_like_the_exporters():
    t = torch.zeros(1)
    assert [n for n, _ in flatten_outputs(t)] == ["output"]
    assert [n for n, _ in flatten_outputs((t, None, (t, t)))] == [
        "output_0",
        "output_2_0",
        "output_2_1",
    ]
    assert [n for n, _ in flatten_outputs({"logits": t, "extra": {"h": t}})] == [
        "logits",
        "extra.h",
    ]


class InPlace(nn.Module):
    """Changes what it is given (x.add_(1), ids.mul_(2)) before it computes."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, ids: torch.Tensor):
        x.add_(1)
        ids.mul_(2)
        return self.linear(x), ids


def test_a_module_that_changes_its_inputs_in_place_is_run_on_fresh_copies():
    """Each run starts from the example as given: the two runs agree (no false 'not
    deterministic'), and the example every other run starts from is left as it was."""
    torch.manual_seed(0)
    module = InPlace().eval()
    x, ids = torch.randn(2, 4), torch.tensor([1, 2])
    inputs = _inputs(module, x.clone(), ids.clone())
    ref = build_float64_copy(module, inputs, "test")
    assert (ref.outputs["output_0"] == _linear64(module.linear, x.double() + 1)).all()
    assert (ref.outputs["output_1"] == (ids * 2).numpy()).all()
    named = inputs.named()
    assert torch.equal(named["x"], x) and torch.equal(named["ids"], ids)
    assert torch.equal(inputs.converted(None, None).named()["x"], x)
