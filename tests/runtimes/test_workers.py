"""Runtimes in worker processes: `NAME@PYTHON` runs the runtime that interpreter has, says what
it says in tconform's own process, keeps a cache in the worker, times in the worker; a worker
whose native code crashes or hangs is that row's verdict (crash, exit 1), the run goes on, its
reports and a repro bundle are written.

The interpreters here are made in a second from the running one (a venv that sees its packages
through a .pth file), with a sitecustomize.py that breaks ONNX Runtime where the test needs it:
no network, nothing installed."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import sysconfig
import time
import venv
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import tconform
from tconform.errors import WorkerCrashed
from tconform.execution import Subject, execute
from tconform.models import given_file
from tconform.results import Result
from tconform.runtimes import make_runtime
from tconform.runtimes.remote import Handle, stop_workers
from tconform.runtimes.specs import parse_spec

pytestmark = pytest.mark.integration

CRASH_ON_RUN = """
import os
import onnxruntime

def _crash(*args, **kwargs):
    os.abort()  # native code dying: SIGABRT

onnxruntime.InferenceSession.run = _crash
"""

HANG_ON_RUN = """
import time
import onnxruntime

def _hang(*args, **kwargs):
    time.sleep(3600)

onnxruntime.InferenceSession.run = _hang
"""

# Answers the first two runs (one untimed run of bench's, and one more), then hangs.
HANG_ON_THIRD_RUN = """
import time
import onnxruntime

_run, _calls = onnxruntime.InferenceSession.run, []

def _late_hang(self, *args, **kwargs):
    _calls.append(1)
    if len(_calls) > 2:
        time.sleep(3600)
    return _run(self, *args, **kwargs)

onnxruntime.InferenceSession.run = _late_hang
"""


def interpreter(folder: Path, sitecustomize: str = "") -> Path:
    """A Python that sees this test run's packages (a .pth file naming its site-packages), with
    `sitecustomize` run at its start."""
    venv.create(folder, with_pip=False, symlinks=True)
    python = folder / "bin" / "python"
    site = subprocess.check_output(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()
    (Path(site) / "tconform_test.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    if sitecustomize:
        (Path(site) / "sitecustomize.py").write_text(sitecustomize)
    return python


def add_model(path: Path) -> Path:
    """y = x + x, the smallest model there is."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "add", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return path


class Sets:
    def __init__(self, name: str, x: np.ndarray) -> None:
        self.name, self.inputs, self.outputs = name, {"x": x}, {"y": x + x}


def _judge(outputs, input_set, precision):
    from tconform.compare import compare

    return [compare("y", outputs["y"], input_set.outputs["y"], 1e-6, 0.0)]


def test_a_hung_worker_is_killed_and_that_row_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("TCONFORM_WORKER_TIMEOUT", "4")
    python = interpreter(tmp_path / "hangs", HANG_ON_RUN)
    runtime = make_runtime(f"onnxruntime@{python}", "cpu", crash_folder=tmp_path / "r.crash")
    model = given_file(add_model(tmp_path / "add.onnx"))
    sets = [Sets("test_data_set_0", np.ones(3, np.float32))]
    (result,) = execute(runtime, Subject(model), sets, _judge, Result.about("add", "add"))
    assert result.status == "crash"
    assert "did not answer within 4 s (hung) and was killed (SIGKILL)" in result.message
    bundle = Path(result.message.split("repro bundle: ")[1])
    assert bundle.parent == tmp_path and bundle.name.startswith("r.crash-")
    assert (bundle / "model.onnx").read_bytes() == model.path.read_bytes()
    # a copy: a hard link would make an edit of the bundle an edit of the model under test
    assert not (bundle / "model.onnx").samefile(model.path)
    fed = onnx.TensorProto()
    fed.ParseFromString((bundle / "test_data_set_0" / "input_0.pb").read_bytes())
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(fed), np.ones(3, np.float32))
    assert str(python) in (bundle / "README.md").read_text()


