"""JUnit XML stays XML whatever a message holds, and stays tconform's own to replace."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tconform.report import RunReport
from tconform.report.junit import is_own, write
from tconform.results import Result

pytestmark = pytest.mark.unit


def test_control_characters_in_a_message_or_a_name_are_written_escaped(tmp_path):
    """A user's exception text with a terminal colour code, and an input set name from a
    crafted shard, made a file no parser read, which tconform then refused to replace."""
    report = RunReport("check")
    report.results = [
        Result(
            "pkg.mod:make", "module", "torch", "cpu", ["cpu"], "\u202e\x1b[31mRED\n", "error",
            "RuntimeError: boom \x1b[31mred\x0c\x01 end",
        )
    ]  # fmt: skip
    path = tmp_path / "r.xml"
    write(path, report)
    (error,) = ET.parse(path).getroot().iter("error")
    assert error.get("message") == "RuntimeError: boom \\x1b[31mred\\x0c\\x01 end"
    assert is_own(path)
