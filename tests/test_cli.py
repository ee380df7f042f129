"""The CLI end to end on the tiny preset: verdicts, reports, exit codes and every bad input."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tconform import registry
from tconform.files import atomic_write_json, sha256_bytes
from tconform.runtimes.providers import unavailable_reason

pytestmark = pytest.mark.integration

FAST = ("--no-doc", "-q")


def verify(cli, ws, *extra):
    return cli(
        "verify",
        "--golden",
        str(ws["golden"]),
        "--artifacts",
        str(ws["artifacts"]),
        *FAST,
        *extra,
    )


def test_verify_passes_every_case_on_cpu_and_torch(cli, workspace, tmp_path):
    code, out, err = verify(
        cli,
        workspace,
        "--json",
        str(tmp_path / "r.json"),
        "--junit",
        str(tmp_path / "r.xml"),
        "--markdown",
        str(tmp_path / "r.md"),
    )
    assert code == 0, out + err
    report = json.loads((tmp_path / "r.json").read_text())
    assert set(report) >= {"tool", "version", "environment", "results"}
    assert set(report["environment"]) >= {
        "python",
        "torch",
        "onnx",
        "onnxruntime",
        "providers_available",
        "cpu",
    }
    results = report["results"]
    for name in registry.case_names():
        for runtime in ("onnxruntime", "torch"):
            rows = [r for r in results if r["case"] == name and r["runtime"] == runtime]
            assert len(rows) == 3 and all(r["status"] == "pass" for r in rows), (name, runtime)
    ort_row = next(r for r in results if r["runtime"] == "onnxruntime")
    assert ort_row["ep"] == "cpu" and ort_row["ep_actual"] == ["CPUExecutionProvider"]
    assert set(ort_row) >= {
        "case",
        "component",
        "runtime",
        "ep",
        "ep_actual",
        "input_set",
        "status",
        "message",
        "outputs",
    }
    assert set(ort_row["outputs"][0]) >= {
        "name",
        "shape",
        "max_abs_err",
        "max_rel_err",
        "atol",
        "rtol",
        "tolerance_used",
        "mismatches",
    }
    suites = ET.parse(tmp_path / "r.xml").getroot()
    assert int(suites.find("testsuite").get("tests")) == 3 * len(registry.CASES)
    assert "| transformer | ort-cpu |" in (tmp_path / "r.md").read_text()
    assert "transformer" in out and "ort-cpu" in out


def test_verify_round_trip_with_the_torchscript_exporter(cli, workspace, tmp_path):
    code, out, _ = cli("export", "--exporter", "torchscript", "--out", str(tmp_path / "ts"))
    count = len(registry.CASES)
    assert code == 0 and f"{count} exported" in out
    code, out, _ = cli("export", "--exporter", "torchscript", "--out", str(tmp_path / "ts"))
    assert f"0 exported, {count} cached" in out
    code, out, err = cli(
        "verify",
        "--golden",
        str(workspace["golden"]),
        "--artifacts",
        str(tmp_path / "ts"),
        "--no-torch",
        *FAST,
    )
    assert code == 0, out + err


def test_a_wrong_golden_value_is_a_conformance_failure(cli, workspace):
    path = workspace["golden"] / "norm" / "test_data_set_1" / "output_0.pb"
    proto = onnx.load_tensor(str(path))
    name, array = proto.name, numpy_helper.to_array(proto).copy()
    array[0, 0, 0] += 0.01
    data = numpy_helper.from_array(array, name=name).SerializeToString()
    path.write_bytes(data)
    manifest = json.loads((workspace["golden"] / "manifest.json").read_text())
    manifest["cases"]["norm"]["sha256"]["test_data_set_1/output_0.pb"] = sha256_bytes(data)
    atomic_write_json(workspace["golden"] / "manifest.json", manifest)
    code, out, _ = verify(cli, workspace, "--case", "norm")
    assert code == 1
    assert "FAIL" in out and "[0, 0, 0]" in out  # the worst element is shown with its index


def test_flipped_byte_in_a_golden_names_the_file(cli, workspace):
    path = workspace["golden"] / "encoder" / "test_data_set_2" / "output_0.pb"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    code, _, err = verify(cli, workspace)
    assert code != 0 and str(path) in err and "Traceback" not in err


def test_truncated_model_is_one_line_and_exit_2(cli, workspace):
    path = workspace["artifacts"] / "decoder" / "model.onnx"
    path.write_bytes(path.read_bytes()[:200])
    code, _, err = verify(cli, workspace)
    assert code == 2 and str(path) in err and len(err.strip().splitlines()) == 1


def test_unloadable_model_is_one_line_and_exit_2(cli, workspace):
    path = workspace["artifacts"] / "norm" / "model.onnx"
    path.write_bytes(b"not a model")
    manifest = json.loads((workspace["artifacts"] / "manifest.json").read_text())
    manifest["models"]["norm"]["sha256"] = sha256_bytes(b"not a model")
    atomic_write_json(workspace["artifacts"] / "manifest.json", manifest)
    code, _, err = verify(cli, workspace, "--case", "norm")
    assert code == 2 and "cannot load" in err and len(err.strip().splitlines()) == 1


def _rewrite_golden(ws, case, rel, array, name):
    data = numpy_helper.from_array(array, name=name).SerializeToString() if name else array
    path = ws["golden"] / case / rel
    path.write_bytes(data)
    manifest = json.loads((ws["golden"] / "manifest.json").read_text())
    manifest["cases"][case]["sha256"][rel] = sha256_bytes(data)
    atomic_write_json(ws["golden"] / "manifest.json", manifest)
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: (b"\x07garbage", None), "not a serialized TensorProto"),
        (lambda: (np.zeros((2, 2), np.int64), "src_ids"), "shape"),
        (lambda: (np.zeros((1, 1), np.int32), "src_ids"), "dtype"),
        (lambda: (np.full((1, 1), 999, np.int64), "src_ids"), "token id 999 outside 0..28"),
        (lambda: (np.zeros((1, 1), np.int64), "tokens"), "named 'tokens'"),
    ],
)
def test_bad_golden_inputs_are_one_line_errors(cli, workspace, make, message):
    array, name = make()
    path = _rewrite_golden(workspace, "embedding", "test_data_set_0/input_0.pb", array, name)
    code, _, err = verify(cli, workspace, "--case", "embedding")
    assert code == 2 and message in err and str(path) in err
    assert len(err.strip().splitlines()) == 1


def test_sequence_longer_than_the_preset_maximum(cli, workspace):
    seq = 13
    array = np.zeros((1, seq), np.int64)
    manifest = json.loads((workspace["golden"] / "manifest.json").read_text())
    manifest["cases"]["embedding"]["sets"]["test_data_set_0"]["src_ids"] = [1, seq]
    atomic_write_json(workspace["golden"] / "manifest.json", manifest)
    _rewrite_golden(workspace, "embedding", "test_data_set_0/input_0.pb", array, "src_ids")
    code, _, err = verify(cli, workspace, "--case", "embedding")
    assert code == 2 and "sequence length 13 exceeds the preset's maximum 12" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("verify", "--golden", "/nonexistent/golden"), "no golden folder"),
        (("verify", "--case", "softmax"), "unknown case 'softmax'"),
        (("verify", "--ep", "tpu"), "unknown execution provider 'tpu'"),
        (("export", "--preset", "huge"), "'huge' is not one of"),
        (("golden", "--check", "--out", "/nonexistent/golden"), "no golden folder"),
    ],
)
def test_usage_errors_exit_2_with_one_line(cli, args, message):
    code, _, err = cli(*args)
    assert code == 2 and message in err and "Traceback" not in err


def test_empty_golden_folder(cli, tmp_path):
    (tmp_path / "g").mkdir()
    code, _, err = cli("verify", "--golden", str(tmp_path / "g"))
    assert code == 2 and "manifest.json: missing" in err


def test_golden_refuses_to_overwrite_and_check_passes(cli, workspace):
    code, _, err = cli("golden", "--out", str(workspace["golden"]))
    assert code == 2 and "--force" in err
    code, out, _ = cli("golden", "--check", "--out", str(workspace["golden"]))
    assert code == 0 and "matches a regeneration" in out


@pytest.mark.skipif(
    unavailable_reason("cuda") is None, reason="needs a machine where CUDA cannot run"
)
def test_cuda_requested_without_a_gpu_is_unavailable_never_pass(cli, workspace, tmp_path):
    code, _, _ = verify(
        cli,
        workspace,
        "--ep",
        "cuda",
        "--case",
        "norm",
        "--no-torch",
        "--json",
        str(tmp_path / "c.json"),
    )
    rows = json.loads((tmp_path / "c.json").read_text())["results"]
    assert code == 3 and rows and all(r["status"] == "unavailable" for r in rows)
    assert all(r["message"] for r in rows)
    code, _, _ = verify(cli, workspace, "--ep", "cpu,cuda", "--allow-missing-ep", "--case", "norm")
    assert code == 0


def test_a_reader_that_goes_away_does_not_change_the_exit_code():
    """`tconform ... | head`: once stdout's reader is gone the output is dropped, and the
    command still exits with its own code (click would make a broken pipe exit 1)."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "tconform", "--version"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # before the command writes: its first write meets a broken pipe
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert b"Traceback" not in err and b"Exception ignored" not in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_stdout_is_one_line_naming_it_after_the_reports(workspace, tmp_path):
    """`tconform verify ... >/dev/full`: the run and its JSON report complete, then one line
    says it was stdout that could not be written (exit 2: the printed output is lost), as the
    report's error does."""
    import subprocess
    import sys

    report = tmp_path / "r.json"
    args = ["--golden", str(workspace["golden"]), "--artifacts", str(workspace["artifacts"])]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "tconform", "verify", *args, *FAST, "--case", "norm",
             "--json", str(report)],
            stdout=full,
            stderr=subprocess.PIPE,
            timeout=300,
        )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == ["tconform: error: stdout: No space left on device"]
    data = json.loads(report.read_text())
    assert {r["status"] for r in data["results"]} == {"pass"}
    # the report says what the process's exit says (it said exit 0, no error)
    assert data["exit_code"] == 2 and data["error"]["message"] == "stdout: No space left on device"