def test_a_worker_session_is_the_runtime_itself(tmp_path):
    """The installed ONNX Runtime through a worker: the same outputs, a cache kept there by
    handle and gathered there, and a timing loop run there."""
    python = interpreter(tmp_path / "plain")
    runtime = make_runtime(f"onnxruntime@{python}", "cpu", threads=1)
    assert runtime.settings()["worker"]["packages"]  # exact versions recorded
    session = runtime.open(add_model(tmp_path / "add.onnx"))
    try:
        assert [i.name for i in session.inputs] == ["x"] and session.outputs == ["y"]
        assert session.placement == {"cpu": 1} and session.device[0] == "worker:cpu"
        x = np.arange(6, dtype=np.float32)
        np.testing.assert_array_equal(session.run({"x": x})["y"], x + x)
        kept = session.run_bound({"x": session.to_device(x)}, keep={"y"})["y"]
        assert isinstance(kept, Handle) and kept.shape() == (6,)
        gathered = session.take(kept, np.array([5, 0]), axis=0)
        (twice,) = session.run_bound({"x": gathered}, keep=set()).values()
        np.testing.assert_array_equal(twice, [20.0, 0.0])  # (x+x)[[5,0]] doubled again
        call = session.timed_call({"x": x})
        times = call.times(1, 4, None)
        assert len(times) == 4 and all(t > 0 for t in times)
        assert call.memory()["peak_mem_mb"] > 0
        call.close()
    finally:
        session.close()
        stop_workers()


def test_a_timing_loop_that_hangs_is_found_within_the_timeout_not_once_per_run(
    tmp_path, monkeypatch
):
    """bench's loop of 300 runs is one request: it may take its first run's time a hundredfold
    per run beyond the timeout, not the timeout per run (which would be 20 minutes here)."""
    monkeypatch.setenv("TCONFORM_WORKER_TIMEOUT", "4")
    python = interpreter(tmp_path / "hangs-late", HANG_ON_THIRD_RUN)
    runtime = make_runtime(f"onnxruntime@{python}", "cpu")
    session = runtime.open(add_model(tmp_path / "add.onnx"))
    started = time.monotonic()
    try:
        call = session.timed_call({"x": np.ones(3, np.float32)})
        with pytest.raises(WorkerCrashed, match="hung"):
            call.times(2, 300, None)
    finally:
        stop_workers()
    assert time.monotonic() - started < 60


def test_two_builds_localised_on_one_model_say_where_they_part(tmp_path):
    """The installed ONNX Runtime in a worker beside itself in tconform's process, both
    localised on one model (tconform.check): the pipeline compares their localisations, and
    one build computes every module call alike."""
    python = interpreter(tmp_path / "plain")
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
    try:
        report = tconform.check(
            module, torch.ones(2, 4), runtimes=(f"onnxruntime@{python}", "onnxruntime"),
            localise=True, isolate="none", shapes=False, out_dir=tmp_path / "export",
        )  # fmt: skip
    finally:
        stop_workers()
    assert report.exit_code == 0
    (parting,) = report.partings
    assert parting.module is None and parting.compared >= 3
    assert report.details["version_partings"] == [parting.to_dict()]
    assert f"versions: {parting.verdict}" in report.render()


def test_a_crashing_runtime_is_a_verdict_and_the_run_goes_on(cli, workspace, tmp_path):
    python = interpreter(tmp_path / "crashes", CRASH_ON_RUN)
    report = tmp_path / "reports" / "verify.json"
    report.parent.mkdir()
    code, out, err = cli(
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(workspace["artifacts"]),
        "--no-export", "--no-doc", "--case", "norm", "--runtime", f"onnxruntime@{python}",
        "--runtime", "onnxruntime", "--json", str(report),
    )  # fmt: skip
    assert code == 1 and "Traceback" not in err
    results = json.loads(report.read_text())["results"]
    crashed = [r for r in results if r["runtime"] == f"onnxruntime@{python}"]
    passed = [r for r in results if r["runtime"] == "onnxruntime"]
    assert crashed and {r["status"] for r in crashed} == {"crash"}
    assert passed and {r["status"] for r in passed} == {"pass"}  # the run went on
    assert all("crashed (SIGABRT: native code called abort) while" in r["message"] for r in crashed)
    assert "CRASH" in out
    # one bundle per input set that crashed, beside the report: the model and its inputs
    bundles = sorted(report.parent.glob("verify.crash-*"))
    assert len(bundles) == len(crashed)
    named = sorted(Path(r["message"].split("repro bundle: ")[1]) for r in crashed)
    assert named == bundles  # each row names its own
    for bundle in bundles:
        assert (bundle / "model.onnx").is_file() and (bundle / "test_data_set_0").is_dir()
        about = json.loads((bundle / "bundle.json").read_text())
        assert about["runtime"] == f"onnxruntime@{python}" and "SIGABRT" in about["message"]
    # the bundle's script crashes as the worker did, outside tconform
    ran = subprocess.run([python, bundles[0] / "reproduce.py"], capture_output=True)
    assert ran.returncode == -6


