"""Folders tconform writes whole: what counts as a bundle it wrote, as it wrote it."""

from __future__ import annotations

import hashlib
import json

import pytest

from tconform.folders import BUNDLE_MARKER, BUNDLE_TOOL, not_written_whole

pytestmark = pytest.mark.unit


def _bundle(folder, tool: str) -> None:
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"graph")
    digest = hashlib.sha256(b"graph").hexdigest()
    marker = {"tool": tool, "files": {"model.onnx": digest}}
    (folder / BUNDLE_MARKER).write_text(json.dumps(marker))


@pytest.mark.parametrize("tool", [BUNDLE_TOOL, "tconform localise --repro"])
def test_a_bundle_of_this_or_an_earlier_release_is_tconforms_own(tmp_path, tool):
    _bundle(tmp_path / "b", tool)  # the earlier release named the marker's tool so
    assert not_written_whole(tmp_path / "b", BUNDLE_MARKER, BUNDLE_TOOL) is None


def test_another_tools_marker_or_an_added_file_is_not(tmp_path):
    _bundle(tmp_path / "other", "somebody else's tool")
    assert "not written by" in not_written_whole(tmp_path / "other", BUNDLE_MARKER, BUNDLE_TOOL)
    _bundle(tmp_path / "b", BUNDLE_TOOL)
    (tmp_path / "b" / "NOTES.md").write_text("mine")
    assert "NOTES.md: not a file" in not_written_whole(tmp_path / "b", BUNDLE_MARKER, BUNDLE_TOOL)


def test_a_folder_written_whole_has_the_mode_mkdir_gives_it(tmp_path):
    """Made through a temporary folder (0700), it ends as any new folder would: umask's."""
    import os

    from tconform.folders import replace_whole

    def write(staging):
        (staging / "reproduce.py").write_text("print()\n")

    folder = replace_whole(tmp_path / "b", BUNDLE_MARKER, {"tool": BUNDLE_TOOL}, write, "--repro")
    os.mkdir(tmp_path / "plain")
    assert (folder.stat().st_mode & 0o777) == ((tmp_path / "plain").stat().st_mode & 0o777)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"config": {"norm_eps": 1' + "0" * 400 + "}}", "the integer 1000"),
        ('{"seed": -1' + "0" * 400 + "}", "the integer -1000"),
        ('{"message": "\\ud800"}', "a string holds a lone surrogate"),
        ('{"size": 1' + "0" * 5000 + "}", "ValueError"),  # beyond Python's digit limit
    ],
)
def test_json_no_tconform_file_holds_is_one_line_naming_the_file(tmp_path, text, says):
    """An integer no float can hold (it overflowed the config's checks, a report's figures
    and a bench comparison) and a lone surrogate (no report could be written with it) are
    refused where every tconform JSON file is read: manifests, records, reports."""
    from tconform.errors import UsageError
    from tconform.folders import read_json_manifest

    path = tmp_path / "manifest.json"
    path.write_text(text)
    with pytest.raises(UsageError, match=f"manifest.json: not a readable manifest file .*{says}"):
        read_json_manifest(path)


def test_a_reader_makes_no_lock_beside_a_folder_it_reads_and_takes_a_writers(tmp_path):
    """A shared lock on a folder no tconform run wrote (a copied golden folder) creates no
    `.NAME.lock` beside it; where a writer left one, the reader holds it."""
    import fcntl
    import os

    from tconform.folders import folder_lock, lock_path

    (tmp_path / "g").mkdir()
    with folder_lock(tmp_path / "g", shared=True):
        assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]
    with folder_lock(tmp_path / "g"):  # a writer makes it
        pass
    lock = lock_path(tmp_path / "g")
    with folder_lock(tmp_path / "g", shared=True):
        fd = os.open(lock, os.O_RDWR)
        with pytest.raises(BlockingIOError):  # held shared: no writer can have it
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)


@pytest.mark.parametrize("swap", ["folder", "link"])
def test_a_locked_folder_replaced_mid_run_is_never_written_into(tmp_path, swap):
    """Outsider's finding: an artifacts folder moved away during a verify, and a user's folder
    (their model.onnx and manifest.json) put in its place, had its files overwritten. A write
    under a folder this run locked checks first that it is still that folder."""
    from tconform.errors import Refused
    from tconform.export.artifacts import _made
    from tconform.files import atomic_write_json
    from tconform.folders import folder_lock

    ours = tmp_path / "art"
    ours.mkdir()
    users = {"model.onnx": b"the user's model", "manifest.json": b'{"theirs": 1}'}
    with folder_lock(ours):
        atomic_write_json(ours / "manifest.json", {"kind": "artifacts"})  # still ours: written
        ours.rename(tmp_path / "moved")
        if swap == "link":
            (tmp_path / "elsewhere").mkdir()
            ours.symlink_to(tmp_path / "elsewhere")
        else:
            ours.mkdir()
        for name, data in users.items():
            (ours / name).write_bytes(data)
        with pytest.raises(Refused, match="no longer the folder this run locked"):
            atomic_write_json(ours / "manifest.json", {"kind": "artifacts"})
        with pytest.raises(Refused, match="no longer the folder this run locked"):
            _made(ours / ".staging")
    assert {p.name: p.read_bytes() for p in ours.iterdir()} == users
    with folder_lock(tmp_path / "moved"):  # a later run locks the folder where it is now
        atomic_write_json(tmp_path / "moved" / "manifest.json", {"kind": "artifacts"})
    assert (tmp_path / "moved" / "manifest.json").is_file()
