"""Hardening (issue 9): one exit rule in every command, reports always written, validation at
the edge, signals, and collisions between concurrent runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import onnx
import psutil
import pytest

from tconform.files import atomic_write_json
from tconform.runtimes.providers import unavailable_reason

pytestmark = pytest.mark.integration

NO_CUDA = pytest.mark.skipif(
    unavailable_reason("cuda") is None, reason="needs a machine where CUDA cannot run"
)
ENV_KEYS = {
    "started_utc", "os", "cpu", "instruction_sets", "cores_physical", "cores_logical", "python",
    "torch", "onnx", "onnxscript", "onnxruntime", "numpy", "providers_available",
    "providers_running", "tconform", "tconform_commit",
}  # fmt: skip


def one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


def verify(cli, ws, *extra):
    return cli("verify", "--golden", str(ws["golden"]), "--artifacts", str(ws["artifacts"]), *extra)


# --- one exit rule ------------------------------------------------------------------------------


@NO_CUDA
def test_allow_missing_ep_turns_every_unavailable_row_into_skip(cli, workspace, tmp_path):
    report = tmp_path / "r.json"
    code, _, _ = verify(
        cli, workspace, "--ep", "cpu,cuda", "--allow-missing-ep", "--case", "norm", "-q",
        "--json", str(report), "--junit", str(tmp_path / "r.xml"),
    )  # fmt: skip
    assert code == 0
    rows = json.loads(report.read_text())["results"]
    cuda = [r for r in rows if r["ep"] == "cuda"]
    assert cuda and {r["status"] for r in cuda} == {"skip"}  # doc rows included
    assert any(r["case"].startswith("doc:") for r in cuda)
    from tconform.units import documents_unit  # every doc row names the one documents unit

    assert {r["unit"] for r in rows if r["case"].startswith("doc:")} == {documents_unit().id}
    skipped = ET.parse(tmp_path / "r.xml").getroot().iter("skipped")
    assert any("provider unavailable" in s.get("message") for s in skipped)


@NO_CUDA
def test_doc_and_bench_apply_the_same_rule(cli, workspace, tmp_path):
    artifacts = ("--artifacts", str(workspace["artifacts"]))
    code, _, err = cli("doc", *artifacts, "--ep", "cuda", "-q")
    assert code == 3 and "could not run: cuda" in err and "Traceback" not in err
    # Every model row a skip: the oracle's rows check the documents, not a model, as in verify.
    code, _, err = cli("doc", *artifacts, "--ep", "cuda", "--allow-missing-ep", "-q")
    assert code == 3 and "nothing checked" in err
    code, _, _ = cli("doc", *artifacts, "--ep", "cpu,cuda", "--allow-missing-ep", "-q")
    assert code == 0
    bench = ("bench", "--preset", "tiny", "--case", "norm", "--shape", "1x2", "--runs", "1")
    bench_artifacts = ("--artifacts", str(tmp_path / "b"), "--engine", "onnxruntime")
    code, _, err = cli(*bench, *bench_artifacts, "--ep", "cuda")
    assert code == 3 and "could not run" in err
    code, _, err = cli(*bench, *bench_artifacts, "--ep", "cuda", "--allow-missing-ep")
    assert code == 3 and "nothing was timed" in err  # skipped is reported, never a pass


@NO_CUDA
def test_an_unavailable_provider_is_a_junit_skip_not_a_failure(cli, workspace, tmp_path):
    code, _, _ = verify(
        cli, workspace, "--ep", "cuda", "--case", "norm", "--no-doc", "--no-torch", "-q",
        "--junit", str(tmp_path / "r.xml"),
    )  # fmt: skip
    assert code == 3
    root = ET.parse(tmp_path / "r.xml").getroot()
    assert not list(root.iter("failure")) and list(root.iter("skipped"))


# --- reports are always written -----------------------------------------------------------------


def test_a_corrupt_golden_is_found_before_the_first_case_and_writes_every_report(
    cli, workspace, tmp_path
):
    """The last case's last file, corrupted: found before anything is exported or run (every
    golden file's sha256 is checked first), one line naming it, every report written."""
    late = workspace["golden"] / "transformer" / "test_data_set_2" / "output_1.pb"
    data = bytearray(late.read_bytes())
    data[-3] ^= 0xFF
    late.write_bytes(bytes(data))
    paths = {f: tmp_path / f"r.{f}" for f in ("json", "xml", "md")}
    artifacts = tmp_path / "fresh-artifacts"
    code, _, err = cli(
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(artifacts),
        "--no-doc", "-q", "--json", str(paths["json"]),
        "--junit", str(paths["xml"]), "--markdown", str(paths["md"]),
    )  # fmt: skip
    assert code == 2 and str(late) in err and "sha256 differs" in err and one_line(err)
    report = json.loads(paths["json"].read_text())
    assert report["exit_code"] == 2 and str(late) in report["error"]["message"]
    assert report["results"] == []  # not one case ran
    assert not artifacts.exists()  # nothing was exported
    errors = list(ET.parse(paths["xml"]).getroot().iter("error"))
    assert any(str(late) in e.get("message") for e in errors)
    assert "stopped early" in paths["md"].read_text()


