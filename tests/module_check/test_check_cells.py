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
