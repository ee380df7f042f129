"""A new runtime is one class and one RUNTIMES entry: verify runs it, labels it and judges it;
an option it declares is on the command line and reaches it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import onnx
import pytest

from tconform import runtimes
from tconform.runtimes.base import RuntimeOption
from tconform.runtimes.onnx_reference import OnnxReferenceRuntime, OnnxReferenceSession

pytestmark = pytest.mark.integration


class ShiftedSession(OnnxReferenceSession):
    shift = 1e-2

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: out + np.float32(self.shift) for name, out in super().run(feeds).items()}


@dataclass
class ShiftedRuntime(OnnxReferenceRuntime):
    """A broken runtime for the test: ONNX's reference evaluator, every output off by
    10**-shift_exponent (1e-2 unless its own option says otherwise)."""

    name: ClassVar[str] = "shifted"
    options: ClassVar[tuple[RuntimeOption, ...]] = (
        RuntimeOption("shift_exponent", "--shift-exponent", "Outputs off by 10**-N.", int, (1, 12)),
    )
    shift_exponent: int = 2

    def open(self, model_path) -> ShiftedSession:
        session = ShiftedSession(super().open(model_path).evaluator, onnx.load(str(model_path)))
        session.shift = 10.0**-self.shift_exponent
        return session


def _verify(cli, workspace, tmp_path, runtime: str, *args: str) -> tuple[int, list[dict]]:
    report = tmp_path / f"{runtime}.json"
    code, _, err = cli(
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(workspace["artifacts"]),
        "--case", "norm", "--no-doc", "--runtime", runtime, "--json", str(report), "-q", *args,
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


def test_an_option_a_runtime_declares_is_on_the_command_line_and_reaches_it(
    cli, workspace, tmp_path, monkeypatch
):
    """Declared in the runtime's class alone: every command that takes runtimes offers it, and
    the value given reaches the runtime (outputs off by 1e-9 pass where 1e-2 failed)."""
    monkeypatch.setitem(runtimes.RUNTIMES, "shifted", f"{__name__}:ShiftedRuntime")
    for command in ("verify", "check", "doc", "bench"):
        assert "--shift-exponent" in cli(command, "--help")[1], command
    code, results = _verify(cli, workspace, tmp_path, "shifted", "--shift-exponent", "9")
    assert code == 0 and {(r["runtime"], r["status"]) for r in results} == {("shifted", "pass")}
    code, _, err = cli("verify", "--runtime", "shifted", "--shift-exponent", "0")
    assert code == 2 and "--shift-exponent" in err