def test_a_bad_option_still_writes_every_report_with_its_error(cli, tmp_path):
    """Click refuses `--exporter nosuch` before verify starts; CI still finds its reports."""
    paths = {f: tmp_path / f"r.{f}" for f in ("json", "xml", "md")}
    code, _, err = cli(
        "verify", "--exporter", "nosuch", "--json", str(paths["json"]),
        "--junit", str(paths["xml"]), "--markdown", str(paths["md"]),
    )  # fmt: skip
    assert code == 2 and "nosuch" in err and one_line(err)
    report = json.loads(paths["json"].read_text())
    assert (report["exit_code"], report["results"]) == (2, [])
    assert "nosuch" in report["error"]["message"]
    errors = list(ET.parse(paths["xml"]).getroot().iter("error"))
    assert any("nosuch" in e.get("message") for e in errors)
    assert "stopped early (exit 2)" in paths["md"].read_text()
    # A later bad option replaces what tconform wrote there.
    assert cli("verify", "--opset", "x", "--json", str(paths["json"]))[0] == 2
    assert "--opset" in json.loads(paths["json"].read_text())["error"]["message"]


def test_a_report_format_given_twice_is_refused_and_neither_file_written(cli, tmp_path):
    """`--json A ... --json B` (a CI line extended by appending) would lose A without a word;
    it is a usage error, the other formats still carry it, and neither JSON file is written."""
    a, b, md = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "r.md"
    for check in ("verify", "check"):
        args = (check, "--json", str(a), "--markdown", str(md), f"--json={b}")
        code, _, err = cli(*args, *(() if check == "verify" else ("examples.tiny_gpt:make",)))
        assert code == 2 and one_line(err) and "--json given 2 times" in err, err
        assert not a.exists() and not b.exists()
        assert "--json given 2 times" in md.read_text()
        md.unlink()


def test_a_bad_options_report_never_replaces_what_tconform_did_not_write(cli, tmp_path):
    users = tmp_path / "notes.json"  # a user's own JSON
    users.write_text('{"mine": true}\n')
    assert cli("verify", "--exporter", "nosuch", "--json", str(users))[0] == 2
    # A model under test, even one that reads like a report, is never a report's target.
    assert cli("verify", "--exporter", "nosuch", "--json", str(tmp_path / "r.json"))[0] == 2
    model = tmp_path / "model.json"
    model.write_bytes((tmp_path / "r.json").read_bytes())
    assert (
        cli("verify", "--model", f"norm={model}", "--exporter", "nosuch", "--json", str(model))[0]
        == 2
    )
    # Nor inside a golden folder; but a new file in a folder of nobody's, as the run would.
    folder = tmp_path / "given"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"kind": "tconform-golden"}')
    for where, written in ((folder, False), (tmp_path / "plain", True)):
        where.mkdir(exist_ok=True)
        args = ("--golden", str(where), "--preset", "nosuch", "--json", str(where / "r.json"))
        assert cli("verify", *args)[0] == 2
        assert (where / "r.json").exists() == written
    assert users.read_text() == '{"mine": true}\n'
    assert model.read_bytes() == (tmp_path / "r.json").read_bytes()
    # A bench report is written in bench's own format, and never over a verify report.
    assert cli("bench", "--exporter", "nosuch", "--json", str(tmp_path / "b.json"))[0] == 2
    bench = json.loads((tmp_path / "b.json").read_text())
    assert (bench["tool"], bench["exit_code"]) == ("tconform bench", 2)
    assert "--exporter" in bench["error"]["message"]
    verify_report = (tmp_path / "r.json").read_bytes()
    assert cli("bench", "--exporter", "nosuch", "--json", str(tmp_path / "r.json"))[0] == 2
    assert (tmp_path / "r.json").read_bytes() == verify_report


