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
