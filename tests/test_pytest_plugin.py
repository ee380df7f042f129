"""The pytest plugin (`pytest --tconform`): one item per verify work unit, across xdist workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tconform.results import Result
from tconform.units import result_unit

CASES = ("embedding", "norm")


@pytest.mark.unit
def test_the_plugin_costs_nothing_without_the_flag():
    """Every pytest session of the project loads it: importing it must not import torch."""
    code = (
        "import sys, tconform.pytest_plugin; "
        "print('torch' in sys.modules, 'onnxruntime' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]


@pytest.mark.integration
def test_pytest_tconform_n2_runs_the_units_of_verify(cli, workspace, tmp_path):
    golden_dir, artifacts = workspace["golden"], workspace["artifacts"]  # exported once per run
    common = ["--golden", str(golden_dir), "--artifacts", str(artifacts)]
    cases = [a for case in CASES for a in ("--case", case)]
    # cuda is requested and absent here: its units must be skips with the reason, never passes.
    code, _, err = cli(
        "verify",
        *common,
        *cases,
        "--ep",
        "cpu,cuda",
        "--no-doc",
        "-q",
        "--json",
        str(tmp_path / "v.json"),
    )
    assert code == 3, err
    verified = json.loads((tmp_path / "v.json").read_text())

    run = tmp_path / "run"  # a folder of its own: no test files, no project conftest
    run.mkdir()
    plugin = ["--tconform", "--tconform-golden", str(golden_dir), "--tconform-artifacts",
              str(artifacts)]  # fmt: skip
    plugin += [a for case in CASES for a in ("--tconform-case", case)]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            *plugin,
            "--tconform-ep",
            "cpu,cuda",
            "--tconform-no-doc",
            "-n",
            "2",
            "-q",
            "--junitxml",
            str(tmp_path / "j.xml"),
        ],
        cwd=run,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "bringing up nodes" in done.stdout  # xdist really spread them
    cases_run = list(ET.parse(tmp_path / "j.xml").getroot().iter("testcase"))
    assert sorted(c.get("name") for c in cases_run) == sorted(verified["settings"]["units"]["ids"])
    results = [Result.from_dict(r) for r in verified["results"]]
    status = {result_unit(r): r.status for r in results}
    for case in cases_run:
        skipped = case.find("skipped")
        assert (skipped is not None) == (status[case.get("name")] == "unavailable"), case.get(
            "name"
        )
        if skipped is not None:
            assert "cuda" in skipped.get("message")
    assert (
        sum(c.find("skipped") is None for c in cases_run)
        == sum(s == "pass" for s in status.values())
        > 0
    )

    # --collect-only counts the units as the tests they are.
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, "--tconform-no-doc",
         "--collect-only", "-q"],
        cwd=run, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    cpu_units = [u for u in verified["settings"]["units"]["ids"] if "cuda" not in u]
    assert f"{len(cpu_units)} tests collected" in listed.stdout, listed.stdout[-2000:]


@pytest.mark.integration
@pytest.mark.skipif(
    __import__("tconform.runtimes.providers").runtimes.providers.unavailable_reason("cuda") is None,
    reason="needs a machine where CUDA cannot run",
)
def test_a_session_whose_every_unit_skipped_is_not_a_pass(workspace, tmp_path):
    """cuda alone, where it cannot run: every unit is a skip with its reason, and the session
    ends with exit 5, never 0 (nothing checked is never a pass), on one process or on xdist's."""
    plugin = ["--tconform", "--tconform-golden", str(workspace["golden"]), "--tconform-artifacts",
              str(workspace["artifacts"]), "--tconform-case", "norm", "--tconform-ep", "cuda",
              "--tconform-no-doc"]  # fmt: skip
    for workers in ([], ["-n", "2"]):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, *workers, "-q"],
            cwd=tmp_path, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, done.stdout[-2000:]
        assert "skipped" in done.stdout and "nothing checked" in done.stdout


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        ((), {"TCONFORM_LOCK_TIMEOUT": "abc"}, "TCONFORM_LOCK_TIMEOUT='abc'"),
        ((), {"TCONFORM_LOCKTIMEOUT": "5"}, "TCONFORM_LOCKTIMEOUT: not one tconform reads"),
        (("--tconform-golden", "g" * 300), {}, "the file system takes at most 255"),
        (("--tconform-artifacts", "a" * 250), {}, "names it writes are at most"),
        (("--tconform-golden", "notes.txt"), {}, "notes.txt: exists and is not a folder"),
        (("--tconform-inputs", "notes.txt"), {}, "--tconform-inputs is for a user's model"),
        (("--tconform-runtime", "nosuch"), {}, "unknown runtime 'nosuch'"),
        (
            ("--tconform-module", "pkg.mod:make", "--tconform-inputs", "notes.txt"),
            {},
            "notes.txt: not a .npz archive",
        ),
    ],
    ids=[
        "bad-variable",
        "unknown-variable",
        "golden-name-too-long",
        "artifacts-name",
        "a-file",
        "inputs-without-a-model",
        "unknown-runtime",
        "inputs-not-an-archive",
    ],
)
def test_the_plugin_refuses_bad_input_before_collecting(tmp_path, args, env, says):
    """The command's own checks (the environment, the folder options' type), as a pytest usage
    error: exit 4, the line saying why, no traceback, nothing written."""
    (tmp_path / "notes.txt").write_text("the user's\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--tconform", *args,
         "--collect-only", "-q"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={k: v for k, v in {**os.environ, **env}.items() if k != "PYTEST_ADDOPTS"},
    )  # fmt: skip
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert says in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.integration
def test_a_golden_file_the_manifest_does_not_list_is_a_usage_error_at_collection(tmp_path):
    """As verify refuses it before the run (exit 2): exit 4 and its line, not a failed test
    per unit that CI would read as a conformance failure."""
    import shutil

    golden = tmp_path / "g"
    shutil.copytree(Path(__file__).resolve().parents[1] / "golden", golden)
    (golden / "norm" / "test_data_set_0" / "extra.pb").write_bytes(b"x")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--tconform",
         "--tconform-golden", "g", "--tconform-case", "norm", "--tconform-no-doc", "-q"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
    )  # fmt: skip
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "extra.pb: not listed in" in done.stderr, done.stderr


