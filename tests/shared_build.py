"""Folders a whole test run builds once and shares, also across pytest-xdist's workers (the
goldens and exports the session fixtures make take a minute or two each: built twice, they
would cost what running on two cores saves)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def built_once(tmp_path_factory, name: str) -> Iterator[tuple[Path, bool]]:
    """A folder the whole test run shares, also across pytest-xdist's workers (their common
    base folder), held under a lock: (folder, whether it still has to be built). The block
    builds it where asked; the folder counts as built once the block ends without an error."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the folder all workers' base folders lie in
    folder = base / name
    folder.mkdir(exist_ok=True)
    with open(base / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = base / f".{name}.built"  # beside it: tconform refuses a file it did not write
        yield folder, not done.exists()
        done.touch()
