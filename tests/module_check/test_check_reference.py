"""A module whose float64 copy cannot run is judged against float32 PyTorch, and every report
says `reference: float32`."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

pytestmark = pytest.mark.integration

SOURCE = '''
import torch
from torch import nn

class FixedDtype(nn.Module):
    """Builds a float32 tensor in forward: in float64 the product mixes dtypes and raises."""
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x) @ torch.ones(4, 2, dtype=torch.float32)

def make():
    torch.manual_seed(0)
    return FixedDtype(), torch.randn(3, 4)
'''


def test_a_float32_reference_is_marked_in_every_report(cli, tmp_path, monkeypatch):
    (tmp_path / "fixed_dtype_module.py").write_text(SOURCE)
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(
        "check", "fixed_dtype_module:make", "--out", "export", "-q",
        "--json", "r.json", "--junit", "r.xml", "--markdown", "r.md",
    )  # fmt: skip
    assert code == 0, out + err
    assert "reference: float32" in out and "could not run" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert {r["reference"] for r in report["results"]} == {"float32"}
    assert report["settings"]["reference"] == "float32"
    properties = ET.parse(tmp_path / "r.xml").getroot().iter("property")
    assert ("reference", "float32") in {(p.get("name"), p.get("value")) for p in properties}
    assert "reference float32" in (tmp_path / "r.md").read_text()
    # torch eager in float32 is that reference itself: its rows checked nothing, never a pass
    torch_rows = [
        r
        for r in report["results"]
        if r["runtime"] == "torch" and r["input_set"] != "batch-consistency"  # its own rows
    ]
    assert torch_rows and {r["status"] for r in torch_rows} == {"skip"}
    assert all("compare it with itself" in r["message"] for r in torch_rows)
    assert {r["status"] for r in report["results"] if r["runtime"] == "onnxruntime"} == {"pass"}


ROW_SOURCE = '''
import torch
from torch import nn

class NanInFloat64(nn.Module):
    """NaN in float64 on rows whose first feature is below -1, finite in float32: as a
    left-padded decoder whose float64 mask fill overflows on its padded row only."""
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        if y.dtype == torch.float64:
            y = torch.where(x[:, :1] < -1, torch.full_like(y, float("nan")), y)
        return y

def make():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    x[0, 0], x[1, 0] = 0.5, -2.0  # batch 1 is row 0 alone: its float64 copy is finite
    return NanInFloat64(), x
'''


def test_each_set_names_its_own_reference_and_batch_consistency_is_still_judged(
    cli, tmp_path, monkeypatch
):
    """A float64 copy that falls back at some shapes only: each row says which reference
    judged it, and batch consistency, between two float32 references, is judged (float32
    rounding is not the module mixing its rows)."""
    (tmp_path / "nan_rows_module.py").write_text(ROW_SOURCE)
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("check", "nan_rows_module:make", "--out", "export", "-q",
                         "--json", "r.json")  # fmt: skip
    assert code == 0, out + err
    rows = json.loads((tmp_path / "r.json").read_text())["results"]
    ort = {r["input_set"]: r for r in rows if r["runtime"] == "onnxruntime"}
    assert ort["example"]["reference"] == "float32"
    assert ort["batch-1"]["reference"] == "float64" and ort["batch-1"]["status"] == "pass"
    assert ort["batch-consistency"]["status"] == "pass" and ort["batch-consistency"]["outputs"]
    assert "mixes the rows" not in out
