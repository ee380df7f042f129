"""A session's outputs come back by name; a module that returns another number of outputs than
it declares is named as such by the execution layer (one line), never zipped short."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tconform.execution import OutputsMismatch, Subject, open_subject, run_judged
from tconform.golden import InputSet
from tconform.results import Result
from tconform.runtimes import make_runtime
from tconform.runtimes.base import ModuleTarget, select

pytestmark = pytest.mark.unit


def test_select_names_values_and_keeps_extra_ones_by_position():
    assert list(select(["a", "b"], [1, 2], None)) == ["a", "b"]
    assert select(["a", "b"], [1, 2], ["b"]) == {"b": 2}
    assert list(select(["a"], [1, 2], None)) == ["a", "output 1"]
    assert list(select(["a", "b"], [1], None)) == ["a"]


class TwoOutputs(torch.nn.Module):
    def forward(self, x):
        return x + 1, x * 2


def test_a_module_returning_more_outputs_than_it_declares_is_one_clear_error():
    target = ModuleTarget(TwoOutputs, ("x",), outputs=("y",))
    x = np.ones((2, 3), np.float32)
    says = r"returned 2 outputs \(y, output 1\); it declares 1"
    with (
        pytest.raises(OutputsMismatch, match=says),
        open_subject(make_runtime("torch"), Subject(module=target)) as opened,
    ):
        run_judged(opened, InputSet("s", {"x": x}, {"y": x + 1}), None, Result.about("m", "m"))


def test_a_runtime_that_rejects_its_subject_is_an_error_row_of_that_runtime(monkeypatch):
    """open_subject: a runtime that cannot take a sound subject (RuntimeRejected) is NotRun
    with status error naming the runtime, so the run goes on with the other runtimes."""
    from tconform.errors import RuntimeRejected
    from tconform.execution import NotRun
    from tconform.results import Status

    runtime = make_runtime("torch")

    def rejects(target):
        raise RuntimeRejected("it cannot convert it: an op it lacks")

    monkeypatch.setattr(runtime, "open", rejects)
    target = ModuleTarget(TwoOutputs, ("x",), outputs=("y", "z"))
    with pytest.raises(NotRun) as raised, open_subject(runtime, Subject(module=target)):
        pass
    assert raised.value.status == Status.ERROR
    assert str(raised.value) == "torch: it cannot convert it: an op it lacks"
