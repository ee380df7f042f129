"""Bad input to `tconform check`: one line on stderr naming the file or option, exit 2, never a
traceback; an export failure names the log that holds the exporter's full output."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.integration

# A user's package in the current folder, with one factory per way of going wrong.
FACTORIES = '''
import torch
from torch import nn

class Branchy(nn.Module):
    """Data-dependent control flow: torch.export cannot trace it."""
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x

def good():
    return nn.Linear(4, 3), torch.randn(2, 4)

def module_only():
    return nn.Linear(4, 3)

def wrong_shape():
    return nn.Linear(4, 3), torch.randn(2, 5)

def not_a_module():
    return "a string"

def string_and_inputs():
    return "not a module", torch.randn(2, 4)

def unexportable():
    return Branchy(), torch.randn(3)

class Untraceable(nn.Module):
    """Refuses every exporter, each with its own message."""
    def forward(self, x):
        if torch.compiler.is_exporting():
            raise RuntimeError("no torch.export here")
        if torch.jit.is_tracing():
            raise RuntimeError("no TorchScript here")
        return x * 2

def untraceable():
    return Untraceable(), torch.randn(3)

class DynamicCache:
    """What a transformers model with use_cache=True returns beside its logits."""

class WithCache(nn.Module):
    def forward(self, x):
        return {"logits": x * 2, "cache": DynamicCache()}

def with_cache():
    return WithCache(), torch.randn(2, 3)

def chatty_forking():
    """Prints, and forks a process that outlives it by far."""
    import os, time
    print("a line of the factory's own")
    if os.fork() == 0:
        time.sleep(120)
        os._exit(0)
    return nn.Linear(4, 3), torch.randn(2, 4)

def raises_ctrl_c():
    raise KeyboardInterrupt  # no Ctrl-C: the check's process ignores SIGINT

def says_much():
    raise RuntimeError("x" * 100_000)

def says_many_lines():
    raise ValueError("line\\n" * 50)

class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("its own __str__ fails")

def unprintable():
    raise Unprintable()

def on_meta():
    return nn.Linear(4, 3, device="meta"), torch.randn(2, 4)

def input_on_meta():
    return nn.Linear(4, 3), torch.randn(2, 4, device="meta")

not_callable = 7
'''


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    (tmp_path / "user_models_for_check.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)
    return "user_models_for_check"


def _one_line_exit_2(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2, out + err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in out + err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize(
    ("factory", "needles"),
    [
        ("missing", ["has no attribute 'missing'"]),
        ("not_callable", ["int is not callable"]),
        ("not_a_module", ["returned str, not a torch.nn.Module"]),
        ("string_and_inputs", ["returned a 2-tuple whose first item is a str, not a torch"]),
        ("module_only", ["returned only a module; pass --inputs"]),
        ("wrong_shape", ["the module rejects its inputs: RuntimeError: mat1 and mat2 shapes"]),
        ("with_cache", ["output cache is a DynamicCache", "use_cache=False"]),
        ("raises_ctrl_c", [":raises_ctrl_c: the factory: raised KeyboardInterrupt itself"]),
        ("says_much", ["the factory: RuntimeError: xxx", "... (99000 characters more)"]),
        ("says_many_lines", ["the factory: ValueError: line (49 lines more)"]),
        ("unprintable", ["the factory: Unprintable (its message raised RuntimeError)"]),
        ("on_meta", ["2 parameter(s) and buffer(s)", "meta device", "(weight, bias)"]),
        ("input_on_meta", ["input 0 is on the meta device: a shape without values"]),
    ],
)
def test_bad_factories(cli, user_package, factory, needles):
    code, out, err = cli("check", f"{user_package}:{factory}", "-q")
    _one_line_exit_2(code, out, err, *needles)
    assert len(err) < 1200  # a line, not a page


def test_a_factory_that_does_not_import(cli, user_package):
    code, out, err = cli("check", "no_such_user_package.models:make", "-q")
    _one_line_exit_2(code, out, err, "cannot import 'no_such_user_package.models'")


def test_inputs_file_missing_or_not_npz(cli, user_package, tmp_path):
    target = f"{user_package}:module_only"
    missing = tmp_path / "missing.npz"
    _one_line_exit_2(*cli("check", target, "--inputs", str(missing), "-q"), str(missing))
    text = tmp_path / "inputs.npz"
    text.write_text("0.5, 0.25")
    _one_line_exit_2(*cli("check", target, "--inputs", str(text), "-q"), str(text), "not a .npz")


def test_inputs_file_the_module_rejects(cli, user_package, tmp_path):
    path = tmp_path / "inputs.npz"
    np.savez(path, input=np.zeros((2, 9), np.float32))
    code, out, err = cli("check", f"{user_package}:module_only", "--inputs", str(path), "-q")
    _one_line_exit_2(code, out, err, "the module rejects its inputs")


def test_a_module_that_cannot_be_exported_names_the_log(cli, user_package, tmp_path):
    out_dir = tmp_path / "export"
    code, out, err = cli(
        "check", f"{user_package}:unexportable", "--exporter", "dynamo", "--out", str(out_dir),
        "-q",
    )  # fmt: skip
    log = out_dir / "export.log"
    _one_line_exit_2(code, out, err, "export with dynamo failed", str(log))
    assert "data-dependent" in err  # the exporter's own first error line
    assert "--exporter torchscript" in err  # and the way on
    assert "Traceback" in log.read_text() and not (out_dir / "model.onnx").exists()
    # a folder of the user's files (the factory's own here) is not check's to write into
    _one_line_exit_2(
        *cli("check", f"{user_package}:good", "--out", str(tmp_path), "-q"),
        "which tconform check did not write; --out (bench: --artifacts) needs a new or empty",
    )


def test_when_every_exporter_fails_each_ones_reason_is_named(cli, user_package, tmp_path):
    code, out, err = cli(
        "check", f"{user_package}:untraceable", "--out", str(tmp_path / "export"), "-q"
    )
    _one_line_exit_2(code, out, err, "export with torchscript failed", "no TorchScript here")
    assert "dynamo failed" in err and "no torch.export here" in err


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--dynamic", "tokens=0"), ["--dynamic 'tokens=0'", "no input 'tokens'", "input"]),
        (("--dynamic", "input=5"), ["axis 5 out of range"]),
        (("--tolerance", "logits=1e-4,1e-4"), ["no output 'logits'"]),
        (("--tolerance", "output=1e-4"), ["OUTPUT=ATOL,RTOL"]),
        (("--ep", "tpu"), ["unknown execution provider 'tpu'"]),
        (  # torch runs the module where it is: nothing would run on CUDA, and pass
            ("--runtime", "torch", "--ep", "cpu,cuda"),
            ["--ep cuda: no runtime asked for runs there", "the module is on cpu"],
        ),
        (("--opset", "12"), ["'--opset': unknown value '12'"]),
        (("--model", "no_such_model.onnx"), ["no_such_model.onnx: no such file"]),
    ],
)
def test_bad_options(cli, user_package, args, needles):
    code, out, err = cli("check", f"{user_package}:good", *args, "-q")
    _one_line_exit_2(code, out, err, *needles)


def test_a_model_file_that_is_not_onnx(cli, user_package, tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"not a model")
    code, out, err = cli("check", f"{user_package}:good", "--model", str(path), "-q")
    _one_line_exit_2(code, out, err, str(path))
    assert path.read_bytes() == b"not a model"


@pytest.mark.parametrize(
    ("outputs", "refusal"),
    [
        (["output"], None),  # as many outputs: judged, and failed (an Identity is no Linear)
        (["output_0", "output_1", "output_2"], "the model returns 3 outputs"),
        (["output", "output"], "the model lists output output twice"),
    ],
)
def test_a_model_file_with_other_outputs_than_the_module_is_refused_naming_it(
    cli, user_package, tmp_path, outputs, refusal
):
    """`good` returns one output; a file returning three (whose first two are named as the
    module's flattened outputs would be) was judged on the names it shared and ended with a
    KeyError at the batch checks, or said "1 are expected" without naming the file. One
    listing its output twice was refused by the runtime layer without naming the file."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], [name]) for name in dict.fromkeys(outputs)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 4]) for name in outputs],
    )
    path = tmp_path / "other.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, path)
    code, out, err = cli("check", f"{user_package}:good", "--model", str(path), "-q")
    if refusal is None:
        assert code == 1, err
    else:
        _one_line_exit_2(code, out, err, f"{path}: {refusal}")


