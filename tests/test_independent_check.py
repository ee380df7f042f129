"""The acceptance check a new user runs: goldens reproduced with only onnx and onnxruntime, and
with onnx's ReferenceEvaluator as a second runtime."""

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
    assert proc.stdout.count(" reference ") == proc.stdout.count(" onnxruntime ") == 42
