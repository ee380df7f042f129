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
