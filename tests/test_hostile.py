"""Hostile input, class by class (issue 20): each class is fixed once, where its promise lives,
and this corpus holds several examples of each, across the commands.

Every case asserts the same things: its exit code; exactly one line on stderr, `tconform:
error: ...` (or `tconform: interrupted` / `tconform: terminated`), saying what it names; no
traceback; the requested JSON report written and strict JSON (no bare NaN or Infinity) with its
`error` entry where the run stopped; and every file it did not write unchanged, byte for byte.

Cases run in this process (the `cli` fixture) where they can; those that end a process, or
whose stderr comes from a child process, run `python -m tconform` in a subprocess. The
generation class ends here with the decoding driver; a whole `verify --generation` of a
degenerate step model is in tests/generation/test_generation_cli.py, beside the generation
models it reuses.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import pytest

from tconform.errors import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    Terminated,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "hostile_user_models"
# A user's package: one factory per way of ending, or breaking, the process that runs it.
FACTORIES = """
import os, signal, sys
import torch
from torch import nn

if os.environ.get("HOSTILE_EXIT_AT_IMPORT"):
    sys.exit(0)

def good():
    return nn.Linear(4, 3), torch.randn(2, 4)

def module_only():
    return nn.Linear(4, 3)

def exits_0():
    sys.exit(0)

def moves_away():  # to the folder beside the user's: --out and --repro stay where they were
    os.chdir(os.path.join(os.getcwd(), "..", "reports"))
    return good()

def os_exit_0():
    os._exit(0)

class Complex(nn.Module):
    def forward(self, x):
        return torch.complex(x, x)

def axis_out_of_range():  # a factory's dynamic axes, checked as --dynamic's are
    return nn.Linear(4, 3), torch.randn(2, 4), {"input": {-7: "batch"}}

def complex_output():
    return Complex(), torch.randn(2, 4)

def closes_streams():  # the check's progress and results go through them
    os.close(1)
    os.close(2)
    return good()

def generator_exit():
    raise GeneratorExit

class NoElements(nn.Module):
    def forward(self, x):
        return x[:, :0] * 2

def no_elements():
    return NoElements(), torch.randn(2, 4)

def all_nan():  # NaN in, NaN out of any model: it agrees everywhere and proves nothing
    return nn.Linear(4, 3), torch.full((2, 4), float("nan"))

class Affine(nn.Module):
    def forward(self, x):
        return x * 2 + 1

def all_inf():  # inf in, inf out of x * 2 + 1 as of x * 1000: nothing finite to compare
    return Affine(), torch.full((2, 4), float("inf"))

async def async_factory():
    return nn.Linear(4, 3), torch.randn(2, 4)

def segfault():
    import ctypes
    ctypes.string_at(0)

def killed():  # what the kernel's out-of-memory killer does
    os.kill(os.getpid(), signal.SIGKILL)

def sleeps():
    import time
    time.sleep(120)

def escapes_and_sleeps():  # starts a process in a session of its own, out of the check's group
    import subprocess, time
    escapee = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                               start_new_session=True)
    with open("escapee.pid", "w") as f:
        f.write(str(escapee.pid))
    time.sleep(120)

class ExitsInForward(nn.Module):
    def forward(self, x):
        os._exit(0)

def forward_os_exit():
    return ExitsInForward(), torch.randn(2, 4)

class ExitsWhenExported(nn.Module):
    def forward(self, x):
        if torch.compiler.is_exporting():
            sys.exit(0)
        return x * 2

def export_sys_exit():
    return ExitsWhenExported(), torch.randn(2, 4)

def two_layers():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), torch.randn(2, 4)

def spawns():  # as a DataLoader's workers, or a library's helper process, would
    import multiprocessing
    process = multiprocessing.get_context("spawn").Process(target=os.getpid)
    process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"a process it spawned exited with status {process.exitcode}")
    return nn.Linear(4, 3), torch.randn(2, 4)
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(root: Path) -> dict[Path, str]:
    """The sha256 of every regular file under `root` (never a FIFO or a device: not opened)."""
    return {
        p: sha256(p)
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts
    }


def assert_unchanged(root: Path, before: dict[Path, str]) -> None:
    """Every file `before` holds is still there, byte for byte (new ones, tconform's own export
    folder, may have appeared)."""
    after = snapshot(root)
    assert {path: after.get(path) for path in before} == before


def strict_json(path: Path) -> dict:
    def refuse(name):
        raise AssertionError(f"{path}: a bare {name} in a report")

    return json.loads(path.read_text(), parse_constant=refuse)


def assert_one_line(code: int, out: str, err: str, says: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in out + err, err
    assert len(lines) == 1, err
    first = {EXIT_INTERRUPTED: "tconform: interrupted", EXIT_TERMINATED: "tconform: terminated"}
    assert lines[0].startswith(first.get(code, "tconform: error: ")), err
    assert says in lines[0], err


@pytest.fixture
def ws(tmp_path, monkeypatch) -> dict[str, Path]:
    """The user's folder (the current one, holding their package and their own files), a FIFO,
    and a folder apart for the reports."""
    user = tmp_path / "user"
    user.mkdir()
    (user / f"{PACKAGE}.py").write_text(FACTORIES)
    os.mkfifo(user / "fifo")
    (user / "folder").mkdir()
    (user / "notes.txt").write_text("the user's own notes\n")
    (user / "loop1").symlink_to("loop2")  # a symlink loop: Path.resolve raises on it
    (user / "loop2").symlink_to("loop1")
    (user / "notes-link.json").symlink_to("notes.txt")
    np.savez(user / "inputs.npz", x=np.ones((2, 4), np.float32))
    reports = tmp_path / "reports"
    reports.mkdir()
    monkeypatch.chdir(user)
    monkeypatch.delenv("HOSTILE_EXIT_AT_IMPORT", raising=False)
    return {"user": user, "reports": reports, "fifo": user / "fifo"}


def run_subprocess(args: list[str], env: dict | None = None) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "tconform", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )
    return done.returncode, done.stdout, done.stderr


@dataclass(frozen=True)
class Hostile:
    id: str
    args: tuple[str, ...]  # {fifo}, {user}, {golden} are filled in
    says: str  # in the one line
    code: int = EXIT_USAGE
    subprocess: bool = False  # stderr of a child process, or a process that must survive


# A folder path of about 3,980 bytes: below PATH_MAX (4096), with no room for what is written
# in it (files.INSIDE_ROOM).
DEEP = "/".join(["d" * 200] * 19) + "/" + "o" * 100


def T(factory: str = "good") -> str:
    return f"{PACKAGE}:{factory}"


