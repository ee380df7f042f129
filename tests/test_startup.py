"""What a command costs before it does anything: the command line reads every runtime's options
without importing torch (2.5 s and more on a 2-core machine), and `check`, whose user code runs
in a child process, never imports it in the parent, so bad input and a user's model that ends
early answer in about a second plus the child's start."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _imports_torch(code: str, cwd) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    last = done.stdout.strip().splitlines()[-1:]  # after what the command printed
    assert last in (["True"], ["False"]), done.stdout + done.stderr
    return last == ["True"]


@pytest.mark.unit
def test_the_command_lines_runtime_options_import_no_torch(tmp_path):
    code = """
        import sys
        from tconform.runtimes import declared_options
        declared_options()
        print("torch" in sys.modules)
    """
    assert not _imports_torch(code, tmp_path)


@pytest.mark.unit
def test_a_bench_refused_for_its_options_writes_its_report_without_torch(tmp_path):
    code = """
        import sys
        from tconform.cli import main
        try:
            main(["bench", "pkg.mod:make", "--input-set", "nonsense", "--json", "r.json"])
        except SystemExit as exc:
            assert exc.code == 2, exc.code
        print("torch" in sys.modules)
    """
    assert not _imports_torch(code, tmp_path)
    assert "no input set" in (tmp_path / "r.json").read_text()


FACTORIES = """
import sys

import torch


def ends_early():
    sys.exit(0)


def linear():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2), (torch.randn(2, 4),)
"""


@pytest.mark.integration
@pytest.mark.parametrize(
    ("target", "code"), [("ends_early", 2), ("linear", 0)], ids=["ends-early", "passes"]
)
def test_the_check_parent_never_imports_torch(tmp_path, target, code):
    """The child imports torch, the parent not: when the factory exits at once, and when the
    check passes and its table is rendered."""
    (tmp_path / "factories.py").write_text(FACTORIES)
    script = f"""
        import sys
        from tconform.cli import main
        try:
            main(["check", "factories:{target}", "--exporter", "torchscript", "-q"])
        except SystemExit as exc:
            assert exc.code == {code}, exc.code
        print("torch" in sys.modules)
    """
    assert not _imports_torch(script, tmp_path)
