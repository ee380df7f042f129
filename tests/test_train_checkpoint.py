"""scripts/train_checkpoint.py is deterministic: two short runs write identical files (the
committed checkpoint's full run is not repeated here: minutes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_checkpoint.py"


def test_two_short_training_runs_give_identical_files(tmp_path):
    # Two processes side by side: the import of torch dominates, and each run uses one thread.
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), "--steps", "5", "--out", str(tmp_path / run)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run in ("a", "b")
    ]
    for proc in procs:
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr[-2000:]
    a, b = ({p.name: p.read_bytes() for p in (tmp_path / run).iterdir()} for run in ("a", "b"))
    assert sorted(a) == ["reverse.json", "reverse.npz"]
    assert a == b