def test_report_paths_are_checked_before_anything_runs(cli, workspace, tmp_path):
    fresh = tmp_path / "fresh-artifacts"
    for option, value, message in (
        ("--json", tmp_path / "missing" / "r.json", "does not exist"),
        ("--junit", tmp_path, "is a folder"),
        ("--plot", tmp_path / "x.jpg", "must end in .png"),
    ):
        code, _, err = cli(
            "verify", "--golden", str(workspace["golden"]), "--artifacts", str(fresh),
            option, str(value),
        )  # fmt: skip
        assert code == 2 and message in err and one_line(err)
        assert not fresh.exists()  # nothing was exported


def test_a_full_disk_names_the_file(tmp_path, monkeypatch):
    from tconform import files
    from tconform.errors import UsageError

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full)
    target = tmp_path / "report.json"
    with pytest.raises(UsageError, match=r"report\.json: cannot write it") as raised:
        files.atomic_write_json(target, {"a": 1})
    assert "No space left on device" in str(raised.value)
    assert not list(tmp_path.iterdir())  # no temporary file left behind


def test_every_report_carries_the_environment_block(cli, workspace, tmp_path):
    code, _, _ = verify(
        cli, workspace, "--case", "norm", "--no-doc", "-q", "--json", str(tmp_path / "v.json"),
        "--junit", str(tmp_path / "v.xml"), "--threads", "1", "--runtime", "onnxruntime",
    )  # fmt: skip
    assert code == 0
    env = json.loads((tmp_path / "v.json").read_text())["environment"]
    assert set(env) >= ENV_KEYS and "cpu" in env["providers_running"]
    assert env["threads"] == 1  # as given (outsider: check's and verify's said none)
    properties = {p.get("name") for p in ET.parse(tmp_path / "v.xml").getroot()[0]}
    assert properties >= ENV_KEYS
    code, _, _ = cli(
        "doc", "--artifacts", str(workspace["artifacts"]), "-q", "--json", str(tmp_path / "d.json")
    )
    assert code == 0
    assert set(json.loads((tmp_path / "d.json").read_text())["environment"]) >= ENV_KEYS


# --- validation at the edge ---------------------------------------------------------------------


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    atomic_write_json(path, data)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["cases"].__setitem__("norm", 5), "case 'norm' must be an object"),
        (lambda m: m["cases"]["norm"].pop("sets"), "case 'norm' 'sets' must be an object"),
        (lambda m: m["cases"]["norm"].pop("sha256"), "'sha256' must be an object"),
        (lambda m: m["config"].__setitem__("d_model", 0), "d_model = 0"),
        (lambda m: m.__setitem__("seed", 1.5), "'seed' must be an integer"),
        (lambda m: m["config"].__setitem__("norm", "rms"), "norm = 'rms'"),
        (
            lambda m: m["cases"]["norm"]["sets"].__setitem__("../x", {}),
            "set name is not valid: '../x'",
        ),
        (
            lambda m: m["cases"]["norm"]["sha256"].__setitem__("/abs/output_0.pb", "0" * 64),
            "file name is not valid",
        ),
        # what the manifest says of the case is the case's: a name, a class, each tensor's shape
        (lambda m: m["cases"]["norm"].__setitem__("inputs", ["../x"]), "inputs ['../x'] is not"),
        (lambda m: m["cases"]["norm"].__setitem__("outputs", []), "outputs [] is not the case's"),
        (
            lambda m: m["cases"]["norm"].__setitem__("tolerance_class", "../../x"),
            "tolerance_class '../../x' is not the case's 'component'",
        ),
        (
            lambda m: m["cases"]["norm"]["sets"].__setitem__("test_data_set_0", {}),
            "set 'test_data_set_0' has shapes for [], not for the case's tensors",
        ),
    ],
)
def test_malformed_golden_manifests_are_one_line_exit_2(cli, workspace, edit, message):
    _edit_json(workspace["golden"] / "manifest.json", edit)
    code, _, err = verify(cli, workspace, "--case", "norm", "--no-doc", "-q")
    assert code == 2 and message in err and one_line(err), err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.__setitem__("dtype", []), "'dtype' is not one of"),
        (lambda m: m["models"].__setitem__("norm", 5), "model 'norm' must be an object"),
        (lambda m: m["models"]["norm"].__setitem__("path", "../../etc/passwd"), "'path' must be"),
        (lambda m: m.__setitem__("seed", "zero"), "'seed' must be an integer"),
        (lambda m: m.__setitem__("seed", -1), "'seed'"),
    ],
)
def test_malformed_artifacts_manifests_are_one_line_exit_2(cli, workspace, edit, message):
    _edit_json(workspace["artifacts"] / "manifest.json", edit)
    code, _, err = verify(cli, workspace, "--case", "norm", "--no-doc", "-q")
    assert code == 2 and message in err and one_line(err), err