def test_a_crash_mid_decoding_writes_its_repro_bundle_too(cli, generation_artifacts, tmp_path):
    """verify --generation, like every command: a runtime whose worker dies decoding is a
    crash row naming the repro bundle of the model whose run it was, beside the report."""
    python = interpreter(tmp_path / "crashes", CRASH_ON_RUN)
    report = tmp_path / "reports" / "gen.json"
    report.parent.mkdir()
    code, _, err = cli(
        "verify", "--generation", "--case", "ends-greedy", "--artifacts",
        str(generation_artifacts), "--no-export", "--runtime", f"onnxruntime@{python}",
        "--no-torch", "--json", str(report), "-q",
    )  # fmt: skip
    assert code == 1 and "Traceback" not in err
    results = json.loads(report.read_text())["results"]
    # the no-cache decoding runs the session (the cached one binds its cache: another call)
    crashed = [r for r in results if r["status"] == "crash"]
    assert [r["input_set"] for r in crashed] == ["no-cache"]
    bundles = sorted(report.parent.glob("gen.crash-*"))
    assert sorted(Path(r["message"].split("repro bundle: ")[1]) for r in crashed) == bundles
    for bundle in bundles:
        about = json.loads((bundle / "bundle.json").read_text())
        assert (bundle / "model.onnx").is_file() and "SIGABRT" in about["message"]


def test_a_bench_row_that_crashed_names_the_bytes_it_ran(cli, tmp_path):
    """bench: an engine whose worker died timing is a crash row (exit 1) that still names the
    model's exact bytes and the worker's packages, as a timed row does."""
    python = interpreter(tmp_path / "crashes", CRASH_ON_RUN)
    report = tmp_path / "b.json"
    code, _, err = cli(
        "bench", "--preset", "tiny", "--case", "norm", "--shape", "1x4", "--runs", "3",
        "--engine", f"onnxruntime@{python}", "--artifacts", str(tmp_path / "art"),
        "--json", str(report), "-q",
    )  # fmt: skip
    assert code == 1 and "crashed" in err
    (row,) = json.loads(report.read_text())["results"]
    assert row["status"] == "crash"
    details = row["details"]
    assert len(details["sha256"]) == 64 and Path(details["model"]).name == "model.onnx"
    assert details["origin"] in {"exported", "cached"} and details["versions"]["python"]


def test_a_bad_worker_setting_is_one_line(cli, workspace, tmp_path, monkeypatch):
    monkeypatch.setenv("TCONFORM_WORKER_TIMEOUT", "nan")
    code, _, err = cli(
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(workspace["artifacts"]),
        "--no-export", "--no-doc", "--case", "norm", "--runtime", f"onnxruntime@{sys.executable}",
    )  # fmt: skip
    assert code == 2 and "TCONFORM_WORKER_TIMEOUT='nan'" in err and "Traceback" not in err
    monkeypatch.delenv("TCONFORM_WORKER_TIMEOUT")
    code, _, err = cli(
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(workspace["artifacts"]),
        "--no-export", "--no-doc", "--case", "norm", "--runtime", "torch==2.13.0",
    )  # fmt: skip
    assert code == 2 and "torch runs in tconform's own process" in err


def test_an_interpreter_that_never_answers_is_ended_with_what_it_started(tmp_path, monkeypatch):
    """Asked what it holds (tconform.runtimes.environments.probe), an interpreter that hangs
    is given TCONFORM_WORKER_TIMEOUT where that is shorter, then ended with its children."""
    import psutil

    from tconform.errors import UsageError
    from tconform.runtimes.environments import probe

    sleeper = tmp_path / "sleeper"
    sleeper.write_text(
        f"#!/bin/sh\necho $$ > {tmp_path}/pid\nsleep 300 &\necho $! > {tmp_path}/child\nwait\n"
    )
    sleeper.chmod(0o755)
    monkeypatch.setenv("TCONFORM_WORKER_TIMEOUT", "2")
    spec = parse_spec(f"onnxruntime@{sleeper}")
    with pytest.raises(UsageError, match=r"sleeper did not say what it holds within 2 s"):
        probe(spec, sleeper, ("onnxruntime",))
    shell = int((tmp_path / "pid").read_text())
    assert not psutil.pid_exists(shell) or psutil.Process(shell).status() == psutil.STATUS_ZOMBIE
    child = int((tmp_path / "child").read_text())  # its own, not any other `sleep 300` here
    if psutil.pid_exists(child):
        _gone, alive = psutil.wait_procs([psutil.Process(child)], timeout=10)  # a kill lands
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]  # a moment later


