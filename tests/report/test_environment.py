"""The environment block every report carries (tconform.report.environment)."""

from __future__ import annotations

import json

import pytest

from tconform.folders import GOLDEN
from tconform.report import environment

pytestmark = pytest.mark.unit


def test_no_provider_is_probed_while_the_temporary_folder_lies_in_a_golden_folder(
    tmp_path, monkeypatch
):
    """Outsider's finding: with TMPDIR in a golden folder and a report asked for, the error
    report's provider probe made (and removed) a temporary file in the goldens before the one
    line refused TMPDIR. The probe's log goes to a temporary file: none is made there."""
    golden = tmp_path / "g"
    golden.mkdir()
    (golden / "manifest.json").write_text(json.dumps({"kind": GOLDEN}))
    monkeypatch.setenv("TMPDIR", str(golden))

    def probed(ep):
        raise AssertionError(f"{ep} probed with the temporary folder in the goldens")

    monkeypatch.setattr("tconform.runtimes.providers.unavailable_reason", probed)
    found = environment.providers()
    assert found["providers_running"] == []
    assert set(found["providers_not_running"].values()) == {
        "not probed: the temporary folder is refused"
    }
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # a folder of its own: probed as ever
    with pytest.raises(AssertionError, match="probed with the temporary folder"):
        environment.providers()