CORPUS = [
    # --- tolerances: finite and >= 0 by type --------------------------------------------------
    Hostile("atol-nan", ("check", T(), "--atol", "nan"), "--atol"),
    Hostile("rtol-inf", ("check", T(), "--rtol", "inf"), "--rtol"),
    Hostile("atol-negative", ("check", T(), "--atol", "-1e-3"), "--atol"),
    Hostile("rtol-overflows", ("check", T(), "--rtol", "1e999"), "--rtol"),
    Hostile("atol-word", ("check", T(), "--atol", "tight"), "--atol"),
    Hostile("atol-arabic-indic", ("check", T(), "--atol", "٣"), "--atol"),
    Hostile("rtol-fullwidth", ("check", T(), "--rtol", "１e-3"), "--rtol"),
    Hostile("ep-all-in-a-list", ("verify", "--ep", "all,cpu", "--no-doc"), "stands alone"),
    Hostile("tolerance-nan", ("check", T(), "--tolerance", "output=nan,nan"), "--tolerance"),
    Hostile("tolerance-neg-inf", ("check", T(), "--tolerance", "output=1e-4,-inf"), "--tolerance"),
    Hostile("tolerance-one-value", ("check", T(), "--tolerance", "output=1e-4"), "OUTPUT=ATOL"),
    Hostile(
        "tolerance-twice",
        ("check", T(), "--tolerance", "output=1,1", "--tolerance", "output=0,0"),
        "given more than once",
    ),
    Hostile("dynamic-arabic-indic", ("check", T(), "--dynamic", "input=٠"), "not an axis index"),
    Hostile("factory-axis-out-of-range", ("check", T("axis_out_of_range")), "axis -7 out of range"),
    Hostile("report-missing-value", ("verify", "--markdown", "--no-torch"), "looks like an option"),
    # --- files: refused before they are opened ----------------------------------------------
    Hostile("model-fifo", ("check", T(), "--model", "{fifo}"), "not a regular file"),
    Hostile("model-dev-zero", ("check", T(), "--model", "/dev/zero"), "not a regular file"),
    Hostile("model-folder", ("check", T(), "--model", "{user}/folder"), "is a folder"),
    Hostile("model-missing", ("check", T(), "--model", "{user}/gone.onnx"), "no such file"),
    Hostile("model-case-pair", ("bench", "--model", "norm={golden}/manifest.json"), "verify's"),
    Hostile(  # a given model is checked as it is: the cells of other dtypes were dropped silently
        "model-with-dtypes",
        ("check", T(), "--model", "{user}/notes.txt", "--matrix", "--dtype", "float32,int8"),
        "--dtype chooses how tconform makes a model",
    ),
    Hostile("inputs-fifo", ("check", T("module_only"), "--inputs", "{fifo}"), "regular file"),
    Hostile("inputs-folder", ("check", T("module_only"), "--inputs", "{user}"), "is a folder"),
    Hostile("compare-fifo", ("bench", "--compare", "{fifo}", "{fifo}"), "not a regular file"),
    Hostile("merge-fifo", ("report", "merge", "{fifo}"), "not a regular file"),
    Hostile("merge-dev-zero", ("report", "merge", "/dev/zero"), "not a regular file"),
    Hostile("model-symlink-loop", ("check", T(), "--model", "{user}/loop1"), "loop1"),
    Hostile("merge-symlink-loop", ("report", "merge", "{user}/loop1"), "loop1"),
    Hostile(
        "verify-model-fifo",
        (
            "verify",
            "--golden",
            "{golden}",
            "--artifacts",
            "{user}/a",
            "--no-doc",
            "--model",
            "norm={fifo}",
        ),
        "not a regular file",
    ),
    Hostile(
        "verify-model-symlink-loop",
        ("verify", "--golden", "{golden}", "--no-doc", "--model", "norm={user}/loop1"),
        "loop1",
    ),
    Hostile(  # a name onnx and ONNX Runtime cannot open: refused, not called an invalid model
        "model-name-not-utf8",
        ("verify", "--golden", "{golden}", "--no-doc", "--model", "norm={user}/\udcff.onnx"),
        "not UTF-8",
    ),
    Hostile("check-out-not-utf8", ("check", T(), "--out", "{user}/\udcff"), "not UTF-8"),
    Hostile("golden-fifo", ("verify", "--golden", "{fifo}", "--no-doc"), "not a folder"),
    Hostile("artifacts-dev-zero", ("doc", "--artifacts", "/dev/zero"), "not a folder"),
    Hostile("bench-artifacts-fifo", ("bench", "--artifacts", "{fifo}"), "not a folder"),
    Hostile("check-out-fifo", ("check", T(), "--out", "{fifo}"), "not a folder"),
    Hostile("check-out-notes", ("check", T(), "--out", "{user}/notes.txt"), "not a folder"),
    # --- bench: refused inside the run, reported like every command -------------------------
    Hostile(
        "bench-shape-too-long",
        (
            "bench",
            "--preset",
            "tiny",
            "--case",
            "norm",
            "--shape",
            "1x13",
            "--artifacts",
            "{user}/b",
        ),
        "exceeds the preset's 12",
    ),
    Hostile(
        "bench-generate-too-many",
        ("bench", "--preset", "tiny", "--ep", "cpu", "--generate", "12"),
        "max new tokens 12",
    ),
    # --- reports: an unknown option before --json hides nothing ------------------------------
    Hostile("verify-unknown-first", ("verify", "--bogus"), "--bogus"),
    Hostile("check-unknown-first", ("check", "--bogus", T()), "--bogus"),
    Hostile("doc-unknown-first", ("doc", "--bogus", "-q"), "--bogus"),
    Hostile("bench-unknown-first", ("bench", "--bogus"), "--bogus"),
    Hostile(
        "generation-golden", ("verify", "--generation", "--golden", "x"), "--golden-generation"
    ),
    Hostile("golden-generation-alone", ("verify", "--golden-generation", "x"), "--generation only"),
    Hostile("bench-generate-bad", ("bench", "--generate", "0"), "--generate"),
    Hostile("merge-unknown-first", ("report", "merge", "--bogus", "x.json"), "--bogus"),
    Hostile("verify-bad-value-first", ("verify", "--opset", "x", "--matrix"), "--opset"),
    # --- parsing: ASCII digits, and nothing sized by a number -------------------------------
    Hostile("shard-superscript", ("verify", "--shard", "²/3"), "--shard"),
    Hostile("shard-arabic-indic", ("verify", "--shard", "١/٣"), "--shard"),
    Hostile("shard-twenty-digits", ("verify", "--shard", "1/" + "9" * 20), "--shard"),
    Hostile("shard-huge-index", ("verify", "--shard", "9" * 5000 + "/1"), "--shard"),
    Hostile("shard-zero", ("verify", "--shard", "0/3"), "--shard"),
    Hostile("shape-superscript", ("bench", "--shape", "²x3"), "--shape"),
    Hostile("seconds-nan", ("bench", "--seconds", "nan"), "--seconds"),
    Hostile("length-penalty-inf", ("bench", "--generate", "2", "--length-penalty", "inf"), "--len"),
    Hostile("top-p-nan", ("bench", "--generate", "2", "--top-p", "nan"), "--top-p"),
    Hostile("device-id-negative", ("verify", "--device-id", "-1"), "--device-id"),
    Hostile("graph-opt-list", ("bench", "--graph-opt", "basic,all"), "one value"),
    Hostile("provider-option", ("verify", "--provider-option", "novalue"), "KEY=VALUE"),
    Hostile(  # refused as the runtime is made: nothing exported, nothing run
        "provider-option-not-taken",
        (
            "verify",
            "--case",
            "norm",
            "--no-doc",
            "--golden",
            "{golden}",
            "--provider-option",
            "foo=1",
            "--artifacts",
            "{user}/exports",
        ),
        "CPUExecutionProvider does not take it",
    ),
    # --- user code that ends the check's process: one line, never exit 0 --------------------
    Hostile("factory-sys-exit", ("check", T("exits_0")), "called sys.exit(0)", subprocess=True),
    Hostile("factory-os-exit", ("check", T("os_exit_0")), "exited with status 0", subprocess=True),
    Hostile(  # neither ONNX nor the comparator takes one: a usage error, not a FAIL row
        "complex-output", ("check", T("complex_output")), "output 'output' is a complex64"
    ),
    Hostile(
        "factory-closes-streams",
        ("check", T("closes_streams")),
        "its code closed the check's stdout, stderr",
        subprocess=True,
    ),
    Hostile("factory-generator-exit", ("check", T("generator_exit")), "GeneratorExit"),
    Hostile("factory-async", ("check", T("async_factory")), "is async", subprocess=True),
    Hostile("factory-segfault", ("check", T("segfault")), "SIGSEGV", subprocess=True),
    Hostile("factory-oom-killed", ("check", T("killed")), "SIGKILL", subprocess=True),
    Hostile(
        "forward-os-exit", ("check", T("forward_os_exit")), "exited with status 0", subprocess=True
    ),
    Hostile("export-sys-exit", ("check", T("export_sys_exit")), "sys.exit(0)", subprocess=True),
]


def _fill(args: tuple[str, ...], ws: dict[str, Path]) -> list[str]:
    values = {"fifo": ws["fifo"], "user": ws["user"], "golden": REPO / "golden"}
    return [arg.format(**values) for arg in args]


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_hostile_input_is_one_line_a_documented_code_and_a_report(cli, ws, case):
    report = ws["reports"] / "r.json"
    args = [*_fill(case.args, ws), "--json", str(report)]
    if args[0] in ("check", "verify", "doc") or args[:2] == ["report", "merge"]:
        args.append("-q")
    before = snapshot(ws["user"])
    code, out, err = run_subprocess(args) if case.subprocess else cli(*args)
    assert code == case.code, out + err
    assert_one_line(code, out, err, case.says)
    data = strict_json(report)
    assert data["exit_code"] == code and data["error"]["exit_code"] == code
    assert case.says in data["error"]["message"]
    assert_unchanged(ws["user"], before)  # nothing it did not write has changed


def test_a_provider_option_not_taken_is_refused_before_anything_is_exported(cli, ws):
    """Runtimes are made (their options checked) before the suite exports or runs a thing."""
    exports = ws["user"] / "exports"
    code, out, err = cli(
        *_fill(next(c for c in CORPUS if c.id == "provider-option-not-taken").args, ws)
    )
    assert code == EXIT_USAGE, out + err
    assert not exports.exists()


def test_a_usage_error_writes_every_requested_format_and_only_over_its_own(cli, ws):
    """Before the command starts (an unknown option first): JSON, JUnit, markdown and a plot
    that says why it is empty; a user's image at a report path is left alone."""
    from tconform.report import plot

    paths = {fmt: ws["reports"] / f"r.{fmt}" for fmt in ("json", "xml", "md", "png")}
    code, out, err = cli(
        "verify", "--bogus", "--json", str(paths["json"]), "--junit", str(paths["xml"]),
        "--markdown", str(paths["md"]), "--plot", str(paths["png"]),
    )  # fmt: skip
    assert code == EXIT_USAGE
    assert_one_line(code, out, err, "--bogus")
    assert strict_json(paths["json"])["error"]["exit_code"] == EXIT_USAGE
    assert "--bogus" in paths["xml"].read_text() and "stopped early" in paths["md"].read_text()
    assert plot.is_own(paths["png"])
    users = ws["user"] / "photo.png"
    users.write_bytes(paths["png"].read_bytes().replace(b"tconform", b"someone"))
    before = snapshot(ws["user"])
    assert cli("bench", "--bogus", "--plot", str(users))[0] == EXIT_USAGE
    assert not plot.is_own(users)
    assert_unchanged(ws["user"], before)


@pytest.mark.parametrize(
    ("args", "target", "says"),
    [
        (("check", T("module_only"), "--inputs", "{user}/inputs.npz", "-q"), "inputs.npz", "not"),
        (
            ("verify", "--golden", "{golden}", "--case", "norm", "--no-doc", "-q"),
            "notes.txt",
            "not",
        ),
        (("doc", "--no-torch", "-q"), "notes-link.json", "symbolic link"),
        (("bench", "--case", "norm", "--shape", "1x2"), "loop1", "symbolic link"),
        (("report", "merge", "{user}/notes.txt"), "notes.txt", "an input"),
    ],
    ids=["inputs-it-reads", "users-notes", "symlink", "symlink-loop", "merge-input"],
)
def test_a_report_replaces_only_a_report_tconform_wrote(cli, ws, args, target, says):
    """A report path holding anything but tconform's own report of its kind (the inputs the run
    reads, a user's notes, a symlink, which writing would replace) is refused before the run;
    the other report still says why."""
    other = ws["reports"] / "r.md"
    before = snapshot(ws["user"])
    code, out, err = cli(
        *_fill(args, ws), "--json", str(ws["user"] / target), "--markdown", str(other)
    )
    assert code == EXIT_USAGE, out + err
    assert_one_line(code, out, err, target)
    assert says in err
    assert_unchanged(ws["user"], before)
    assert (ws["user"] / "notes-link.json").is_symlink()
    assert target in other.read_text()  # the other report is written, and says why


