"""Processes tconform spawns import this very tconform, whatever the current folder holds.

A spawned child (multiprocessing's spawn method, a fresh interpreter) starts from its parent's
sys.path, imports tconform from it again and runs the parent's entry script again. Where the
current folder is on that path (`tconform check` puts it first, to import the user's package
from it), a folder there named `tconform` (a package of the user's, or a results folder) would
be what the child imports: an ImportError traceback from the child, or a `tconform` without
`check`. So:

- tconform's own children (child.py's check process, export/pool.py's workers) start with the
  folder this tconform was imported from ahead of any such folder (`children_import_this_tconform`);
- a process that the user's code or a library spawns from the check's process (OpenVINO's
  telemetry does) does not run tconform's entry script again at all (`forget_entry_script`):
  it runs only what it was started for.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from importlib.machinery import PathFinder
from pathlib import Path


def _package_file() -> Path:
    return Path(__file__).resolve().parent / "__init__.py"


@contextlib.contextmanager
def children_import_this_tconform() -> Iterator[None]:
    """Around starting spawned children: where sys.path would find another `tconform` first
    (a regular package, or a bare folder that makes a namespace package), the folder this one
    was imported from goes first on the path the children start from (and comes off again)."""
    found = PathFinder.find_spec("tconform", sys.path)
    origin = None if found is None or found.origin is None else Path(found.origin).resolve()
    if found is None or origin == _package_file():
        yield  # the path finds this tconform, or none (an editable install's finder does)
        return
    root = str(_package_file().parent.parent)
    sys.path.insert(0, root)
    try:
        yield
    finally:
        sys.path.remove(root)


def forget_entry_script() -> None:
    """In a spawned child: what it spawns in turn starts without running tconform's entry script
    again (multiprocessing re-runs the parent's `__main__` by its file or module name), so that
    it never imports tconform from this process's path, where the user's folder comes first.
    The entry script defines nothing those processes could need."""
    sys.modules["__main__"] = types.ModuleType("__main__")