def test_a_closed_stdout_does_not_change_the_exit_code():
    """`tconform ... >&-`: started without a stdout, the command still exits with its code."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "tconform", "--version"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        close_fds=True,
        preexec_fn=lambda: __import__("os").close(1),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr


def test_help_names_every_environment_variable_tconform_reads(cli):
    from tconform.variables import VARIABLES

    code, out, _ = cli("-h")
    assert code == 0
    flat = " ".join(out.split())
    assert all(name in flat for name in VARIABLES)
    assert "seconds a runtime's worker process may take to answer one request" in flat


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--generation", "--case", "norm"), "--case: not taken here (--generation writes every"),
        (("--generation", "--check", "--seed", "1"), "--seed: not taken here (--check regenerates"),
        (("--check", "--preset", "base"), "--preset: not taken here (--check regenerates"),
    ],
)
def test_golden_refuses_an_option_it_would_pass_over(cli, tmp_path, args, says):
    """An option golden would ignore (the generation goldens are all of their cases; --check
    regenerates with the folder's own preset and seed) is a usage error, not a silent pass."""
    code, out, err = cli("golden", *args, "--out", str(tmp_path / "g"))
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, out + err
    assert not (tmp_path / "g").exists()


def test_a_signal_python_swallows_prints_no_traceback(capsys, monkeypatch):
    """A Ctrl-C raised inside a weakref callback cannot propagate: Python hands it to
    sys.unraisablehook, whose default prints a traceback. tconform's hook keeps quiet for a
    signal it recorded (raised again at the next progress line) and passes anything else on."""
    import signal
    import sys
    import weakref

    from tconform.commands import run as frame

    class Held:
        pass

    def interrupted(_ref):
        raise KeyboardInterrupt

    monkeypatch.setattr(sys, "unraisablehook", frame.quiet_unraisable)
    monkeypatch.setattr(frame, "received", [signal.SIGINT])
    held = Held()
    ref = weakref.ref(held, interrupted)
    del held
    assert ref() is None and capsys.readouterr().err == ""
    monkeypatch.setattr(frame, "received", [])  # not a signal tconform saw: Python's own hook
    held = Held()
    ref = weakref.ref(held, interrupted)
    del held
    assert "KeyboardInterrupt" in capsys.readouterr().err


def test_a_current_folder_removed_under_the_shell_is_one_line_naming_it(tmp_path):
    """Every relative path and default folder is read from the current folder: one removed
    after the shell entered it is said to be that, not an option's path."""
    import subprocess
    import sys

    gone = tmp_path / "gone"
    gone.mkdir()
    report = tmp_path / "r.json"
    script = f'cd "{gone}" && rmdir "{gone}" && exec "$0" -m tconform verify --json "{report}"'
    done = subprocess.run(["sh", "-c", script, sys.executable], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "tconform: error: the current folder no longer exists (removed after the shell entered it)"
    ]
    assert json.loads(report.read_text())["error"]["exit_code"] == 2