@pytest.mark.skipif(
    __import__("tconform.runtimes.providers").runtimes.providers.unavailable_reason("cuda") is None,
    reason="needs a machine where CUDA cannot run",
)
def test_bench_exit_3_still_writes_its_reports(cli, ws):
    report, markdown = ws["reports"] / "b.json", ws["reports"] / "b.md"
    code, out, err = cli(
        "bench", "--preset", "tiny", "--case", "norm", "--shape", "1x2", "--runs", "1",
        "--engine", "onnxruntime", "--ep", "cuda", "--artifacts", str(ws["user"] / "b"),
        "--json", str(report), "--markdown", str(markdown),
    )  # fmt: skip
    assert code == 3
    assert "Traceback" not in out + err
    assert err.splitlines()[-1].startswith("tconform: error: provider cuda could not run")
    data = strict_json(report)
    assert data["error"]["exit_code"] == 3 and data["unavailable"][0]["ep"] == "cuda"
    assert "stopped early (exit 3)" in markdown.read_text()


@pytest.mark.parametrize(
    ("raised", "code"),
    [
        (KeyboardInterrupt, EXIT_INTERRUPTED),
        (Terminated, EXIT_TERMINATED),
        (OSError(28, "No space left on device", "scratch"), EXIT_USAGE),
        (MemoryError, EXIT_USAGE),
    ],
    ids=["ctrl-c", "sigterm", "oserror", "memory"],
)
def test_an_end_before_the_run_frame_starts_still_writes_the_reports(
    cli, ws, monkeypatch, raised, code
):
    """Whatever ends a command before its frame runs (a signal while it starts, a full disk),
    the reports it asked for are written with the error, as the frame would."""
    import tconform.commands.verify as command

    def stopped(*args, **kwargs):
        raise raised

    monkeypatch.setattr(command, "run_and_report", stopped)
    report = ws["reports"] / "r.json"
    code_seen, out, err = cli("verify", "-q", "--json", str(report))
    assert code_seen == code
    assert "Traceback" not in out + err and len(err.strip().splitlines()) == 1
    data = strict_json(report)
    assert data["exit_code"] == code and data["error"]["exit_code"] == code


def test_user_code_that_ends_at_import_never_passes(ws):
    """`sys.exit(0)` at the top of the user's module: not a pass, one line, exit 2."""
    report = ws["reports"] / "r.json"
    code, out, err = run_subprocess(
        ["check", T(), "-q", "--json", str(report)], env={"HOSTILE_EXIT_AT_IMPORT": "1"}
    )
    assert code == EXIT_USAGE
    assert_one_line(code, out, err, f"importing '{PACKAGE}': called sys.exit(0)")
    assert strict_json(report)["error"]["exit_code"] == EXIT_USAGE


# --- check --out: only what tconform check wrote is replaced ---------------------------------


@pytest.mark.parametrize(
    "record",
    [
        "the user's own check list\n",  # not JSON
        '{"checked": ["a", "b"]}\n',  # JSON without the tool's marker
        '{"tool": "tconform check", "sha256": {"model.onnx": "not a digest"}}\n',
        '{"tool": "tconform check", "sha256": {"weights.bin": "' + "0" * 64 + '"}}\n',
        None,  # a folder named check.json
    ],
    ids=["text", "no-marker", "not-a-digest", "foreign-file", "folder"],
)
def test_check_out_never_replaces_a_check_json_it_did_not_write(cli, ws, record):
    out_dir = ws["user"] / "exports"
    out_dir.mkdir()
    if record is None:
        (out_dir / "check.json").mkdir()
    else:
        (out_dir / "check.json").write_text(record)
    report = ws["reports"] / "r.json"
    before = snapshot(ws["user"])
    code, out, err = cli("check", T(), "--out", str(out_dir), "-q", "--json", str(report))
    assert code == EXIT_USAGE
    assert_one_line(code, out, err, "check.json: not written by tconform check")
    assert strict_json(report)["error"]["exit_code"] == EXIT_USAGE
    assert_unchanged(ws["user"], before)
    assert not (out_dir / "model.onnx").exists()  # refused before anything ran


# --- nothing compared: never a pass, and said on stderr (all a CI log shows under -q) ---------


@pytest.mark.parametrize("factory", ["no_elements", "all_nan", "all_inf"])
def test_an_output_with_no_element_is_nothing_checked_and_says_so(cli, ws, factory):
    report = ws["reports"] / "r.json"
    code, out, err = cli("check", T(factory), "-q", "--json", str(report))
    assert code == 3
    assert_one_line(code, out, err, "nothing checked: every ONNX lane was skipped")
    assert "nothing compared" in err
    data = strict_json(report)
    assert data["exit_code"] == 3 and "nothing compared" in data["error"]["message"]
    assert {r["status"] for r in data["results"]} == {"skip"}
    assert {o["status"] for r in data["results"] for o in r["outputs"]} == {"skip"}


# --- --inputs: arrays of bool, integers or floating point, nothing else ----------------------


@pytest.mark.parametrize(
    ("array", "says"),
    [
        (np.array(["a", "b"]), "text"),
        (np.array([b"a", b"b"]), "bytes"),
        (np.zeros(2, dtype=[("x", "f4"), ("y", "i4")]), "a structured type"),
        (np.array([1 + 2j, 3j]), "complex numbers"),
        (np.array(["2024-01-01"], dtype="datetime64[D]"), "dates"),
        (np.array([{"a": 1}], dtype=object), "input"),  # unreadable without pickle
        (None, "member 'input.txt' is not a .npy array"),  # a zip of something else
    ],
    ids=["str", "bytes", "structured", "complex", "datetime", "object", "not-npy"],
)
def test_inputs_that_are_no_numbers_are_one_line(ws, array, says):
    inputs = ws["user"] / "inputs.npz"
    if array is None:
        import zipfile

        with zipfile.ZipFile(inputs, "w") as archive:
            archive.writestr("input.txt", "1 2 3")
    else:
        np.savez(inputs, input=array)
    report = ws["reports"] / "r.json"
    before = snapshot(ws["user"])
    code, out, err = run_subprocess(
        ["check", T("module_only"), "--inputs", str(inputs), "-q", "--json", str(report)]
    )
    assert code == EXIT_USAGE
    assert_one_line(code, out, err, str(inputs))
    assert says in err
    assert strict_json(report)["error"]["exit_code"] == EXIT_USAGE
    assert_unchanged(ws["user"], before)


def test_a_name_that_is_not_utf8_is_refused_and_every_report_says_so(cli, ws):
    """An --inputs archive whose name holds an undecodable byte names the input set in every
    report, which no text can hold: refused before the run, naming it; the markdown and the
    plot that say why carry it escaped (neither UTF-8 nor a font takes the raw byte)."""
    from tconform.report import plot

    inputs = ws["user"] / "in_\udcff.npz"
    np.savez(inputs, x=np.ones((2, 3), np.float32))
    paths = {fmt: ws["reports"] / f"r.{fmt}" for fmt in ("json", "md", "png")}
    before = snapshot(ws["user"])
    code, out, err = cli(
        "check", T("module_only"), "--inputs", str(inputs), "--json", str(paths["json"]),
        "--markdown", str(paths["md"]), "--plot", str(paths["png"]),
    )  # fmt: skip
    assert code == EXIT_USAGE
    assert_one_line(code, out, err, "not UTF-8")
    assert strict_json(paths["json"])["error"]["exit_code"] == EXIT_USAGE
    assert "in_\\xff.npz" in paths["md"].read_text(encoding="utf-8")
    assert plot.is_own(paths["png"])
    assert_unchanged(ws["user"], before)


# --- the Python API: the same promises where they can be kept in-process ---------------------


def test_python_check_refuses_non_finite_and_negative_tolerances(tmp_path, monkeypatch):
    import torch

    import tconform
    from tconform.errors import UsageError
    from tconform.suites.module import Tolerances

    monkeypatch.chdir(tmp_path)
    for bad in (float("nan"), float("inf"), -1.0, "nan", True):
        with pytest.raises(UsageError, match="atol"):
            Tolerances(("output",), atol=bad)
        with pytest.raises(UsageError, match="--tolerance output"):
            Tolerances(("output",), per_output=(("output", (1e-4, bad)),))
    with pytest.raises(UsageError, match="rtol"):
        tconform.check(
            torch.nn.Linear(2, 2), torch.ones(1, 2), rtol=float("nan"), runtimes=("torch",)
        )