@pytest.mark.unit
def test_every_option_check_has_for_a_users_model_reaches_its_request(tmp_path):
    """--tconform-inputs, -dynamic, -model and -padding-mask are check's --inputs, --dynamic,
    --model and --padding-mask (a left-padded decoder could not pass under the plugin)."""
    import numpy as np

    from tconform.pytest_plugin import _request

    np.savez(tmp_path / "x.npz", ids=np.zeros((2, 3), np.int64))
    (tmp_path / "m.onnx").write_bytes(b"a model made elsewhere")
    given = {
        "--tconform-module": "pkg.mod:make",
        "--tconform-inputs": str(tmp_path / "x.npz"),
        "--tconform-dynamic": ["ids=0:batch"],
        "--tconform-model": str(tmp_path / "m.onnx"),
        "--tconform-padding-mask": "attention_mask",
        "--tconform-golden": None,
        "--tconform-artifacts": "artifacts",
        "--tconform-ep": "cpu",
        "--tconform-runtime": ["onnxruntime==1.20.1", "openvino"],
    }

    class Config:
        def getoption(self, flag):
            return given.get(flag)  # None: not given (falsy for the flags too)

    request = _request(Config())
    assert request.runtimes.names == ("onnxruntime==1.20.1", "openvino")  # as verify's --runtime
    subject = request.subject
    assert subject.target == "pkg.mod:make" and subject.inputs == tmp_path / "x.npz"
    assert subject.dynamic == ("ids=0:batch",)
    assert subject.model == tmp_path / "m.onnx" and subject.padding_mask == "attention_mask"


@pytest.mark.unit
def test_a_message_written_for_check_names_the_plugin_s_flags():
    from tconform.pytest_plugin import _in_plugin_terms

    said = _in_plugin_terms(
        "tconform check --dynamic ids=0:N exports it free; compare with --padding-mask mask; "
        "--localise; --model-zoo and --tconform-dynamic stay"
    )
    assert said == (
        "--tconform-dynamic ids=0:N exports it free; compare with --tconform-padding-mask mask; "
        "--tconform-localise; --model-zoo and --tconform-dynamic stay"
    )


LOCALISED = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def make():
    torch.manual_seed(0)
    return Block(), torch.randn(2, 5, 8)


if __name__ == "__main__":  # the export a user made elsewhere, one weight 1 % off
    block, x = make()
    with torch.no_grad():
        block.down.weight.mul_(1.01)
    torch.onnx.export(block, (x,), "bad.onnx", input_names=["x"], dynamo=False)
"""


@pytest.mark.integration
def test_tconform_localise_names_the_module_in_the_failing_unit(tmp_path):
    """As check's --localise, by default on a failure: the failing unit's message carries the
    localisation, which names the one module whose weight is off."""
    (tmp_path / "usermodel.py").write_text(LOCALISED)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    subprocess.run([sys.executable, "usermodel.py"], cwd=tmp_path, check=True, env=env)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--tconform",
         "--tconform-module", "usermodel:make", "--tconform-model", "bad.onnx",
         "-q", "-k", "example"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "localisation on ort-cpu" in done.stdout, done.stdout
    assert "first divergence: down" in done.stdout, done.stdout
