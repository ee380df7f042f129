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
    assert done.stdout.strip() in ("True", "False"), done.stdout + done.stderr
    return done.stdout.strip() == "True"


@pytest.mark.unit
def test_the_command_lines_runtime_options_import_no_torch(tmp_path):
    code = """
        import sys
        from tconform.runtimes import declared_options
        declared_options()
        print("torch" in sys.modules)
    """
    assert not _imports_torch(code, tmp_path)


@pytest.mark.integration
def test_the_check_parent_never_imports_torch(tmp_path):
    """The check of a factory that exits at once: the child imports torch, the parent not."""
    (tmp_path / "ends_early.py").write_text("import sys\n\ndef make():\n    sys.exit(0)\n")
    code = """
        import sys
        from tconform.cli import main
        try:
            main(["check", "ends_early:make", "-q"])
        except SystemExit as exc:
            assert exc.code == 2, exc.code
        print("torch" in sys.modules)
    """
    assert not _imports_torch(code, tmp_path)
