"""The acceptance check a new user runs: goldens reproduced with only onnx and onnxruntime, and
with onnx's ReferenceEvaluator as a second runtime."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "independent_check.py"


def test_goldens_reproduce_without_tconform(built):
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--golden",
            str(built["golden"]),
            "--artifacts",
            str(built["artifacts"]),
            "--reference",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "0 failures" in proc.stdout
    cases = json.loads((built["golden"] / "manifest.json").read_text())["cases"]
    input_sets = sum(len(case["sets"]) for case in cases.values())  # every case, every set
    assert proc.stdout.count(" reference ") == proc.stdout.count(" onnxruntime ") == input_sets
