"""What an exporter's failure says, in one line (tconform.export.exporter)."""

from __future__ import annotations

import pytest

from tconform.export.exporter import exporter_error_line

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("message", "line"),
    [
        ("banner\n\n<class 'ValueError'>: no such op\nmore", "<class 'ValueError'>: no such op"),
        # a line that introduces what follows keeps the next line: it ended in a dangling ':'
        (
            "banner\n<class 'ValueError'>: conflicts found:\n- dim 1 is static 8\n- more",
            "<class 'ValueError'>: conflicts found: - dim 1 is static 8",
        ),
        ("first line\nsecond", "first line"),
    ],
)
def test_the_line_that_says_what_went_wrong(message, line):
    assert exporter_error_line(RuntimeError(message)) == line