def test_check_replaces_only_its_own_export(cli, user_package, tmp_path):
    """--out: tconform check's own files are replaced on the next run; a model.onnx it did not
    write (or one changed since) is never touched, nor is a golden or artifacts folder."""
    target = f"{user_package}:good"
    own = tmp_path / "own"
    # one input set each: what is replaced is the question, not the shapes
    assert cli("check", target, "--out", str(own), "--no-shapes", "-q")[0] == 0
    assert cli("check", target, "--out", str(own), "--no-shapes", "-q")[0] == 0
    (own / "model.onnx").write_bytes((own / "model.onnx").read_bytes() + b"\0")
    changed = (own / "model.onnx").read_bytes()
    _one_line_exit_2(*cli("check", target, "--out", str(own), "-q"), "changed since", "--model")
    assert (own / "model.onnx").read_bytes() == changed

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "model.onnx").write_bytes(b"somebody's model")
    _one_line_exit_2(*cli("check", target, "--out", str(foreign), "-q"), "not written by")
    assert (foreign / "model.onnx").read_bytes() == b"somebody's model"

    golden = tmp_path / "golden"
    golden.mkdir()
    (golden / "manifest.json").write_text('{"kind": "tconform-golden"}')
    _one_line_exit_2(*cli("check", target, "--out", str(golden), "-q"), "a folder of its own")
    # Without -q: one line all the same, since it is refused before anything runs.
    _one_line_exit_2(*cli("check", target, "--out", str(golden / "sub")), "lies in")
    assert sorted(p.name for p in golden.iterdir()) == ["manifest.json"]

    # Its reports never land in its export folder, on the files the next run relies on.
    for name in ("check.json", "export.log"):
        _one_line_exit_2(
            *cli("check", target, "--out", str(own), "--markdown", str(own / name), "-q"),
            "reports go elsewhere",  # a check export folder, its own or not
        )


