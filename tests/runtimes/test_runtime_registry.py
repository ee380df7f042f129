"""A new runtime is one class and one RUNTIMES entry: verify runs it, labels it and judges it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import onnx
import pytest

from tconform import runtimes
from tconform.runtimes.onnx_reference import OnnxReferenceRuntime, OnnxReferenceSession

pytestmark = pytest.mark.integration


class ShiftedSession(OnnxReferenceSession):
    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: out + np.float32(1e-2) for name, out in super().run(feeds).items()}


@dataclass
class ShiftedRuntime(OnnxReferenceRuntime):
    """A broken runtime for the test: ONNX's reference evaluator, every output off by 1e-2."""

    name: ClassVar[str] = "shifted"

    def open(self, model_path) -> ShiftedSession:
        return ShiftedSession(super().open(model_path).evaluator, onnx.load(str(model_path)))


def _verify(cli, workspace, tmp_path, runtime: str) -> tuple[int, list[dict]]:
    report = tmp_path / f"{runtime}.json"
    code, _, err = cli(
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(workspace["artifacts"]),
        "--case", "norm", "--no-doc", "--runtime", runtime, "--json", str(report), "-q",
    )  # fmt: skip
    assert "Traceback" not in err
    return code, json.loads(report.read_text())["results"]


def test_onnx_reference_is_a_runtime_of_verify(cli, workspace, tmp_path):
    code, results = _verify(cli, workspace, tmp_path, "onnx-reference")
    assert code == 0 and results
    assert {(r["runtime"], r["status"]) for r in results} == {("onnx-reference", "pass")}


def test_a_runtime_added_to_the_registry_runs_and_is_judged(cli, workspace, tmp_path, monkeypatch):
    monkeypatch.setitem(runtimes.RUNTIMES, "shifted", f"{__name__}:ShiftedRuntime")
    code, results = _verify(cli, workspace, tmp_path, "shifted")
    assert code == 1  # its wrong outputs fail against the goldens: it really ran
    assert {(r["runtime"], r["status"]) for r in results} == {("shifted", "fail")}
