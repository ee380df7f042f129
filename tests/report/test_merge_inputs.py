"""report merge refuses what is not a shard of a verify run, in one line (no run needed)."""

from __future__ import annotations

import json

import pytest

from tconform.errors import UsageError
from tconform.report.merge import _missing_shards, read_shard

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ({"tool": "tconform", "command": "verify", "results": [],
          "settings": {"golden_generation": "golden-generation"}}, "are not sharded"),
        ({"tool": "tconform", "command": "bench", "results": []}, "not of verify"),
        ({"tool": "tconform", "command": "verify", "results": [], "settings": {}},
         "records no work units"),
        ([1, 2], "not a tconform JSON report"),
    ],
)  # fmt: skip
def test_read_shard_refuses_with_the_reason(tmp_path, content, says):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(content))
    with pytest.raises(UsageError, match=says):
        read_shard(path)


def test_missing_shards_are_named_when_the_reports_say_which_they_are():
    assert _missing_shards(["1/4", "3/4"]).startswith("no report of shard 2/4, 4/4")
    assert _missing_shards(["1/2", None]) == "the reports hold shards 1/2, None"
