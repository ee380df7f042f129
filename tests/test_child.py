"""The child process that runs a user's code (tconform.child)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit


def test_a_child_whose_parent_stopped_listening_ends_quietly(tmp_path):
    """A check interrupted while its child finishes: the parent has closed the pipe, and the
    child's outcome has no one to go to. It ends with exit 0 and writes nothing, where it used
    to print multiprocessing's traceback of the broken pipe into the user's terminal."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import multiprocessing, os
            from tconform.child import _child_main

            if __name__ == "__main__":
                context = multiprocessing.get_context("spawn")
                receive, send = context.Pipe(duplex=False)
                # divmod(message) raises: the child's outcome is an error to report
                child = context.Process(
                    target=_child_main, args=(send, os.getpid(), "the check", divmod, ())
                )
                child.start()
                receive.close()
                send.close()
                child.join(60)
                print(child.exitcode)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["0"], done.stdout + done.stderr
    assert done.stderr == ""
