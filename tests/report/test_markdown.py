"""The markdown summary keeps one row per case and runtime, yet names the input sets checked
and every result that did not pass: a failing set (batch consistency) never hides in it."""

from __future__ import annotations

import pytest

from tconform.report import RunReport
from tconform.report.markdown import build
from tconform.results import Result

pytestmark = pytest.mark.unit


def _result(input_set: str, status: str, message: str = "") -> Result:
    return Result(
        "pkg.mod:make", "module", "onnxruntime", "cpu", ["cpu"], input_set, status, message
    )


def test_a_failing_input_set_is_named_in_the_row_and_listed_with_its_reason():
    report = RunReport("check")
    report.results = [
        _result("example", "pass"),
        _result("batch-consistency", "fail", "row 1 of the batch differs from its run alone"),
        _result("seq-4", "pass"),
    ]
    text = build(report)
    (row,) = [line for line in text.splitlines() if line.startswith("| pkg.mod:make")]
    assert "| batch-consistency |" in row and "| fail |" in row
    assert "Input sets: example, batch-consistency, seq-4." in text
    not_passed = text.split("### Not passed", 1)[1]
    assert "batch-consistency: fail: row 1 of the batch differs" in not_passed
    assert "example" not in not_passed and "seq-4" not in not_passed


def test_a_run_that_passed_lists_no_failures():
    report = RunReport("check")
    report.results = [_result("example", "pass"), _result("batch-consistency", "pass")]
    text = build(report)
    assert "### Not passed" not in text and "batch-consistency" in text


def test_a_name_holding_a_newline_a_bar_or_an_escape_stays_in_its_cell():
    """A case or file name is a name: it never starts a row of its own, splits a cell, or
    sends a terminal escape, in the markdown summary or the terminal table."""
    from tconform.report import table

    hostile = "norm\n| FAKE | pass |\x1b[31m"
    report = RunReport("verify")
    report.results = [
        Result(hostile, "module", "onnxruntime", "cpu", ["cpu"], "example", "fail", "bad\nrow")
    ]
    for text in (build(report), table.render(report.results)):
        assert "\x1b" not in text and "\n| FAKE" not in text and "\nrow" not in text
        assert "norm\\n" in text and "\\x1b[31m" in text
    (row,) = [line for line in build(report).splitlines() if line.startswith("| norm")]
    assert row.count(" | ") == 7  # eight cells: the name's bars are escaped


def test_where_two_localised_releases_part_is_in_the_markdown():
    report = RunReport("check")
    report.results = [_result("example", "pass")]
    verdict = "ort-cpu==1.20.1 and ort-cpu part first at ln (LayerNorm), module call 2"
    report.details["version_partings"] = [{"verdict": verdict}]
    text = build(report)
    versions = text.split("### Versions of a runtime", 1)[1]
    assert f"- where they part: {verdict}" in versions


def test_a_message_holding_a_lone_surrogate_is_written_escaped_in_markdown_and_plot(tmp_path):
    """A user's exception or a file name can carry a lone surrogate (an undecodable byte), which
    UTF-8 cannot hold and no font draws: the markdown and the plot hold its escape sequence."""
    from tconform.report import markdown, plot

    report = RunReport("check")
    report.error = {"message": "the factory: ValueError: x\ud800y in_\udcff.npz", "exit_code": 2}
    markdown.write(tmp_path / "r.md", report)
    assert "x\\ud800y in_\\udcff.npz" in (tmp_path / "r.md").read_text(encoding="utf-8")
    plot.write(tmp_path / "r.png", report)
    assert plot.is_own(tmp_path / "r.png")
