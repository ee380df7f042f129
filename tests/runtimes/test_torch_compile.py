"""torch-compile leaves nothing behind: Inductor's generated code and precompiled headers go to a
folder of the process's own, removed as it ends, not to a torchinductor_USER folder kept in the
user's temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_a_compiled_run_leaves_the_temporary_folder_as_it_found_it(built, tmp_path):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    environment = {
        key: value for key, value in os.environ.items() if key != "TORCHINDUCTOR_CACHE_DIR"
    }
    environment["TMPDIR"] = str(temporary)
    arguments = ["--case", "feed_forward", "--golden", str(built["golden"]), "--no-doc"]
    done = subprocess.run(
        [sys.executable, "-m", "tconform", "verify", *arguments, "--runtime", "torch-compile"],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "torch-compile" in done.stdout
    assert list(temporary.iterdir()) == []
