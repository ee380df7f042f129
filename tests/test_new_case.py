"""Adding a component is one registry entry plus its reference and oracle functions.

This test defines a case the project does not have (a gated linear unit behind torch's own
LayerNorm, whose 1-D `weight` the default initialisation rules must handle, and a per-case rule
for its gate bias), appends it to the registry and nothing else, then runs export, golden, verify
and bench on it through the CLI.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from tconform import registry
from tconform.config import PRESETS, ModelConfig
from tconform.registry import X_SRC, Case, TensorSpec

pytestmark = pytest.mark.integration

LN_EPS = 1e-5
GATE_BIAS = 0.5


class GatedUnit(nn.Module):
    """out = a * sigmoid(b), where [a, b] = W LayerNorm(x) + c."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model, eps=LN_EPS)
        self.proj = nn.Linear(cfg.d_model, 2 * cfg.d_model)
        self.gate_bias = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.proj(self.norm(x)).chunk(2, dim=-1)
        return a * torch.sigmoid(b + self.gate_bias)


def gated_unit(p: dict[str, np.ndarray], cfg: ModelConfig, x: np.ndarray) -> tuple[np.ndarray]:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    normed = (x - mean) / np.sqrt(var + LN_EPS) * p["norm.weight"] + p["norm.bias"]
    a, b = np.split(normed @ p["proj.weight"].T + p["proj.bias"], 2, axis=-1)
    return (a / (1.0 + np.exp(-(b + p["gate_bias"]))),)


GATED = Case(
    "gated_unit",
    "gated linear unit (a throwaway case)",
    GatedUnit,
    gated_unit,
    lambda cfg: (X_SRC,),
    lambda cfg: (TensorSpec("out", ("batch", "src_seq", "d_model")),),
    "component",
    weight_init={"gate_bias": lambda shape, rng: np.full(shape, GATE_BIAS)},
)


@pytest.fixture
def with_new_case(monkeypatch):
    monkeypatch.setattr(registry, "CASES", (*registry.CASES, GATED))


def test_its_weights_follow_the_default_rules_and_its_own(with_new_case):
    case = registry.get_case("gated_unit")  # found through the registry like any other
    params = case.make_params(PRESETS["tiny"], 0)
    assert np.all(params["gate_bias"] == GATE_BIAS)  # the case's own rule
    assert abs(params["norm.weight"].mean() - 1.0) < 0.1  # a 1-D weight is a norm's scale
    assert params["proj.weight"].shape == (32, 16)


def test_export_golden_verify_and_bench_handle_it(with_new_case, cli, tmp_path):
    golden, artifacts = tmp_path / "golden", tmp_path / "artifacts"
    code, out, err = cli("golden", "--out", str(golden), "--preset", "tiny", "--case", "gated_unit")
    assert code == 0, out + err
    code, out, err = cli(
        "export", "--out", str(artifacts), "--preset", "tiny", "--case", "gated_unit"
    )
    assert code == 0, out + err
    assert (artifacts / "gated_unit" / "model.onnx").is_file()

    report = tmp_path / "verify.json"
    code, out, err = cli(
        "verify", "--golden", str(golden), "--artifacts", str(artifacts), "--no-doc",
        "--case", "gated_unit",
        "--json", str(report),
    )  # fmt: skip
    assert code == 0, out + err
    results = json.loads(report.read_text())["results"]
    assert {r["case"] for r in results} == {"gated_unit"}
    assert {r["status"] for r in results} == {"pass"} and len(results) >= 2

    bench = tmp_path / "bench.json"
    code, out, err = cli(
        "bench", "--case", "gated_unit", "--preset", "tiny", "--shape", "2x8", "--runs", "5",
        "--warmup", "1", "--ep", "cpu", "--engine", "onnxruntime", "--engine", "torch",
        "--artifacts", str(tmp_path / "bench-artifacts"),
        "--json", str(bench),
    )  # fmt: skip
    assert code == 0, out + err
    rows = [r for r in json.loads(bench.read_text())["results"] if r["status"] == "pass"]
    # FLOPs counted on the module (no formula given): the projection, 2*rows*d*2d.
    projection = 2 * 16 * 16 * 32 / 1e9
    assert rows and all(r["gflop"] == pytest.approx(projection, rel=1e-2) for r in rows)