def test_golden_check_with_a_changed_shape_is_drift_not_a_crash(cli, workspace):
    import numpy as np
    from onnx import numpy_helper

    from tconform.files import sha256_bytes

    rel = "test_data_set_1/output_0.pb"
    path = workspace["golden"] / "norm" / rel
    data = numpy_helper.from_array(np.zeros((1, 2, 16), np.float32), "out").SerializeToString()
    path.write_bytes(data)

    def reshape(m):
        m["cases"]["norm"]["sha256"][rel] = sha256_bytes(data)
        m["cases"]["norm"]["sets"]["test_data_set_1"]["out"] = [1, 2, 16]

    _edit_json(workspace["golden"] / "manifest.json", reshape)
    code, out, err = cli("golden", "--check", "--out", str(workspace["golden"]))
    assert code in (1, 2) and "Traceback" not in out + err


def test_a_golden_file_larger_than_its_shape_is_refused_unread(cli, workspace):
    path = workspace["golden"] / "norm" / "test_data_set_0" / "output_0.pb"
    with open(path, "r+b") as f:  # a sparse 16 GB file: reading it would take the memory
        f.truncate(16 * 2**30)
    code, _, err = verify(cli, workspace, "--case", "norm", "--no-doc", "-q")
    assert code == 2 and "more than its shape" in err and one_line(err)


def test_a_fifo_or_device_in_place_of_a_file_is_refused(cli, workspace):
    golden_file = workspace["golden"] / "norm" / "test_data_set_0" / "input_0.pb"
    golden_file.unlink()
    os.mkfifo(golden_file)
    code, _, err = verify(cli, workspace, "--case", "norm", "--no-doc", "-q")
    assert code == 2 and "not a regular file" in err
    model = workspace["artifacts"] / "attention" / "model.onnx"
    model.unlink()
    model.symlink_to("/dev/zero")
    code, _, err = verify(cli, workspace, "--model", f"attention={model}", "--no-doc", "-q")
    assert code == 2 and "not a regular file" in err and one_line(err)


def test_a_golden_tensor_with_external_data_is_refused(cli, workspace):
    import onnx

    from tconform.files import sha256_bytes

    rel = "test_data_set_0/input_0.pb"
    path = workspace["golden"] / "norm" / rel
    tensor = onnx.load_tensor(str(path))
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "/etc/hostname"
    data = tensor.SerializeToString()
    path.write_bytes(data)
    _edit_json(
        workspace["golden"] / "manifest.json",
        lambda m: m["cases"]["norm"]["sha256"].__setitem__(rel, sha256_bytes(data)),
    )
    code, _, err = verify(cli, workspace, "--case", "norm", "--no-doc", "-q")
    assert code == 2 and "external file" in err


@pytest.mark.parametrize(
    "args",
    [
        ("golden", "--seed", "-1"),
        ("export", "--seed", "-1"),
        ("export", "--opset", "99"),
        ("export", "--jobs", "0"),
        ("verify", "--device-id", "-2"),
        ("golden", "--preset", "nope"),
        # int() reads these too, and the report would record what nobody typed (outsider's)
        ("verify", "--threads=\uff11"),
        ("golden", "--seed", "1_000"),
        ("verify", "--threads", " 5"),  # the message says digits 0-9, as the variables' does
        ("verify", "--tf32"),  # acts on CUDA alone, and the run's provider is the CPU
        ("verify", "--json", ""),  # pathlib reads '' as the current folder
        ("check", "m:f", "--out", " "),
    ],
)
def test_ranged_options_are_usage_errors(cli, args):
    code, _, err = cli(*args)
    assert code == 2 and one_line(err), err


