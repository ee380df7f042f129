"""The README's BERT walk-through, run as a newcomer runs it, in a fresh folder: `tconform
check examples.bert:make` passes; examples/corrupt_bert.py breaks the export it wrote; the check
of the broken file fails and names the corrupted module; the repro bundle reproduces it alone."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tconform.cli import cli as tconform_cli

pytestmark = pytest.mark.zoo

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(tconform_cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout + result.stderr


def test_the_readme_bert_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))  # `examples.bert` as from the checkout's root
    code, out = run_cli("check", "examples.bert:make", "-q")
    assert code == 0, out
    assert re.search(r"^(\d+) results: \1 pass$", out, re.M), out

    runpy.run_path(str(ROOT / "examples" / "corrupt_bert.py"))
    code, out = run_cli(
        "check", "examples.bert:make", "--model", "bert_bad.onnx", "--repro", "bert-repro", "-q"
    )
    assert code == 1, out
    assert "first divergence: encoder.layer.1.intermediate.dense (" in out
    assert "it computes wrong" in out  # isolated, the module itself fails
    reproduced = subprocess.run(
        [sys.executable, "bert-repro/reproduce.py"], capture_output=True, text=True, check=False
    )
    assert reproduced.returncode == 1, reproduced.stdout + reproduced.stderr
    # the row's atol 1e-05, scaled to the output's RMS (about 0.16; its last digit differs
    # between CPUs): docs/tolerances.md
    scaled = re.search(r"outside atol ([0-9.e+-]+) \+ rtol 1e-05", reproduced.stdout)
    assert scaled and 1.5e-06 < float(scaled.group(1)) < 1.7e-06, reproduced.stdout