def test_python_check_turns_sys_exit_in_user_code_into_one_usage_error(tmp_path, monkeypatch):
    """What an in-process `tconform.check` survives: sys.exit and GeneratorExit in the factory
    loader and the module (os._exit and a segfault it cannot: the command line can)."""
    from tconform.errors import UsageError
    from tconform.module_check.inputs import load_factory

    (tmp_path / "api_hostile.py").write_text(
        "import sys\ndef exits():\n    sys.exit(3)\ndef gen():\n    raise GeneratorExit\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"the factory: called sys.exit\(3\)"):
        load_factory("api_hostile:exits")
    with pytest.raises(UsageError, match="the factory: GeneratorExit"):
        load_factory("api_hostile:gen")


# --- signals: reports on Ctrl-C and SIGTERM, and the check's process ends with the command ----


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tconform", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,  # its own process group, as a terminal's Ctrl-C reaches it
        # Ctrl-C as a terminal delivers it: a test run started in the background by a
        # non-interactive shell (`pytest &`) has SIGINT ignored, which every child would inherit
        # (and, as a program should, keep ignored).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for_child(process: subprocess.Popen, timeout: float = 120) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = psutil.Process(process.pid).children(recursive=True)
        # the check's own process, not multiprocessing's resource tracker
        python = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
        if python:
            time.sleep(3)  # the child is importing torch and the factory: mid-work
            return children
        time.sleep(0.2)
    raise AssertionError("the check's process never started")


@pytest.mark.parametrize(
    ("signals", "code", "says"),
    [
        ((signal.SIGINT,), EXIT_INTERRUPTED, "interrupted"),
        ((signal.SIGTERM,), EXIT_TERMINATED, "terminated"),
        # an impatient user, then a supervisor: the first signal decides the code and report
        ((signal.SIGINT, signal.SIGINT, signal.SIGTERM), EXIT_INTERRUPTED, "interrupted"),
    ],
    ids=["sigint", "sigterm", "sigint-sigint-sigterm"],
)
def test_a_signal_during_check_writes_the_report_and_ends_its_process(ws, signals, code, says):
    report = ws["reports"] / "r.json"
    before = snapshot(ws["user"])
    process = _start(["check", T("sleeps"), "-q", "--json", str(report)])
    children = _wait_for_child(process)
    for signum in signals:
        os.killpg(process.pid, signum)  # the whole group, as Ctrl-C in a terminal
        time.sleep(0.05)
    out, err = process.communicate(timeout=60)
    assert process.returncode == code
    assert_one_line(code, out, err, says)
    assert strict_json(report)["error"] == {"message": says, "exit_code": code}
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive  # the check's process ended with the command
    assert_unchanged(ws["user"], before)


def test_what_the_users_code_started_in_a_session_of_its_own_ends_with_the_check(ws):
    process = _start(["check", T("escapes_and_sleeps"), "-q"])
    _wait_for_child(process)
    pid_file = ws["user"] / "escapee.pid"
    deadline = time.monotonic() + 60
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the factory never started its process"
        time.sleep(0.2)
    escapee = psutil.Process(int(pid_file.read_text()))
    assert os.getsid(escapee.pid) != os.getsid(process.pid)  # it did escape the group
    os.killpg(process.pid, signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == EXIT_TERMINATED
    _gone, alive = psutil.wait_procs([escapee], timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def test_a_signal_during_bench_writes_its_reports(ws):
    report, markdown = ws["reports"] / "b.json", ws["reports"] / "b.md"
    process = _start(
        ["bench", "--preset", "tiny", "--case", "transformer", "--shape", "1x4", "--ep", "cpu",
         "--engine", "onnxruntime", "--engine", "torch", "--seconds", "30",
         "--artifacts", str(ws["user"] / "bench"), "--json", str(report),
         "--markdown", str(markdown)],
    )  # fmt: skip
    # Mid-run: once its one model is exported, while it times (30 s a row: the signal comes
    # first). A Ctrl-C while the export pool spawns its workers can be lost (export/pool.py
    # says why); a loaded machine widens that.
    for line in process.stderr:
        if ": exported" in line:
            break
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in out + err
    data = strict_json(report)
    assert data["tool"] == "tconform bench" and data["error"]["exit_code"] == EXIT_INTERRUPTED
    assert data["settings"]["preset"] == "tiny"  # what it knew when it stopped
    assert "stopped early (exit 130)" in markdown.read_text()


# --- generation: degenerate log-probabilities are a conformance failure, never a crash ----------


class _Stepper:
    def __init__(self, fill: float, shape: tuple[int, ...] | None = None) -> None:
        self.fill, self.shape = fill, shape

    def start(self, src_ids, src_keep) -> None:
        pass

    def step(self, tokens, keep):
        if self.shape is not None:
            return np.zeros(self.shape)
        values = np.log(np.full((len(tokens), 7), 1 / 7))
        values[0] = self.fill  # one live sequence is enough
        return values

    def reorder(self, rows) -> None:
        pass


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
@pytest.mark.parametrize(
    ("fill", "shape", "says"),
    [
        (-np.inf, None, "are -inf for every token"),
        (np.inf, None, "hold +inf"),
        (0.0, (2, 1, 7), "of shape [2, 1, 7]"),
        (0.0, (2, 0), "of shape [2, 0]"),
        (0.0, (3, 7), "of shape [3, 7]"),
    ],
    ids=["minus-inf", "plus-inf", "rank-3", "no-vocabulary", "wrong-batch"],
)
def test_degenerate_steps_are_a_conformance_failure_in_every_strategy(strategy, fill, shape, says):
    from tconform.generation.driver import Decoding, DegenerateOutput, Strategy, generate

    src = np.ones((2, 3), dtype=np.int64)
    with pytest.raises(DegenerateOutput) as raised:
        generate(_Stepper(fill, shape), src, src > 0, Decoding(4), Strategy(strategy, 3))
    assert says in str(raised.value) and raised.value.exit_code == EXIT_FAILURE


# --- issue 28: nothing outside what tconform wrote is touched; every input checked first ------
#
# Each case plants what an attacker (or an unlucky user) would leave in the user's folder, runs
# one command, and asserts: its exit code; one line; the JSON report written with its error;
# and, over the whole test folder (the user's folder, the reports and a folder `outside`), not
# one entry created, changed or removed but the report itself and what the case says it writes.


def tree(root: Path) -> dict[str, str]:
    """Every entry under `root` (files by sha256, symlinks by target, folders, anything else by
    kind), keyed by its path relative to `root`: what a run must leave as it found it."""
    entries = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in path.parts:
            continue
        if path.is_symlink():
            entries[rel] = "link -> " + os.readlink(path)
        elif path.is_dir():
            entries[rel] = "folder"
        elif path.is_file():
            entries[rel] = sha256(path)
        else:
            entries[rel] = "special"
    return entries


def copy_golden(ws: dict[str, Path], name: str = "g") -> Path:
    import shutil

    shutil.copytree(REPO / "golden", ws["user"] / name)
    return ws["user"] / name


def copy_generation_golden(ws: dict[str, Path], edit=None) -> Path:
    """A copy of the generation goldens, its manifest edited by `edit(manifest)`."""
    import shutil

    folder = ws["user"] / "gg"
    shutil.copytree(REPO / "golden-generation", folder)
    if edit is not None:
        manifest = json.loads((folder / "manifest.json").read_text())
        edit(manifest)
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def every_decoding(key: str, value) -> Callable:
    def edit(manifest: dict) -> None:
        for entry in manifest["cases"].values():
            entry["decoding"][key] = value

    return lambda ws: copy_generation_golden(ws, edit)


def every_case(key: str, edit_value: Callable) -> Callable:
    def edit(manifest: dict) -> None:
        for entry in manifest["cases"].values():
            entry[key] = edit_value(entry[key])

    return lambda ws: copy_generation_golden(ws, edit)


def recorded_checkpoint(name) -> Callable:
    def edit(manifest: dict) -> None:
        manifest["checkpoint"]["name"] = name

    return lambda ws: copy_generation_golden(ws, edit)


def check_export_folder(ws: dict[str, Path]) -> None:
    """What tconform check leaves as its export folder (no manifest: its record check.json)."""
    write_file("c/check.json", '{"tool": "tconform check", "sha256": {}}')(ws)


def lock_link(ws: dict[str, Path]) -> None:
    """A golden folder whose lock's name is a symlink to a file outside, not yet there."""
    copy_golden(ws)
    (ws["user"] / ".g.lock").symlink_to(ws["outside"] / "created-by-the-lock")


def earlier_bundle(ws: dict[str, Path], where: str = "user", name: str = "b") -> Path:
    """A repro bundle as tconform writes it (its own writer, folders.replace_whole: the marker
    lists every file with its sha256), small and made without running anything."""
    from tconform.folders import BUNDLE_MARKER, BUNDLE_TOOL, replace_whole

    def write(staging: Path) -> None:
        (staging / "model.onnx").write_bytes(b"a cut of the model")
        (staging / "test_data_set_0").mkdir()
        (staging / "test_data_set_0" / "input_0.pb").write_bytes(b"its input")

    return replace_whole(ws[where] / name, BUNDLE_MARKER, {"tool": BUNDLE_TOOL}, write, "--repro")


def then(*steps: Callable) -> Callable:
    """One plant made of several: each step gets the workspace."""

    def plant(ws: dict[str, Path]) -> None:
        for step in steps:
            step(ws)

    return plant


def write_file(rel: str, text: str = "the user's own\n") -> Callable:
    def plant(ws: dict[str, Path]) -> None:
        path = ws["user"] / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    return plant


def make_folder(rel: str) -> Callable:
    return lambda ws: (ws["user"] / rel).mkdir(parents=True, exist_ok=True)


def symlink(rel: str, target: str) -> Callable:
    """A symlink at `rel` in the user's folder to `target` ({user} and {outside} filled in)."""

    def plant(ws: dict[str, Path]) -> None:
        path = ws["user"] / rel
        path.unlink(missing_ok=True)
        path.symlink_to(target.format(user=ws["user"], outside=ws["outside"]))

    return plant


def edited_golden(edit: Callable) -> Callable:
    """A copy of the goldens in the user's folder ("g"), its manifest edited by `edit`."""

    def plant(ws: dict[str, Path]) -> None:
        folder = copy_golden(ws)
        manifest = json.loads((folder / "manifest.json").read_text())
        edit(manifest)
        (folder / "manifest.json").write_text(json.dumps(manifest))

    return plant


def artifacts_folder(ws: dict[str, Path]) -> None:
    (ws["user"] / "art").mkdir()
    (ws["user"] / "art" / "manifest.json").write_text(
        '{"kind": "tconform-artifacts", "models": {}}'
    )


@dataclass(frozen=True)
class Planted:
    id: str
    args: tuple[str, ...]  # {user}, {outside}, {golden} are filled in
    says: str  # in the one line
    plant: Callable | None = None  # plant(ws): what the user's folder holds first
    env: tuple[tuple[str, str], ...] = ()
    code: int = EXIT_USAGE
    writes: tuple[str, ...] = ()  # what the command may create, relative to the test folder
    json: str | None = None  # a --json path of its own (refused): the markdown report says why


NO_REPORTS = ("export", "golden")  # the commands that write no report
VERIFY_GG = (
    "verify",
    "--generation",
    "--golden-generation",
    "{user}/gg",
    "--artifacts",
    "{user}/art",
    "--no-torch",
)


# verify on a planted golden folder with a runtime release: refused before any environment
VERIFY_A_RELEASE = ("verify", "--golden", "{user}/g", "--no-doc", "--case", "norm", "--no-torch",
                    "--runtime", "onnxruntime==1.20.1")  # fmt: skip


# bench with a graph variant, whose models go to a folder beside --artifacts (ab-sdpa)
BENCH_SDPA = ("bench", "--preset", "tiny", "--case", "norm", "--artifacts", "{user}/ab",
              "--engine", "onnxruntime", "--engine", "onnxruntime-sdpa", "--ep", "cpu")  # fmt: skip


def verify_gg(id: str, says: str, plant: Callable) -> Planted:
    """`verify --generation` on a planted golden folder: refused, creating nothing (a reader
    makes no lock beside a folder it reads)."""
    return Planted(id, VERIFY_GG, says, plant)


COMMANDS = {  # one cheap command line of each command, for what every command must refuse
    "export": ("export", "--case", "norm", "--out", "{user}/art"),
    "golden": ("golden", "--check", "--out", "{golden}"),
    "verify": ("verify", "--golden", "{golden}", "--no-doc", "--case", "norm"),
    "doc": ("doc", "--artifacts", "{user}/art"),
    "bench": ("bench", "--case", "norm", "--artifacts", "{user}/art"),
    "check": ("check", T()),
    "merge": ("report", "merge", "{user}/notes.txt"),
}

PLANTED = [
    # --- environment variables: one line naming the variable, in every command ---------------
    *(
        Planted(
            f"lock-timeout-{value or 'empty'}-{command}",
            args,
            "TCONFORM_LOCK_TIMEOUT",
            env=(("TCONFORM_LOCK_TIMEOUT", value),),
        )
        for command, args in COMMANDS.items()
        for value in ("abc", "")
    ),
    *(
        Planted(
            f"lock-timeout-{name}",
            COMMANDS["verify"],
            "TCONFORM_LOCK_TIMEOUT",
            env=(("TCONFORM_LOCK_TIMEOUT", value),),
        )
        for name, value in (
            ("nan", "nan"),
            ("inf", "inf"),
            ("negative", "-1"),
            ("exponent", "1e999"),
            ("arabic-indic", "٣"),
            ("space", " 5"),
        )
    ),
    Planted(
        "unknown-variable",
        COMMANDS["check"],
        "TCONFORM_LOCK_TIMEOUTS",
        env=(("TCONFORM_LOCK_TIMEOUTS", "5"),),
    ),
    # --- locks: never through a symlink -------------------------------------------------------
    Planted(
        "lock-symlink-verify",
        ("verify", "--golden", "{user}/g", "--no-doc", "--case", "norm"),
        ".g.lock: the lock's name is a symbolic link",
        lock_link,
    ),
    Planted(
        "lock-symlink-golden-force",
        ("golden", "--force", "--case", "norm", "--out", "{user}/g"),
        ".g.lock: the lock's name is a symbolic link",
        lock_link,
    ),
    # --- generation manifests: a name is a name, every value checked before the run ----------
    verify_gg("checkpoint-absolute", "a name, never a path", recorded_checkpoint("/etc/passwd")),
    verify_gg(
        "checkpoint-dotdot",
        "a name, never a path",
        recorded_checkpoint("../../../../outside/weights"),
    ),
    verify_gg(
        "checkpoint-not-a-string",
        "a name, never a path",
        recorded_checkpoint({"name": "reverse"}),
    ),
    Planted(
        "checkpoint-golden-check",
        ("golden", "--generation", "--check", "--out", "{user}/gg"),
        "a name, never a path",
        recorded_checkpoint("../reverse"),
    ),
    verify_gg(
        "max-new-tokens-huge",
        "max new tokens 1000000000: must be 1..",
        every_decoding("max_new_tokens", 10**9),
    ),
    verify_gg(
        "max-new-tokens-negative",
        "max new tokens -1",
        every_decoding("max_new_tokens", -1),
    ),
    verify_gg(
        "max-new-tokens-string",
        "'max_new_tokens' must be an integer",
        every_decoding("max_new_tokens", "8"),
    ),
    verify_gg(
        "max-new-tokens-bool",
        "'max_new_tokens' must be an integer",
        every_decoding("max_new_tokens", True),
    ),
    verify_gg(
        "max-new-tokens-shorter-than-stored",
        "tokens is int64",
        every_decoding("max_new_tokens", 2),
    ),
    verify_gg(
        "pad-id-negative",
        "pad token -5 outside the vocabulary",
        every_decoding("pad_id", -5),
    ),
    verify_gg(
        "eos-id-outside-vocabulary",
        "end token (--end-token) 31 outside",
        every_decoding("eos_id", 31),
    ),
    verify_gg(
        "decoding-unknown-field",
        "'decoding' must hold",
        every_decoding("temperature", 2),
    ),
    verify_gg(  # the strategy comes from the case's name: a recorded other one is not run over
        "strategy-beam-width-not-the-names",
        "'strategy' is {'beam_width': 5",
        every_case("strategy", lambda strategy: {**strategy, "beam_width": 5}),
    ),
    verify_gg(
        "strategy-length-penalty-nan",
        "'length_penalty': nan",
        every_case("strategy", lambda strategy: {**strategy, "length_penalty": float("nan")}),
    ),
    verify_gg("set-not-the-names", "'set' is 'other'", every_case("set", lambda _: "other")),
    verify_gg(
        "generation-stored-float16",
        "'stored_dtype' must be float32",
        lambda ws: copy_generation_golden(ws, lambda m: m.update(stored_dtype="float16")),
    ),
    verify_gg(
        "generation-preset-not-its-config",
        "'base' is not a preset whose config is 'config'",
        lambda ws: copy_generation_golden(ws, lambda m: m.update(preset="base")),
    ),
    verify_gg(  # a plain run checks every golden: one deleted is an error, not a smaller pass
        "generation-case-deleted",
        "no generation golden 'ends-beam3' (a plain verify --generation checks every one",
        lambda ws: copy_generation_golden(ws, lambda m: m["cases"].pop("ends-beam3")),
    ),
    verify_gg(
        "generation-seed-string",
        "'seed' must be an integer",
        lambda ws: copy_generation_golden(ws, lambda m: m.update(seed="7")),
    ),
    verify_gg(
        "generation-config-not-the-checkpoints",
        "'config' is not the one",
        lambda ws: copy_generation_golden(ws, lambda m: m["config"].update(n_layers=3)),
    ),
    # --- --repro: a new folder, or a bundle tconform wrote as it wrote it, refused first ----
    Planted(
        "repro-users-bundle-json",
        ("check", T(), "--repro", "{user}/b"),
        "b/bundle.json: missing, or not written by",
        then(
            write_file("b/bundle.json", '{"tool": "tconform check --repro"}'),
            write_file("b/notes.txt"),
        ),
    ),
    Planted(
        "repro-notes-added-to-a-bundle",
        ("check", T(), "--repro", "{user}/b"),
        "b/NOTES.md: not a file tconform check --repro wrote there",
        then(earlier_bundle, write_file("b/NOTES.md")),
    ),
    Planted(
        "repro-folder-added-to-a-bundle",
        ("check", T(), "--repro", "{user}/b"),
        "b/mine: a folder tconform check --repro did not write there",
        then(earlier_bundle, make_folder("b/mine")),
    ),
    Planted(  # writing there changes the bundle; replacing the bundle would take it along
        "repro-inside-a-bundle",
        ("check", T(), "--repro", "{user}/b/sub"),
        "b/sub: lies in",
        earlier_bundle,
    ),
    Planted(  # check's export folder in a bundle: the bundle changed, --repro then refused it
        "out-inside-a-bundle",
        ("check", T(), "--out", "{user}/b/o"),
        "b, a bundle tconform check --repro wrote; --out",
        earlier_bundle,
    ),
    Planted(
        "report-inside-a-bundle",
        ("check", T(), "--markdown", "{user}/b/r.md"),
        "b, a bundle tconform check --repro wrote; reports go elsewhere",
        earlier_bundle,
    ),
    Planted(
        "repro-file-of-a-bundle-changed",
        ("check", T(), "--repro", "{user}/b"),
        "b/model.onnx: missing or changed since",
        then(earlier_bundle, write_file("b/model.onnx", "the user's edit")),
    ),
    Planted(
        "repro-file-of-a-bundle-removed",
        ("check", T(), "--repro", "{user}/b"),
        "b/model.onnx: missing or changed since",
        then(earlier_bundle, lambda ws: (ws["user"] / "b" / "model.onnx").unlink()),
    ),
    Planted(
        "repro-file-of-a-bundle-a-symlink",
        ("check", T(), "--repro", "{user}/b"),
        "b/model.onnx: a symbolic link",
        then(earlier_bundle, symlink("b/model.onnx", "{outside}/weights.json")),
    ),
    Planted(
        "repro-marker-a-symlink",
        ("check", T(), "--repro", "{user}/c"),
        "c/bundle.json: missing, or not written by",
        then(earlier_bundle, make_folder("c"), symlink("c/bundle.json", "{user}/b/bundle.json")),
    ),
    Planted(
        "repro-marker-lists-dotdot",
        ("check", T(), "--repro", "{user}/b"),
        "b/bundle.json: missing, or not written by",
        then(
            earlier_bundle,
            write_file(
                "b/bundle.json",
                json.dumps({"tool": "tconform check --repro", "files": {"../notes.txt": "0" * 64}}),
            ),
        ),
    ),
    Planted(
        "repro-symlink-to-a-bundle",
        ("check", T(), "--repro", "{user}/link"),
        "link: a symbolic link",
        then(lambda ws: earlier_bundle(ws, "outside"), symlink("link", "{outside}/b")),
    ),
    Planted(
        "repro-dangling-symlink",
        ("check", T(), "--repro", "{user}/link"),
        "not a folder",
        symlink("link", "{outside}/new-bundle"),
    ),
    Planted(
        "repro-in-a-golden-folder",
        ("check", T(), "--repro", "{user}/g/norm/repro"),
        "is or lies in a golden, artifacts or check export folder",
        copy_golden,
    ),
    Planted(
        "repro-is-a-golden-folder",
        ("check", T(), "--repro", "{user}/g"),
        "is or lies in a golden, artifacts or check export folder",
        copy_golden,
    ),
    Planted(
        "repro-in-an-artifacts-folder",
        ("check", T(), "--repro", "{user}/art/repro"),
        "is or lies in a golden, artifacts or check export folder",
        artifacts_folder,
    ),
    Planted(
        "repro-in-the-check-area",
        ("check", T(), "--repro", "{user}/art/check/x/repro"),
        "is or lies in a golden, artifacts or check export folder",
        artifacts_folder,
    ),
    Planted(
        "repro-in-a-check-export-folder",
        ("check", T(), "--repro", "{user}/c/repro"),
        "is or lies in a golden, artifacts or check export folder",
        check_export_folder,
    ),
    Planted(
        "report-in-a-check-export-folder",
        ("check", T()),
        "check export folder; reports go elsewhere",
        check_export_folder,
        json="{user}/c/report.json",
    ),
    Planted(
        "golden-in-a-check-export-folder",
        ("golden", "--case", "norm", "--out", "{user}/c/g"),
        "a tconform golden, artifacts or check export folder; goldens go",
        check_export_folder,
    ),
    Planted(
        "export-in-a-check-export-folder",
        ("export", "--case", "norm", "--out", "{user}/c/e"),
        "lies in check's export folder",
        check_export_folder,
    ),
    Planted(
        "check-out-in-another-checks-export-folder",
        ("check", T(), "--out", "{user}/c/sub"),
        "tconform check's export folder; --out (bench: --artifacts) needs a folder of its own",
        check_export_folder,
    ),
    Planted("repro-dot", ("check", T(), "--repro", "."), "the current folder"),
    Planted("repro-dotdot", ("check", T(), "--repro", ".."), "the current folder, or one above"),
    Planted("repro-the-users-folder", ("check", T(), "--repro", "{user}"), "the current folder"),
    Planted("repro-a-file", ("check", T(), "--repro", "{user}/notes.txt"), "not a folder"),
    Planted(
        "repro-holds-the-out-folder",
        ("check", T(), "--repro", "{user}/b", "--out", "{user}/b/export"),
        "holds or lies in",
    ),
    Planted(
        "repro-in-the-out-folder",
        ("check", T(), "--out", "{user}/e", "--repro", "{user}/e/b"),
        "holds or lies in",
    ),
    Planted(
        "repro-holds-the-inputs",
        ("check", T("module_only"), "--inputs", "{user}/inputs.npz", "--repro", "{user}"),
        "the current folder",
    ),
    Planted(
        "repro-holds-the-model",  # checking an earlier bundle's own model into it
        ("check", T(), "--model", "{user}/b/model.onnx", "--repro", "{user}/b"),
        "holds or lies in",
        earlier_bundle,
    ),
    Planted(
        "repro-holds-the-report",
        ("check", T(), "--repro", "{user}/b"),
        "a bundle tconform check --repro wrote; reports go elsewhere",
        earlier_bundle,
        json="{user}/b/r.json",
    ),
    # --- a link on the way to a folder tconform writes in is refused in every command ------
    Planted(
        "repro-through-a-linked-folder",
        ("check", T(), "--repro", "plink/rp"),
        "plink: a symbolic link (--repro)",
        symlink("plink", "{outside}"),
    ),
    Planted(
        "golden-out-through-a-linked-folder",
        ("golden", "--case", "norm", "--out", "plink/gg"),
        "plink: a symbolic link (the golden folder)",
        symlink("plink", "{outside}"),
    ),
    Planted(
        "json-through-a-linked-folder",
        ("check", T()),
        "plink: a symbolic link (the report's folder)",
        symlink("plink", "{outside}"),
        json="plink/r.json",
    ),
    # --- reports named inside what the command refuses are not written there ---------------
    Planted(
        "check-json-is-its-own-record",
        ("check", T(), "--out", "{user}/D"),
        "the --out folder of this run",
        make_folder("D"),
        json="{user}/D/check.json",
    ),
    Planted(
        "check-json-in-a-refused-out",
        ("check", T(), "--out", "{user}/D"),
        "the --out folder of this run",
        write_file("D/model.onnx", "mine"),
        json="{user}/D/r.json",
    ),
    # a report inside the export folder that defaults to one named after the target
    Planted(
        "check-json-in-its-default-out",
        ("check", T()),
        "the --out folder of this run",
        make_folder(f"artifacts/check/{PACKAGE}.good"),
        json=f"{{user}}/artifacts/check/{PACKAGE}.good/r.json",
    ),
    Planted(
        "bench-json-in-its-default-artifacts",
        ("bench", T()),
        "the --artifacts folder of this run",
        make_folder(f"artifacts/check/{PACKAGE}.good"),
        json=f"{{user}}/artifacts/check/{PACKAGE}.good/r.json",
    ),
    Planted(  # the default export folder's own record: refused, and not written to say so
        "check-json-is-its-default-record",
        ("check", T()),
        "a file tconform check reads or keeps",
        make_folder(f"artifacts/check/{PACKAGE}.good"),
        json=f"{{user}}/artifacts/check/{PACKAGE}.good/check.json",
    ),
    Planted(
        "check-json-is-the-model",
        ("check", T(), "--model", "{user}/m.json"),
        "a file tconform check reads or keeps",
        write_file("m.json", "{}"),
        json="{user}/m.json",
    ),
    Planted(
        "merge-json-is-a-shard",
        ("report", "merge", "{user}/s.json"),
        "an input of this run",
        write_file("s.json", "{}"),
        json="{user}/s.json",
    ),
    Planted(
        "report-in-a-new-artifacts-folder",
        ("verify", "--golden", "{golden}", "--no-doc", "--artifacts", "{user}/art"),
        "the --artifacts folder of this run",
        make_folder("art"),
        json="{user}/art/r.json",
    ),
    Planted(
        "report-in-the-check-out-folder",
        ("check", T(), "--out", "{user}/D"),
        "the --out folder of this run",
        make_folder("D"),
        json="{user}/D/r.json",
    ),
    Planted(
        "report-in-the-bench-artifacts",
        ("bench", "--case", "norm", "--artifacts", "{user}/art"),
        "the --artifacts folder",
        make_folder("art"),
        json="{user}/art/r.json",
    ),
    Planted(
        "report-in-the-doc-artifacts",
        ("doc", "--artifacts", "{user}/art"),
        "the --artifacts folder",
        make_folder("art/doc"),
        json="{user}/art/doc/r.json",
    ),
    # --- writing through a symlink: never (a link would become a folder, or lead outside) ---
    Planted(
        "golden-force-onto-a-symlink",
        ("golden", "--force", "--case", "norm", "--out", "{user}/link"),
        "link: a symbolic link",
        then(copy_golden, symlink("link", "{user}/g")),
    ),
    Planted(
        "golden-case-into-a-symlink",
        ("golden", "--case", "norm", "--out", "{user}/link"),
        "link: a symbolic link",
        symlink("link", "{outside}"),
    ),
    Planted(
        "generation-golden-force-onto-a-symlink",
        ("golden", "--generation", "--force", "--out", "{user}/link"),
        "link: a symbolic link",
        then(copy_generation_golden, symlink("link", "{user}/gg")),
    ),
    Planted(
        "doc-area-a-symlink-out",
        ("doc", "--artifacts", "{user}/art", "--no-torch"),
        "holds 'doc' and no artifacts manifest",  # a link is no area of its own
        then(make_folder("art"), symlink("art/doc", "{outside}")),
    ),
    Planted(  # the graph variant's folder beside --artifacts: refused before either is made
        "bench-variant-folder-a-file", BENCH_SDPA, "ab-sdpa: not a folder", write_file("ab-sdpa")
    ),
    Planted(
        "bench-variant-folder-a-users",
        BENCH_SDPA,
        "ab-sdpa: holds 'notes.txt' and no artifacts manifest",
        write_file("ab-sdpa/notes.txt"),
    ),
    # --- a folder the user named is theirs until tconform made it ------------------------------
    Planted(
        "export-over-a-users-manifest",  # any JSON object was replaced by tconform's
        ("export", "--case", "norm", "--out", "{user}/d"),
        "d/manifest.json: neither a golden nor an artifacts manifest",
        write_file("d/manifest.json", '{"my": "config"}'),
    ),
    Planted(
        "verify-artifacts-a-users-manifest",
        ("verify", "--golden", "{user}/g", "--artifacts", "{user}/d", "--no-doc", "--case", "norm"),
        "d/manifest.json: neither a golden nor an artifacts manifest",
        then(copy_golden, write_file("d/manifest.json", '{"kind": "my-tool"}')),
    ),
    Planted(
        "export-among-a-users-files",
        ("export", "--case", "norm", "--out", "{user}/d"),
        "d: holds 'notes.txt' and no artifacts manifest",
        write_file("d/notes.txt"),
    ),
    verify_gg(  # its models go to DIR/generation: DIR is held to an artifacts folder's rule
        "verify-generation-artifacts-among-a-users-files",
        "art: holds 'notes.txt' and no artifacts manifest",
        then(copy_generation_golden, write_file("art/notes.txt")),
    ),
    Planted(  # its models go to DIR/doc/CONFIG: DIR is held to an artifacts folder's rule
        "doc-artifacts-among-a-users-files",
        ("doc", "--artifacts", "{user}/d"),
        "d: holds 'notes.txt' and no artifacts manifest",
        write_file("d/notes.txt"),
    ),
    Planted(
        "export-over-a-manifest-with-models",  # another tool's, with a "models" key
        ("export", "--case", "norm", "--out", "{user}/d"),
        "d/manifest.json: neither a golden nor an artifacts manifest",
        write_file("d/manifest.json", '{"tool": "other-tool", "models": {}}'),
    ),
    Planted(
        "export-among-a-users-files-in-case-named-folders",
        ("export", "--case", "norm", "--out", "{user}/d"),
        "d: holds 'doc' and no artifacts manifest",
        then(write_file("d/doc/thesis.tex"), write_file("d/norm/notes.txt")),
    ),
    Planted(
        "export-staging-holds-a-users-folder-named-like-an-export",
        ("export", "--case", "norm", "--out", "{user}/art"),
        "norm.mynotes1: not an export tconform staged",
        then(artifacts_folder, write_file("art/.tconform-staging/norm.mynotes1/thesis.txt")),
        writes=("user/.art.lock",),
    ),
    Planted(
        "export-force-through-a-symlinked-case-folder",  # it replaced the other case's model
        ("export", "--case", "norm", "--out", "{user}/art", "--force"),
        "art/norm: a symbolic link",
        then(
            artifacts_folder,
            make_folder("art/feed_forward"),
            symlink("art/norm", "{user}/art/feed_forward"),
        ),
        writes=("user/.art.lock",),
    ),
    Planted(
        "check-default-out-through-a-symlinked-area",
        ("check", T()),
        "artifacts/check: a symbolic link (check's export folder, --out (bench: --artifacts))",
        then(make_folder("artifacts"), symlink("artifacts/check", "{outside}")),
    ),
    Planted(
        "export-staging-holds-a-users-file",  # was deleted with the staging folder
        ("export", "--case", "norm", "--out", "{user}/art"),
        "important.txt: not an export tconform staged",
        then(artifacts_folder, write_file("art/.tconform-staging/important.txt")),
        writes=("user/.art.lock",),
    ),
    Planted(
        "export-out-a-symlink",  # was followed: the models landed where it leads
        ("export", "--case", "norm", "--out", "{user}/link"),
        "link: a symbolic link (an artifacts folder)",
        symlink("link", "{outside}"),
    ),
    Planted(
        "check-out-a-symlink",
        ("check", T(), "--out", "{user}/link"),
        "link: a symbolic link (check's export folder, --out (bench: --artifacts))",
        symlink("link", "{outside}"),
    ),
    Planted(
        "runtime-cache-in-a-golden-folder",  # environments of 160 MB were made inside it
        VERIFY_A_RELEASE,
        "(TCONFORM_RUNTIME_CACHE) is or lies in",
        copy_golden,
        env=(("TCONFORM_RUNTIME_CACHE", "g/envs"),),
        writes=("user/.g.lock",),
    ),
    Planted(
        "runtime-cache-a-symlink",
        VERIFY_A_RELEASE,
        "envs: a symbolic link (TCONFORM_RUNTIME_CACHE)",
        then(copy_golden, symlink("envs", "{outside}")),
        env=(("TCONFORM_RUNTIME_CACHE", "envs"),),
        writes=("user/.g.lock",),
    ),
    Planted(  # doc's models go to DIR/doc/CONFIG: written through the link before
        "doc-artifacts-a-symlink",
        ("doc", "--no-torch", "--artifacts", "{user}/link"),
        "link: a symbolic link (an artifacts folder)",
        symlink("link", "{outside}"),
    ),
    Planted(  # verify --generation's models go to DIR/generation: the same
        "generation-artifacts-a-symlink",
        (*VERIFY_GG[:4], "--artifacts", "{user}/link", "--no-torch"),
        "link: a symbolic link (an artifacts folder)",
        then(copy_generation_golden, symlink("link", "{outside}")),
        writes=("user/.gg.lock",),
    ),
    Planted(  # ONNX Runtime wrote its device id there, and the goldens were broken for good
        "xdg-cache-in-a-golden-folder",
        ("verify", "--golden", "{user}/g", "--no-doc", "--case", "norm", "--no-torch"),
        "XDG_CACHE_HOME=",
        copy_golden,
        env=(("XDG_CACHE_HOME", "{user}/g/norm"),),
    ),
    Planted(  # ONNX Runtime's session file and every temporary copy would land there
        "tmpdir-in-a-golden-folder",
        ("verify", "--golden", "{user}/g", "--no-doc", "--case", "norm", "--no-torch"),
        "TMPDIR=",
        copy_golden,
        env=(("TMPDIR", "{user}/g"),),
    ),
    Planted(  # check's export folder holds only what it lists: the next check would refuse it
        "tmpdir-in-checks-export-folder",
        ("check", T(), "--out", "{user}/e"),
        "TMPDIR=",
        env=(("TMPDIR", "{user}/e/tmp"),),
    ),
    Planted(  # tempfile passes over a TMPDIR it cannot use, to TMP
        "tmp-in-a-golden-folder-behind-a-missing-tmpdir",
        ("verify", "--golden", "{user}/g", "--no-doc", "--case", "norm", "--no-torch"),
        "TMP=",
        copy_golden,
        env=(("TMPDIR", "{user}/missing"), ("TMP", "{user}/g")),
    ),
    Planted(
        "verify-json-in-artifacts-dot",  # the current folder as --artifacts: a report in it
        ("verify", "--golden", "{user}/g", "--artifacts", ".", "--no-doc", "--case", "norm"),
        "the --artifacts folder of this run",
        copy_golden,
        json="{user}/r.json",
    ),
    Planted(
        "check-json-in-out-dot",
        ("check", T(), "--out", "."),
        "the --out folder of this run",
        json="{user}/r.json",
    ),
    Planted(
        "artifacts-staging-a-symlink",
        ("export", "--case", "norm", "--out", "{user}/art"),
        "not a folder tconform stages its exports in (a link",
        then(artifacts_folder, symlink("art/.tconform-staging", "{outside}")),
        writes=("user/.art.lock",),
    ),
    # --- manifests: what sizes a run stays within the presets; names are names -------------
    Planted(  # (verify takes its shared lock beside the golden folder: .g.lock, its own)
        "golden-config-huge",
        ("verify", "--golden", "{user}/g", "--no-doc", "--case", "norm"),
        "d_model 1048576 is larger than any preset's",
        edited_golden(lambda m: m["config"].update(d_model=2**20, n_heads=4)),
        writes=("user/.g.lock",),
    ),
    Planted(
        "golden-vocabulary-huge",
        ("verify", "--golden", "{user}/g", "--no-doc"),
        "src_vocab",
        edited_golden(lambda m: m["config"].update(src_vocab=10**9)),
        writes=("user/.g.lock",),
    ),
    Planted(
        "golden-preset-not-its-config",
        ("verify", "--golden", "{user}/g", "--no-doc"),
        "'preset' 'base' is not a preset whose config",
        edited_golden(lambda m: m.update(preset="base")),
        writes=("user/.g.lock",),
    ),
    Planted(
        "golden-preset-unknown",
        ("golden", "--check", "--out", "{user}/g"),
        "'preset'",
        edited_golden(lambda m: m.update(preset="../tiny")),
    ),
    Planted(
        "golden-case-a-path",
        ("verify", "--golden", "{user}/g", "--no-doc"),
        "is not a case this tconform knows",
        edited_golden(lambda m: m["cases"].update({"../../outside": m["cases"]["norm"]})),
        writes=("user/.g.lock",),
    ),
    Planted(
        "golden-file-a-path",
        ("verify", "--golden", "{user}/g", "--no-doc", "--case", "norm"),
        "file name is not valid",
        edited_golden(
            lambda m: m["cases"]["norm"]["sha256"].update(
                {"../../../outside/weights.json": "0" * 64}
            )
        ),
        writes=("user/.g.lock",),
    ),
    Planted(
        "golden-norm-a-symlink-out",
        ("verify", "--golden", "{user}/g", "--no-doc", "--case", "norm"),
        "a symlink that leads outside",
        then(
            copy_golden,
            lambda ws: __import__("shutil").move(ws["user"] / "g" / "norm", ws["outside"] / "norm"),
            symlink("g/norm", "{outside}/norm"),
        ),
        writes=("user/.g.lock",),
    ),
    Planted(
        "golden-late-file-corrupt",
        ("verify", "--golden", "{user}/g", "--no-doc"),
        "output_1.pb: sha256 differs",
        then(copy_golden, write_file("g/transformer/test_data_set_2/output_1.pb", "corrupt")),
        writes=("user/.g.lock",),
    ),
    Planted(
        "artifacts-config-huge",
        ("export", "--case", "norm", "--out", "{user}/art"),
        "larger than any preset's",
        lambda ws: write_file(
            "art/manifest.json",
            json.dumps(
                {
                    "kind": "tconform-artifacts",
                    "config": {
                        **json.loads((REPO / "golden" / "manifest.json").read_text())["config"],
                        "n_layers": 10**6,
                    },
                    "models": {},
                }
            ),
        )(ws),
        writes=("user/.art.lock",),
    ),
    Planted(
        "artifacts-checkpoint-a-path",
        ("export", "--case", "norm", "--out", "{user}/art"),
        "is not one of the checkpoints",
        then(
            artifacts_folder,
            write_file(
                "art/manifest.json",
                json.dumps(
                    {"kind": "tconform-artifacts", "checkpoint": "/etc/passwd", "models": {}}
                ),
            ),
        ),
        writes=("user/.art.lock",),
    ),
    # --- one line, whatever a name holds ------------------------------------------------------
    Planted(
        "newline-in-a-model-path",
        ("check", T(), "--model", "{user}/x\ny.onnx"),
        "x\\ny.onnx: no such file",
    ),
    Planted(
        "newline-in-a-verify-model",
        ("verify", "--golden", "{golden}", "--no-doc", "--model", "norm={user}/x\ny.onnx"),
        "x\\ny.onnx",
    ),
    Planted(
        "line-separator-in-a-report", COMMANDS["verify"], "folder", json="{user}/n\u2028o/r.json"
    ),
    Planted("newline-in-a-target", ("check", "a\nb:make"), "expected PACKAGE.MODULE:FACTORY"),
    Planted("target-a-path", ("check", "a/../../x:make"), "expected PACKAGE.MODULE:FACTORY"),
    Planted("target-dotted-factory", ("check", "pkg.mod:a.b"), "expected PACKAGE.MODULE:FACTORY"),
    Planted("target-empty-part", ("check", "pkg..mod:make"), "expected PACKAGE.MODULE:FACTORY"),
    Planted(
        "verify-model-name-256",
        ("verify", "--golden", "{golden}", "--no-doc", "--model", "norm={user}/" + "m" * 256),
        "the file system takes at most 255",
    ),
    # --- path lengths: refused by the shared option types, before anything opens them -------
    *(
        Planted(
            f"json-name-{length}-{command}",
            COMMANDS[command],
            says,
            json="{user}/" + "r" * length + ".json",
        )
        for command in ("verify", "check", "doc", "bench", "merge")
        for length, says in (
            (251, "the file system takes at most 255"),
            (250, "names it writes are at most 237 bytes"),
            (233, "names it writes are at most 237 bytes"),
        )
    ),
    Planted(
        "json-path-over-path-max",
        COMMANDS["verify"],
        "the file system takes paths below 4096",
        json="{user}/" + "/".join(["d" * 200] * 21) + "/r.json",
    ),
    *(
        Planted(f"folder-name-{length}-{option}", args, says)
        for length, says in (
            (256, "the file system takes at most 255"),
            (238, "names it writes are at most 237 bytes"),
        )
        for option, args in (
            ("export-out", ("export", "--case", "norm", "--out", "{user}/" + "o" * length)),
            ("golden-out", ("golden", "--case", "norm", "--out", "{user}/" + "o" * length)),
            ("verify-golden", ("verify", "--no-doc", "--golden", "{user}/" + "o" * length)),
            ("verify-artifacts", ("verify", "--no-doc", "--artifacts", "{user}/" + "o" * length)),
            ("doc-artifacts", ("doc", "--artifacts", "{user}/" + "o" * length)),
            ("bench-artifacts", ("bench", "--artifacts", "{user}/" + "o" * length)),
            ("check-out", ("check", T(), "--out", "{user}/" + "o" * length)),
            ("check-repro", ("check", T(), "--repro", "{user}/" + "o" * length)),
            (
                "verify-golden-generation",
                ("verify", "--generation", "--golden-generation", "{user}/" + "o" * length),
            ),
        )
    ),
    *(  # a folder whose path fits, but not what tconform writes in it (staged models, goldens)
        Planted(f"folder-without-room-inside-{option}", args, "for what it writes in it")
        for option, args in (
            ("export-out", ("export", "--case", "norm", "--out", "{user}/" + DEEP)),
            ("golden-out", ("golden", "--case", "norm", "--out", "{user}/" + DEEP)),
        )
    ),
    *(
        Planted(f"read-path-over-path-max-{option}", args, "the file system takes paths below 4096")
        for option, args in (
            ("merge", ("report", "merge", "{user}/" + "/".join(["d" * 200] * 21))),
            (
                "bench-compare",
                ("bench", "--compare", "{user}/" + "/".join(["d" * 200] * 21), "{user}/notes.txt"),
            ),
            ("check-model", ("check", T(), "--model", "{user}/" + "/".join(["d" * 200] * 21))),
            ("check-inputs", ("check", T(), "--inputs", "{user}/" + "/".join(["d" * 200] * 21))),
        )
    ),
    Planted(
        "read-name-256-check-model",
        ("check", T(), "--model", "{user}/" + "m" * 256),
        "the file system takes at most 255",
    ),
    verify_gg(
        "generation-shape-not-sizes",
        "shape of 'tokens'",
        lambda ws: copy_generation_golden(
            ws, lambda m: [e["shapes"].update(tokens=["3"]) for e in m["cases"].values()]
        ),
    ),
]


def _fill_planted(args: tuple[str, ...], ws: dict[str, Path]) -> list[str]:
    values = {"user": ws["user"], "outside": ws["outside"], "golden": REPO / "golden"}
    return [arg.format(**values) for arg in args]


@pytest.mark.parametrize("case", PLANTED, ids=[c.id for c in PLANTED])
def test_planted_input_is_refused_first_and_touches_nothing(cli, ws, monkeypatch, case):
    root = ws["user"].parent
    ws = {**ws, "outside": root / "outside"}
    ws["outside"].mkdir()
    (ws["outside"] / "weights.json").write_text('{"config": {}, "sha256": "0"}\n')
    if case.plant is not None:
        case.plant(ws)
    for name, value in case.env:
        monkeypatch.setenv(name, _fill_planted((value,), ws)[0])
    report = ws["reports"] / ("r.md" if case.json else "r.json")
    reports = (
        ["--markdown", str(report), "--json", case.json] if case.json else ["--json", str(report)]
    )
    takes_reports = case.args[0] not in NO_REPORTS
    before = tree(root)
    code, out, err = cli(*_fill_planted((*case.args, *reports[: 4 * takes_reports]), ws))
    assert code == case.code, out + err
    if takes_reports:
        assert_one_line(code, out, err, case.says)
    else:  # export and golden say what they do as they go (no -q): their last line is the error
        assert "Traceback" not in out + err
        assert err.strip().splitlines()[-1].startswith("tconform: error: "), err
        assert case.says in err.strip().splitlines()[-1], err
    if case.json:
        assert f"(exit {code})" in report.read_text() and case.says in report.read_text()
    elif takes_reports:
        data = strict_json(report)
        assert data["exit_code"] == code and data["error"]["exit_code"] == code
    after = tree(root)
    allowed = {report.relative_to(root).as_posix(), *case.writes}
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed <= allowed, sorted(changed - allowed)


def _scaled_last_layer(exported: Path, bad: Path) -> None:
    """The exported two-layer model with its last Linear's weight scaled by 1.5."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(exported))
    (weight,) = [i for i in model.graph.initializer if i.name.endswith("2.weight")]
    scaled = numpy_helper.to_array(weight) * np.float32(1.5)
    weight.CopyFrom(numpy_helper.from_array(scaled.astype(np.float32), weight.name))
    onnx.save(model, str(bad))


def test_repro_replaces_only_its_own_bundle_and_refuses_anything_else_before_the_run(cli, ws):
    """A failing check writes its bundle, and a second run replaces it (nothing left beside
    it); once the user adds a note, the next run is refused before anything runs."""
    user = ws["user"]
    assert cli("check", T("two_layers"), "--out", "exp", "-q", "--runtime", "onnxruntime")[0] == 0
    _scaled_last_layer(user / "exp" / "model.onnx", user / "bad.onnx")
    report = ws["reports"] / "r.json"
    args = ("check", T("two_layers"), "--model", "bad.onnx", "--runtime", "onnxruntime",
            "--repro", "b", "-q", "--json", str(report))  # fmt: skip
    for _ in range(2):
        code, out, err = cli(*args)
        assert code == 1, out + err
        assert "repro bundle: b (python b/reproduce.py)" in out
        listed = json.loads((user / "b" / "bundle.json").read_text())["files"]
        assert {*listed, "bundle.json"} == {
            p.relative_to(user / "b").as_posix() for p in (user / "b").rglob("*") if p.is_file()
        }
        assert not [p.name for p in user.iterdir() if p.name.startswith(".b.")]
    (user / "b" / "NOTES.md").write_text("what I found\n")
    before = tree(ws["user"].parent)
    code, out, err = cli(*args)
    assert code == EXIT_USAGE
    assert_one_line(code, out, err, "b/NOTES.md: not a file tconform check --repro wrote")
    data = strict_json(report)
    assert data["results"] == [] and data["error"]["exit_code"] == EXIT_USAGE  # nothing ran
    after = tree(ws["user"].parent)
    assert {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} == {
        report.relative_to(ws["user"].parent).as_posix()
    }


def test_processes_spawned_from_the_check_never_import_the_users_tconform(ws, tmp_path):
    """The current folder holds a package named tconform (on the path first, for the user's
    package): what the user's code spawns does not import it, nor run tconform's entry script
    (the console script here, as a user starts it: its folder first on the path, not the
    current one)."""
    (ws["user"] / "tconform").mkdir()
    (ws["user"] / "tconform" / "__init__.py").write_text('raise ImportError("the user\'s own")\n')
    entry = tmp_path / "bin" / "tconform-entry.py"
    entry.parent.mkdir()
    entry.write_text('from tconform.cli import main\nif __name__ == "__main__":\n    main()\n')
    report = ws["reports"] / "r.json"
    done = subprocess.run(
        [sys.executable, str(entry), "check", T("spawns"), "--runtime", "onnxruntime", "-q",
         "--json", str(report)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and not done.stderr.strip(), done.stderr
    assert strict_json(report)["exit_code"] == 0


def test_spawned_children_start_from_a_path_that_finds_this_tconform(tmp_path, monkeypatch):
    """A folder named tconform first on the path (a package, or a bare folder: a namespace
    package): tconform's own children start with this tconform's folder ahead of it."""
    from importlib.machinery import PathFinder

    import tconform
    from tconform.spawning import children_import_this_tconform

    for package in (True, False):
        shadow = tmp_path / str(package)
        (shadow / "tconform").mkdir(parents=True)
        if package:
            (shadow / "tconform" / "__init__.py").write_text("")
        monkeypatch.setattr(sys, "path", [str(shadow), *sys.path])
        assert PathFinder.find_spec("tconform", sys.path).origin != tconform.__file__
        with children_import_this_tconform():
            found = PathFinder.find_spec("tconform", sys.path)
            assert Path(found.origin).resolve() == Path(tconform.__file__).resolve()
        assert sys.path[0] == str(shadow)  # as it was


@pytest.mark.parametrize("variable", ["HOME", "XDG_CACHE_HOME"])
def test_a_cache_folder_in_a_golden_folder_is_refused_before_anything_writes_there(ws, variable):
    """In a process of its own, so that nothing tconform imports can write first: ONNX
    Runtime's telemetry wrote its device id under $XDG_CACHE_HOME (else ~/.cache) as it was
    imported, inside the golden folder HOME named, and the refusal came after it."""
    golden = copy_golden(ws)
    before = tree(golden)
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "HOME")}
    env[variable] = str(golden)
    done = subprocess.run(
        [sys.executable, "-m", "tconform", "verify", "--golden", str(golden), "--no-doc",
         "--case", "norm", "--no-torch", "--json", str(ws["reports"] / "r.json")],
        capture_output=True, text=True, timeout=300, env={**env, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == EXIT_USAGE, done.stdout + done.stderr
    assert f"{variable}=" in done.stderr and "Traceback" not in done.stderr
    assert tree(golden) == before


def test_a_factory_that_changes_folder_leaves_the_paths_given_where_they_were(cli, ws):
    """--out is relative to the folder tconform started in, not to one the factory moved to:
    the export goes where the user named, and nothing lands in the other folder."""
    code, out, err = cli("check", T("moves_away"), "--no-shapes", "--out", "ex", "-q")
    assert code == 0, out + err
    assert (ws["user"] / "ex" / "model.onnx").is_file()
    assert not any(ws["reports"].iterdir())
