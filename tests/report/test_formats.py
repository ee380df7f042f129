"""Writing the reports: each path is checked again as it is written (what appeared there during
the run is left alone), and one that cannot be written does not stop the others, which say why."""

from __future__ import annotations

import json

import pytest

from tconform.errors import TconformError, UsageError
from tconform.report import RunReport, write_reports
from tconform.report import markdown as markdown_writer

pytestmark = pytest.mark.unit


def test_what_appeared_at_a_report_path_during_the_run_is_left_alone(tmp_path):
    paths = {
        "json": tmp_path / "r.json",
        "markdown": tmp_path / "r.md",
        "junit": tmp_path / "r.xml",
    }
    paths["markdown"].write_text("the user's notes\n")
    paths["json"].symlink_to(tmp_path / "elsewhere.json")  # dangling: exists() says no
    failed = write_reports(RunReport("check"), paths)
    assert set(failed) == {"json", "markdown"}
    assert all("appeared during the run" in line for line in failed.values())
    assert paths["markdown"].read_text() == "the user's notes\n"
    assert paths["json"].is_symlink() and not (tmp_path / "elsewhere.json").exists()
    assert "testsuite" in paths["junit"].read_text()  # the others are written
    assert not write_reports(RunReport("check"), {"junit": paths["junit"]})  # its own: replaced


def test_a_report_that_cannot_be_written_is_the_runs_error_in_the_others(tmp_path, monkeypatch):
    from tconform.commands.run import run_and_report

    def full_disk(path, report):
        raise UsageError(f"{path}: cannot write it (No space left on device)")

    monkeypatch.setattr(markdown_writer, "write", full_disk)
    paths = {"json": tmp_path / "r.json", "markdown": tmp_path / "r.md"}
    with pytest.raises(TconformError) as raised:  # a run that passed, but for its report
        run_and_report(RunReport("check"), lambda report, progress: None, True, paths)
    assert raised.value.exit_code == 2 and "r.md: cannot write it" in str(raised.value)
    error = json.loads(paths["json"].read_text())["error"]
    assert error["exit_code"] == 2 and "r.md: cannot write it" in error["message"]


def test_a_ctrl_c_python_swallowed_still_ends_the_run_with_its_code(tmp_path, monkeypatch):
    """A KeyboardInterrupt raised inside a weakref callback is printed and dropped by Python
    ("Exception ignored in ..."): the signal the handler recorded is raised again at the next
    progress line, so the run ends as interrupted (130, the reports say so), never 0."""
    import signal

    from tconform.commands import run as frame

    monkeypatch.setattr(frame, "received", [])
    lines = []

    def run(report, progress) -> None:
        frame.received.append(signal.SIGINT)  # as the handler records it, its raise lost
        progress("timing")
        lines.append("went on")

    paths = {"json": tmp_path / "r.json"}
    with pytest.raises(KeyboardInterrupt):
        frame.run_and_report(RunReport("bench"), run, True, paths)
    assert lines == []
    assert json.loads(paths["json"].read_text())["error"]["exit_code"] == 130
