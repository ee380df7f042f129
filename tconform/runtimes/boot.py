"""The first code a worker runs: `python -E -c <this file's text> READ_FD WRITE_FD`, the
current folder off the import path before it (tconform.runtimes.environments.python_running).

It imports nothing of tconform, which is not installed in the worker's interpreter: the first
message on READ_FD (8 bytes of length, then JSON {module name: [source, is package]}) carries
tconform's worker modules, which it serves to `import` from memory; any other tconform module
is not found, so an installed tconform of another version is never mixed in. Then the worker
(tconform.runtimes.worker) answers requests until its input closes. It dies with its parent.
"""

import importlib.abc
import importlib.util
import json
import os
import struct
import sys


class _Sources(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """tconform's modules, from the sources the parent sent."""

    def __init__(self, sources):
        self.sources = sources

    def find_spec(self, name, path=None, target=None):
        if name in self.sources:
            origin = "tconform-worker:" + name
            is_package = self.sources[name][1]
            return importlib.util.spec_from_loader(name, self, origin=origin, is_package=is_package)
        if name == "tconform" or name.startswith("tconform."):
            raise ModuleNotFoundError(f"{name} is not one of the worker's modules", name=name)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        source = self.sources[module.__name__][0]
        exec(compile(source, module.__spec__.origin, "exec"), module.__dict__)


def _read(fd, size):
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise SystemExit(0)  # the parent went away before it said anything
        data += chunk
    return data


def _die_with_parent():
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            pr_set_pdeathsig = 1
            ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)
        except (OSError, AttributeError):
            pass


def main():
    _die_with_parent()
    read_fd, write_fd = int(sys.argv[1]), int(sys.argv[2])
    (length,) = struct.unpack("<Q", _read(read_fd, 8))
    sys.meta_path.insert(0, _Sources(json.loads(_read(read_fd, length))))
    from tconform.runtimes.worker import serve

    serve(read_fd, write_fd)


if __name__ == "__main__":  # python -c runs it as __main__; importing it runs nothing
    main()