# --- signals and collisions (real processes) ----------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def _tconform(*args: str, tmpdir: Path | None = None, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    if args[0] == "export":  # what these test is the pool and the folder, not the exporter,
        args = (*args, "--exporter", "torchscript")  # and this one starts in a third the time
    return subprocess.Popen(
        [sys.executable, "-m", "tconform", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        # Ctrl-C as a terminal delivers it: a test run started in the background by a
        # non-interactive shell (`pytest &`) has SIGINT ignored, which every child would inherit.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **popen,
    )


def _wait_for_workers(process: subprocess.Popen, timeout: float = 60) -> list[psutil.Process]:
    parent = psutil.Process(process.pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = parent.children(recursive=True)
        # The resource tracker and both export workers: the pool is up and its signal handling
        # settled (a Ctrl-C while it spawns can be lost, see tconform.export.pool).
        if len(children) >= 3:
            time.sleep(0.5)
            return parent.children(recursive=True)
        time.sleep(0.2)
    pytest.fail("the export pool never started")


def _wait_for_an_export_under_way(tmpdir: Path, timeout: float = 60) -> None:
    """Until a worker has made the temporary folder it exports into (tempfile's tmpXXXXXXXX)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.is_dir() for p in tmpdir.rglob("tmp*")):
            return
        time.sleep(0.05)
    pytest.fail("no export began")


def _all_gone(processes: list[psutil.Process], timeout: float = 15) -> bool:
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    return not alive


@pytest.mark.parametrize(
    ("sig", "code", "line"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_a_signal_during_export_ends_promptly_with_one_line(tmp_path, sig, code, line):
    (tmp_path / "tmp").mkdir()
    process = _tconform(
        "export", "--out", str(tmp_path / "a"), "--jobs", "2", tmpdir=tmp_path / "tmp"
    )
    workers = _wait_for_workers(process)
    _wait_for_an_export_under_way(tmp_path / "tmp")
    os.killpg(process.pid, sig) if sig == signal.SIGINT else process.send_signal(sig)
    _, err = process.communicate(timeout=60)
    assert process.returncode == code, err
    assert err.strip().splitlines()[-1] == f"tconform: {line}" and "Traceback" not in err
    assert "terminate called" not in err
    assert _all_gone(workers)
    _assert_every_model_is_recorded(tmp_path / "a")
    # what was staged is gone, and a folder the run made holds what it placed or is gone too
    assert not (tmp_path / "a" / ".tconform-staging").exists()
    assert not (tmp_path / "a").exists() or any((tmp_path / "a").iterdir())
    # nor is a temporary file of the workers', which were terminated mid-export: they left
    # empty folders (or half a model) in TMPDIR
    assert list((tmp_path / "tmp").iterdir()) == []


def _forever(path: Path) -> Path:
    """norm's interface (x -> out, [batch, src_seq, 16]) through a Loop with no trip count
    whose condition stays true: ONNX Runtime's run of it never returns."""
    from onnx import TensorProto, helper

    def value(name, elem, shape):
        return helper.make_tensor_value_info(name, elem, shape)

    body = helper.make_graph(
        [helper.make_node("Identity", ["go"], ["again"]),
         helper.make_node("Identity", ["v"], ["w"])],
        "body",
        [value("i", TensorProto.INT64, []), value("go", TensorProto.BOOL, []),
         value("v", TensorProto.FLOAT, None)],
        [value("again", TensorProto.BOOL, []), value("w", TensorProto.FLOAT, None)],
    )  # fmt: skip
    true = helper.make_tensor("t", TensorProto.BOOL, [], [True])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["true"], value=true),
         helper.make_node("Loop", ["", "true", "x"], ["out"], body=body)],
        "forever",
        [value("x", TensorProto.FLOAT, ["batch", "src_seq", 16])],
        [value("out", TensorProto.FLOAT, ["batch", "src_seq", 16])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, path)
    return path


