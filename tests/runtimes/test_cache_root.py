"""Where versioned runtimes' environments are kept: a variable that points nowhere usable is
one line naming it."""

from __future__ import annotations

import pytest

from tconform.errors import UsageError
from tconform.runtimes.environments import cache_root

pytestmark = pytest.mark.unit


def test_xdg_cache_home_that_is_a_file_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("TCONFORM_RUNTIME_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "tconform" / "runtimes"
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    with pytest.raises(UsageError, match=r"XDG_CACHE_HOME=.*: not a folder"):
        cache_root()


def test_a_cache_under_a_file_is_named_by_its_variable(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("TCONFORM_RUNTIME_CACHE", str(tmp_path / "afile" / "sub"))
    with pytest.raises(UsageError, match=r"\(TCONFORM_RUNTIME_CACHE\): .*afile is not a folder"):
        cache_root()


@pytest.mark.parametrize(
    ("names", "says"),
    [
        (("a" * 300,), "TCONFORM_RUNTIME_CACHE=.*: must be a folder's path the system can take"),
        (("a" * 20, "b" * 250), "TCONFORM_RUNTIME_CACHE: .*a name of 250 bytes"),
    ],
)
def test_a_cache_path_too_long_for_the_file_system_is_named_by_its_variable(
    tmp_path, monkeypatch, names, says
):
    """It was `File name too long` alone, naming neither the variable nor the limit."""
    monkeypatch.setenv("TCONFORM_RUNTIME_CACHE", str(tmp_path.joinpath(*names)))
    with pytest.raises(UsageError, match=says):
        cache_root()


@pytest.mark.parametrize("inner", [".locks", ".installers"])
def test_a_link_planted_inside_the_cache_is_refused(tmp_path, monkeypatch, inner):
    """The makers' locks and the installers' caches are written inside the cache folder: a link
    at their name would have tconform create files wherever it leads."""
    elsewhere = tmp_path / "victim"
    elsewhere.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / inner).symlink_to(elsewhere)
    monkeypatch.setenv("TCONFORM_RUNTIME_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UsageError, match=rf"cache/\{inner}: a symbolic link"):
        cache_root()
    assert list(elsewhere.iterdir()) == []


def test_a_reused_environment_changed_since_it_was_made_is_refused(tmp_path, monkeypatch):
    """An environment whose runtime was replaced after tconform made it (another release
    installed over it) would run that release under the spec's name: refused, in one line
    naming the folder and the way on; one as it was made is reused."""
    from tconform.runtimes import environments
    from tconform.runtimes.specs import parse_spec

    spec = parse_spec("onnxruntime==1.20.1")
    made = environments.Environment(
        tmp_path / "bin" / "python", {"onnxruntime": "1.20.1", "numpy": "2.4.6"}, "3.11.7",
        "uv 0.13.9", tmp_path,
    )  # fmt: skip
    installed = {"onnxruntime": {"onnxruntime": "1.31.1"}, "numpy": {"numpy": "2.4.6"}}
    monkeypatch.setattr(environments, "probe", lambda *args: ("3.11.7", installed))
    with pytest.raises(UsageError, match=r"holds onnxruntime 1\.31\.1, not the 1\.20\.1 it was"):
        environments._require_as_made(spec, made, "onnxruntime", "onnxruntime")
    installed["onnxruntime"] = {"onnxruntime": "1.20.1"}
    environments._require_as_made(spec, made, "onnxruntime", "onnxruntime")


def test_a_link_planted_at_a_makers_lock_is_named_and_never_followed(tmp_path):
    """It was the system's `Too many levels of symbolic links`, naming no way on."""
    from tconform.runtimes import environments

    victim = tmp_path / "victim"
    victim.write_text("mine")
    (tmp_path / environments.LOCKS).mkdir()
    (tmp_path / environments.LOCKS / "key.lock").symlink_to(victim)
    with (
        pytest.raises(UsageError, match=r"key\.lock: the lock's name is a symbolic link"),
        environments._locked(tmp_path, "key", print),
    ):
        pass
    assert victim.read_text() == "mine"