WORKER_WITHOUT_ONNXRUNTIME = """
import sys
sys.modules["onnxruntime"] = None  # an environment made for openvino==X holds no onnxruntime
from tconform.runtimes.worker import Worker
reply, _ = Worker().handle("start", {"runtime": "onnx-reference", "ep": "cpu", "options": {}}, {})
print(reply["precision"])
"""


def test_a_worker_without_onnxruntime_starts_its_runtime():
    """A worker imports only what its runtime needs: an environment made for OpenVINO or the
    reference evaluator has no onnxruntime (its GPU libraries are ONNX Runtime's concern)."""
    done = subprocess.run(
        [sys.executable, "-c", WORKER_WITHOUT_ONNXRUNTIME], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == "float32", done.stderr


def test_a_gpu_runtime_in_a_worker_preloads_its_libraries_silently_and_never_beside_torch(
    monkeypatch, capsys
):
    from tconform.runtimes import providers

    calls = []

    def preload():
        calls.append(1)
        print("Failed to load libcublasLt.so.13")  # what ONNX Runtime prints where none is found

    monkeypatch.setattr(providers.ort, "preload_dlls", preload, raising=False)
    providers.load_device_libraries()  # torch is loaded in this process: its libraries rule
    assert calls == []
    monkeypatch.delitem(sys.modules, "torch")  # as in a worker
    providers.load_device_libraries()
    assert calls == [1]
    assert capsys.readouterr() == ("", "")  # never on the command's output or its stderr


def test_a_release_too_old_to_read_the_model_is_a_skip_in_a_worker_too(tmp_path):
    """ONNX Runtime 1.17 reads IR 9 at most and today's exports are IR 10: that release's rows
    are `skip` with the reason, as a missing kernel's are, and the other runtimes run; the
    reason crosses a worker's pipe as what it is."""
    from tconform.errors import RuntimeTooOld
    from tconform.runtimes.onnxruntime import OrtRuntime
    from tconform.runtimes.remote import _raised
    from tconform.runtimes.worker import _error

    loaded = (
        "[ONNXRuntimeError] : 1 : FAIL : Load model from m.onnx failed:"
        "Unsupported model IR version: 10, max supported IR version: 9"
    )
    error = OrtRuntime("cpu")._load_error(tmp_path / "m.onnx", RuntimeError(loaded))
    assert isinstance(error, RuntimeTooOld)
    expected = "reads IR version 9 at most; m.onnx is IR version 10 (a newer release reads it)"
    assert str(error).endswith(expected)
    again = _raised(json.loads(json.dumps(_error(error))))  # as the proxy receives it
    assert isinstance(again, RuntimeTooOld) and str(again) == str(error)


def test_a_runtime_rejecting_a_model_crosses_the_pipe_as_what_it_is():
    """RuntimeRejected in a worker is RuntimeRejected in tconform's process: an error row of
    that runtime (tconform.execution.open_subject), not a usage error nor an unknown type."""
    from tconform.errors import RuntimeRejected
    from tconform.runtimes.remote import _raised
    from tconform.runtimes.worker import _error

    error = RuntimeRejected("OpenVINO cannot convert or compile it: Input order must ...")
    again = _raised(json.loads(json.dumps(_error(error))))
    assert type(again) is RuntimeRejected and str(again) == str(error)


@pytest.mark.parametrize(
    "answer",
    [
        "junk\nmore",
        "[1, 2]",
        "{}",
        '{"python": "3.11", "modules": 1}',
        '{"python": "3.11", "modules": {"onnxruntime": "x"}}',  # versions not per distribution
        '{"python": 3.11, "modules": {}}',
        '{"python": "3.11", "modules": {"onnx": {"onnx": 1}}}',
    ],
)
def test_an_interpreter_that_answers_junk_is_one_line(tmp_path, answer):
    from tconform.errors import UsageError
    from tconform.runtimes.environments import probe

    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{answer}\nEOF\n")
    fake.chmod(0o755)
    spec = parse_spec(f"onnxruntime@{fake}")
    with pytest.raises(UsageError, match="did not answer as a Python interpreter does") as raised:
        probe(spec, fake, ("onnxruntime",))
    assert "\n" not in str(raised.value) and "NAME@PYTHON takes an interpreter" in str(raised.value)


def test_an_interpreter_too_old_for_the_worker_says_which_it_is(tmp_path):
    """A Python older than the worker needs answers the probe all the same (it is written for
    any Python), and the line names its version and the oldest that works."""
    from tconform.errors import UsageError
    from tconform.runtimes.environments import probe

    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho \'{"python": "3.7.16", "modules": {}}\'\n')
    fake.chmod(0o755)
    spec = parse_spec(f"onnxruntime==1.14.0@{fake}")
    with pytest.raises(
        UsageError, match=r"is Python 3\.7\.16; a runtime's worker needs Python 3\.10"
    ):
        probe(spec, fake, ())


