"""`tconform check` on a module in bfloat16 or float16 (issue 28, item 7): its float64 copy is
the reference, and its own precision picks the tolerance row; a runtime without the kernels
says so as a skip, never a traceback."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tconform
from tconform.compare import TOLERANCES

pytestmark = pytest.mark.integration


def _mlp(dtype: torch.dtype) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8))
    return module.to(dtype).eval(), torch.randn(4, 16, dtype=dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_reduced_precision_module_is_judged_by_its_own_row(dtype, tmp_path):
    module, x = _mlp(getattr(torch, dtype))
    report = tconform.check(module, x, out_dir=tmp_path / "export")
    rows = {r.runtime: r for r in report.results}
    row = TOLERANCES[(dtype, "model")]
    own = rows["torch"]
    assert own.status == "pass" and own.precision == dtype and own.reference == "float64"
    assert own.outputs[0].atol <= row.atol and own.outputs[0].rtol == row.rtol
    ort = rows["onnxruntime"]
    assert ort.model.elem_type == dtype and ort.precision == dtype
    if dtype == "bfloat16":  # ONNX Runtime's CPU provider has no bfloat16 Gemm
        assert ort.status == "skip" and "no bfloat16 kernel" in ort.message
        # the torch row checks the module, not its export: no ONNX lane ran, nothing checked
        assert report.exit_code == 3 and "nothing checked" in report.error["message"]
    else:
        assert ort.status == "pass", ort.message
        assert report.exit_code == 0
    assert module[0].weight.dtype == getattr(torch, dtype)  # the user's module is left as it was