@pytest.mark.parametrize(
    ("sig", "code", "line"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_a_signal_ends_a_run_that_never_returns_with_its_reports(tmp_path, sig, code, line):
    """A given model whose run never returns (ONNX Runtime's native code, which Python's signal
    handlers cannot interrupt): Ctrl-C or SIGTERM still ends verify promptly, its report
    written, the exit code the signal's, and the process leaves without aborting."""
    model = _forever(tmp_path / "forever.onnx")
    report = tmp_path / "r.json"
    process = _tconform(
        "verify", "--model", f"norm={model}", "--case", "norm", "--no-doc", "--no-torch",
        "--json", str(report),
    )  # fmt: skip
    for progress in process.stderr:  # the case's line comes as its run starts
        if progress.startswith("[1/1] norm"):
            break
    time.sleep(2)  # in ONNX Runtime's loop by now
    process.send_signal(sig)
    _, err = process.communicate(timeout=60)
    assert process.returncode == code, err
    assert err.strip().splitlines()[-1] == f"tconform: {line}" and "terminate called" not in err
    assert json.loads(report.read_text())["error"] == {"message": line, "exit_code": code}


def test_workers_end_when_the_parent_is_killed(tmp_path):
    process = _tconform("export", "--out", str(tmp_path / "a"), "--jobs", "2")
    workers = _wait_for_workers(process)
    process.kill()  # SIGKILL: no handler runs in the parent
    process.wait(timeout=30)
    assert _all_gone(workers, timeout=20)
    _assert_every_model_is_recorded(tmp_path / "a")
    # The next run cleans the staging folder and finishes the job.
    done = _tconform("export", "--out", str(tmp_path / "a"), "--case", "norm")
    done.communicate(timeout=300)
    assert done.returncode == 0
    assert not (tmp_path / "a" / ".tconform-staging").exists()


def _assert_every_model_is_recorded(folder: Path) -> None:
    """No model file outside the manifest: each one is recorded with its bytes' sha256."""
    from tconform.files import sha256_file

    models = list(folder.glob("*/model.onnx"))
    if not models:
        return
    manifest = json.loads((folder / "manifest.json").read_text())["models"]
    for model in models:
        entry = manifest[model.parent.name]
        assert sha256_file(model) in (entry["sha256"], entry.get("previous_sha256"))


def test_concurrent_exports_into_one_folder_keep_both_runs_entries(tmp_path):
    first = _tconform("export", "--out", str(tmp_path / "a"), "--case", "norm", "--jobs", "1")
    second = _tconform(
        "export", "--out", str(tmp_path / "a"), "--case", "feed_forward", "--jobs", "1"
    )
    for process in (first, second):
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert set(manifest["models"]) == {"norm", "feed_forward"}


def test_concurrent_golden_force_runs_serialise(tmp_path):
    out = tmp_path / "g"
    runs = [_tconform("golden", "--force", "--case", "norm", "--out", str(out)) for _ in range(3)]
    for process in runs:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    assert json.loads((out / "manifest.json").read_text())["cases"].keys() == {"norm"}
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".g.") and p.is_dir()]
    assert leftovers == []


def test_leftovers_of_a_killed_golden_write_are_cleaned_up(cli, tmp_path):
    """Staging and retired folders as a killed write leaves them go; folders of the user's
    that only look like them (another name, or holding anything but goldens) are kept."""
    import tempfile

    out = tmp_path / "g"
    staging = Path(tempfile.mkdtemp(prefix=".g.staging-", dir=tmp_path))
    (staging / "norm" / "test_data_set_0").mkdir(parents=True)
    (staging / "norm" / "test_data_set_0" / "input_0.pb").write_bytes(b"cut short")
    Path(tempfile.mkdtemp(prefix=".g.retired-", dir=tmp_path))  # killed before the rename
    kept = [tmp_path / ".g.unrelated", tmp_path / ".g.staging-abc123"]  # not mkdtemp's names
    kept.append(Path(tempfile.mkdtemp(prefix=".g.staging-", dir=tmp_path)))
    (kept[-1] / "notes.txt").write_text("the user's, in a folder named like a leftover\n")
    kept.append(Path(tempfile.mkdtemp(prefix=".g.retired-", dir=tmp_path)))
    (kept[-1] / "photos").mkdir()
    for folder in kept[:2]:
        folder.mkdir()
    code, _, _ = cli("golden", "--case", "norm", "--out", str(out))
    assert code == 0
    assert sorted(p for p in tmp_path.iterdir() if p.is_dir()) == sorted([*kept, out])
    assert (kept[2] / "notes.txt").is_file() and (kept[3] / "photos").is_dir()


