"""A user's model is a case like any other: the matrix's dtypes (made with ONNX Runtime's own
converters) and the pytest plugin's units apply to it as to tconform's own cases."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.axes]  # its own tier: -m axes

FACTORY = """
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.norm = nn.LayerNorm(16)

    def forward(self, ids):
        x = self.embed(ids)
        return self.norm(x + self.mlp(x))


def make():
    torch.manual_seed(0)
    return Encoder(), torch.randint(0, 32, (2, 6))
"""


@pytest.fixture
def user_model(tmp_path, monkeypatch):
    (tmp_path / "usermodel.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    return "usermodel:make"


def test_check_matrix_gives_rows_in_each_precision(cli, user_model, tmp_path):
    report = tmp_path / "r.json"
    code, out, err = cli(
        "check", user_model, "--matrix", "--dtype", "float32,float16,int8", "--no-torch",
        "--out", str(tmp_path / "export"), "--json", str(report), "-q",
    )  # fmt: skip
    assert code == 0, out + err
    results = json.loads(report.read_text())["results"]
    precisions = {r["precision"] for r in results}
    assert precisions == {"float32", "float16", "int8"}, precisions
    assert {r["status"] for r in results} == {"pass"}
    cells = {r["cell"] for r in results}
    assert cells == {f"auto-opset18-{d}-all" for d in ("float32", "float16", "int8")}
    # every cell at the example's shape and at shapes it never had, batch consistency among them
    sets = {r["input_set"] for r in results}
    assert {"example", "batch-1", "batch-4", "seq-3", "seq-12", "batch-consistency"} <= sets
    assert "matrix (worst over input sets" in out  # the pivot of cases x cells


def test_pytest_runs_a_user_model_s_units(user_model, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--tconform",
         "--tconform-module", user_model, "-q", "--junitxml", str(tmp_path / "j.xml")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    names = [c.get("name") for c in ET.parse(tmp_path / "j.xml").getroot().iter("testcase")]
    assert "usermodel:make/auto-opset18-float32-all/ort-cpu/batch-consistency" in names
    assert any(n.startswith("usermodel:make/module/torch") for n in names)