def test_a_distribution_without_top_level_txt_is_found_by_its_files(tmp_path):
    """numpy's and onnx's wheels ship no top_level.txt: their modules are found by the top
    folders of their file lists (Python 3.10's packages_distributions did not)."""
    from tconform.runtimes.environments import probe

    python = interpreter(tmp_path / "plain")
    site = Path(sysconfig.get_paths()["purelib"])
    assert not list(site.glob("numpy-*.dist-info/top_level.txt"))  # what the test is about
    version, found = probe(parse_spec(f"onnxruntime@{python}"), python, ("numpy", "onnx"))
    assert version == platform.python_version()
    assert found["numpy"] == {"numpy": np.__version__}
    assert found["onnx"] == {"onnx": onnx.__version__}


def test_doc_records_a_workers_release_in_every_report(cli, workspace, tmp_path):
    """The exact versions a runtime in a worker ran with: in the JSON's settings (as verify's),
    the JUnit properties, the markdown and the terminal, where tconform's own environment
    names other versions."""
    python = interpreter(tmp_path / "plain")
    reports = {kind: tmp_path / f"doc.{kind}" for kind in ("json", "junit", "markdown")}
    code, out, err = cli(
        "doc", "--artifacts", str(workspace["artifacts"]), "--runtime", f"onnxruntime@{python}",
        *(f"--{kind}={path}" for kind, path in reports.items()),
    )  # fmt: skip
    assert code == 0, out + err
    (settings,) = json.loads(reports["json"].read_text())["settings"]["runtimes"].values()
    import onnxruntime

    packages = settings["worker"]["packages"]  # by distribution: onnxruntime or -gpu
    (distribution,) = (d for d in packages if d.startswith("onnxruntime"))
    assert packages[distribution] == onnxruntime.__version__
    assert settings["worker"]["python"] == str(python)
    line = f"onnxruntime@{python}: {distribution} {onnxruntime.__version__}"
    assert line in reports["junit"].read_text() and line in reports["markdown"].read_text()
    assert f"in a worker: {line}" in out


def test_the_current_folder_is_never_imported_by_an_interpreter_or_worker(tmp_path, monkeypatch):
    """`python -c` puts the current folder first on the import path: a json.py or struct.py of
    the user's there would end the interpreter's probe and the worker (and leave a __pycache__
    beside them). Neither reads that folder."""
    from tconform.runtimes.environments import probe

    python = interpreter(tmp_path / "plain")
    folder = tmp_path / "user"
    folder.mkdir()
    for name in ("json", "struct"):
        (folder / f"{name}.py").write_text("raise SystemExit('the user folder was imported')\n")
    monkeypatch.chdir(folder)
    version, _ = probe(parse_spec(f"onnxruntime@{python}"), python, ("numpy",))
    assert version == platform.python_version()
    runtime = make_runtime(f"onnxruntime@{python}", "cpu", threads=1)
    session = runtime.open(add_model(tmp_path / "add.onnx"))
    try:
        x = np.arange(3, dtype=np.float32)
        np.testing.assert_array_equal(session.run({"x": x})["y"], x + x)
    finally:
        session.close()
        stop_workers()
    assert sorted(p.name for p in folder.iterdir()) == ["json.py", "struct.py"]
