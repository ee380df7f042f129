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

def os_exit_0():
    os._exit(0)

def generator_exit():
    raise GeneratorExit

class NoElements(nn.Module):
    def forward(self, x):
        return x[:, :0] * 2

def no_elements():
    return NoElements(), torch.randn(2, 4)

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
    # --- files: refused before they are opened ----------------------------------------------
    Hostile("model-fifo", ("check", T(), "--model", "{fifo}"), "not a regular file"),
    Hostile("model-dev-zero", ("check", T(), "--model", "/dev/zero"), "not a regular file"),
    Hostile("model-folder", ("check", T(), "--model", "{user}/folder"), "is a folder"),
    Hostile("model-missing", ("check", T(), "--model", "{user}/gone.onnx"), "no such file"),
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
    Hostile("graph-opt-list", ("bench", "--graph-opt", "basic,all"), "--graph-opts"),
    Hostile("provider-option", ("verify", "--provider-option", "novalue"), "KEY=VALUE"),
    # --- user code that ends the check's process: one line, never exit 0 --------------------
    Hostile("factory-sys-exit", ("check", T("exits_0")), "called sys.exit(0)", subprocess=True),
    Hostile("factory-os-exit", ("check", T("os_exit_0")), "exited with status 0", subprocess=True),
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


def test_an_output_with_no_element_is_nothing_checked_and_says_so(cli, ws):
    report = ws["reports"] / "r.json"
    code, out, err = cli("check", T("no_elements"), "-q", "--json", str(report))
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
    assert strict_json(report)["error"] == {"message": "interrupted", "exit_code": code}
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive  # the check's process ended with the command
    assert_unchanged(ws["user"], before)


def test_a_signal_during_bench_writes_its_reports(ws):
    report, markdown = ws["reports"] / "b.json", ws["reports"] / "b.md"
    process = _start(
        ["bench", "--preset", "tiny", "--case", "transformer", "--shape", "1x4", "--ep", "cpu",
         "--artifacts", str(ws["user"] / "bench"), "--json", str(report),
         "--markdown", str(markdown)],
    )  # fmt: skip
    # Mid-run: once the export pool is up (its first model done). A Ctrl-C while the pool
    # spawns its workers can be lost (export/pool.py says why); a loaded machine widens that.
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