# --- reports never land on what is verified -----------------------------------------------------


def _tree(*folders):
    return {p: p.read_bytes() for f in folders for p in sorted(f.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("option", "where", "says"),
    [
        ("--json", "golden/manifest.json", "a tconform golden, artifacts or check export folder"),
        (
            "--json",
            "golden/norm/report.json",
            "a tconform golden, artifacts or check export folder",
        ),
        (
            "--junit",
            "artifacts/manifest.json",
            "a tconform golden, artifacts or check export folder",
        ),
        (
            "--markdown",
            "artifacts/report.md",
            "a tconform golden, artifacts or check export folder",
        ),
        ("--json", "given.bin", "the model under test"),
        ("--json", "elsewhere/model.onnx", "a model or tensor file name"),
    ],
)
def test_a_report_path_over_verified_files_is_refused_before_the_run(
    cli, workspace, tmp_path, option, where, says
):
    given = tmp_path / "given.bin"  # a model under test need not be called .onnx
    given.write_bytes((workspace["artifacts"] / "norm" / "model.onnx").read_bytes())
    (tmp_path / "elsewhere").mkdir()
    before = _tree(workspace["golden"], workspace["artifacts"], tmp_path / "elsewhere")
    before[given] = given.read_bytes()
    root, _, rest = where.partition("/")
    target = workspace[root] / rest if root in workspace else tmp_path / where
    code, _, err = verify(cli, workspace, "--model", f"norm={given}", "--case", "norm",
                          "--no-doc", "-q", option, str(target))  # fmt: skip
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    after = _tree(workspace["golden"], workspace["artifacts"], tmp_path / "elsewhere")
    after[given] = given.read_bytes()
    assert after == before


def test_two_reports_on_one_file_are_refused(cli, workspace, tmp_path):
    same = tmp_path / "same.out"
    code, _, err = verify(cli, workspace, "--case", "norm", "--no-doc", "-q", "--json", str(same),
                          "--junit", str(same))  # fmt: skip
    assert code == 2 and "--json and --junit name the same file" in err and not same.exists()
    assert str(same) in err


@pytest.mark.parametrize(
    "inside",
    ["golden/norm/test_data_set_0/input_0.pb", "golden/norm", "golden/manifest.json",
     "artifacts/norm/model.onnx"],
)  # fmt: skip
def test_a_symlink_out_of_a_folder_is_refused(cli, workspace, tmp_path, inside):
    """Same bytes, but outside the folder: nothing outside the given folders is read."""
    root, _, rest = inside.partition("/")
    path = workspace[root] / rest
    outside = tmp_path / "outside" / path.name
    outside.parent.mkdir()
    path.rename(outside)
    path.symlink_to(outside)
    code, _, err = verify(cli, workspace, "--case", "norm", "--no-doc", "-q")
    assert code == 2 and "leads outside" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "args",
    [
        ("doc", "--artifacts", "{golden}", "-q"),
        ("export", "--case", "norm", "--out", "{golden}/sub"),
    ],
)
def test_models_never_go_into_or_under_a_golden_folder(cli, workspace, args):
    golden = workspace["golden"]
    before = _tree(golden)
    code, _, err = cli(*(a.format(golden=golden) for a in args))
    assert code == 2 and "is or lies in a golden folder" in err, err
    assert _tree(golden) == before and not (golden / "sub").exists()


def test_an_export_never_writes_through_a_case_folder_leading_out(cli, workspace, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    case_dir = workspace["artifacts"] / "norm"
    for f in case_dir.iterdir():
        f.unlink()
    case_dir.rmdir()
    case_dir.symlink_to(outside, target_is_directory=True)
    for args in (("export", "--case", "norm", "--out", str(workspace["artifacts"])),
                 ("verify", "--golden", str(workspace["golden"]), "--artifacts",
                  str(workspace["artifacts"]), "--case", "norm", "--no-doc", "-q")):  # fmt: skip
        code, _, err = cli(*args)
        assert code == 2 and "leads outside" in err, err
    assert not any(outside.iterdir())