def test_a_matrix_cell_holding_a_users_file_is_refused_before_the_factory_runs(
    cli, user_package, tmp_path
):
    own = tmp_path / "own"
    args = ("--out", str(own), "--matrix", "--dtype", "float32", "--no-shapes", "-q")
    assert cli("check", f"{user_package}:good", *args)[0] == 0
    cell = next((own / "matrix").iterdir())
    (cell / "notes.txt").write_text("mine")
    # a factory that does not exist: refused before its import would say so
    code, out, err = cli("check", f"{user_package}:no_such_factory", *args)
    _one_line_exit_2(code, out, err, f"{cell}: holds 'notes.txt'", "did not write")
    assert (cell / "notes.txt").read_text() == "mine"


def test_a_second_check_into_the_same_folder_waits_for_the_first(cli, user_package, tmp_path):
    """The export folder is locked while a check exports into it and runs what it exported:
    a second run (here the lock held by the test) waits, and gives up with exit 2 after
    TCONFORM_LOCK_TIMEOUT, rather than check the model the other run is writing."""
    from tconform.folders import folder_lock

    out = tmp_path / "shared"
    with pytest.MonkeyPatch.context() as env, folder_lock(out):
        env.setenv("TCONFORM_LOCK_TIMEOUT", "1")
        code, out_text, err = cli("check", f"{user_package}:good", "--out", str(out), "-q")
    assert code == 2 and "another tconform run holds" in err, out_text + err
    assert "Traceback" not in err and not out.exists()  # nothing exported


def test_a_check_started_with_stdout_closed_runs_as_if_it_went_nowhere(user_package, tmp_path):
    """`>&-`: the check's process inherited no stdout, and its first flush ended it before the
    check ("exited with status 1 while starting"); it runs, and its report is written."""
    import subprocess
    import sys

    report = tmp_path / "closed.json"
    done = subprocess.run(
        f"'{sys.executable}' -m tconform check {user_package}:good --no-shapes --no-torch "
        f"--out export --json '{report}' >&-",
        shell=True, capture_output=False, stderr=subprocess.PIPE, text=True, timeout=100,
    )  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert json.loads(report.read_text())["exit_code"] == 0


def test_the_user_code_s_prints_and_forks_stay_out_of_the_command_s_output(user_package):
    """What the factory prints goes to stderr (stdout holds the results a script reads), and a
    process it forks ends with the command, not holding the command's output open after it."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "tconform", "check", f"{user_package}:chatty_forking",
         "--no-shapes", "--no-torch", "--out", "export"],
        capture_output=True, text=True, timeout=100,  # the forked process sleeps 120 s
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a line of the factory's own" in done.stderr
    assert "factory's own" not in done.stdout and "1 results: 1 pass" in done.stdout
