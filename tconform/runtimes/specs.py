"""Runtime specs: which runtime, and which build of it.

    onnxruntime                  the one installed with tconform, in tconform's process
    onnxruntime==1.20.1          that release, in an environment tconform makes (and keeps)
    onnxruntime@/opt/py/python   the one that interpreter has (offline, conda, a source build)
    onnxruntime==1.20.1@python3.10   that release, in an environment made from that interpreter

A spec with a version or an interpreter runs in a worker process of its own
(tconform.runtimes.remote); its text is the runtime's name in every result and report, so
that two versions of one runtime are two rows. Cheap to import: the command line parses specs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A release as package indexes spell them (PEP 440's common forms: 1.20.1, 2025.4.0, 1.22.0rc1,
# 1.21.0.post1); anything else is refused rather than handed to an installer.
_VERSION = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9}){0,4}((a|b|rc|\.post|\.dev)[0-9]{1,9})?")


@dataclass(frozen=True)
class RuntimeSpec:
    """A runtime name (a key of tconform.runtimes.RUNTIMES) and, where given, the release to
    install (`version`) or the interpreter to run it in (`python`)."""

    name: str
    version: str | None = None
    python: str | None = None

    @property
    def text(self) -> str:
        """The spec as written: its name in results, labels and reports."""
        return self.name + self.suffix

    @property
    def suffix(self) -> str:
        """What the spec adds to the runtime's name ('' for the installed one)."""
        return (f"=={self.version}" if self.version else "") + (
            f"@{self.python}" if self.python else ""
        )

    @property
    def in_worker(self) -> bool:
        """Whether it runs in a worker process: a version or an interpreter is named."""
        return bool(self.version or self.python)


def parse_spec(text: str) -> RuntimeSpec:
    """'NAME', 'NAME==VERSION', 'NAME@PYTHON' or 'NAME==VERSION@PYTHON'; ValueError saying
    what is wrong. The name is not checked against the registry here."""
    rest, at, python = text.partition("@")
    name, eq, version = rest.partition("==")
    name, version, python = name.strip(), version.strip(), python.strip()
    if not name or any(c in name for c in "=<>!~ "):
        raise ValueError(
            f"{text!r} is not NAME, NAME==VERSION or NAME@PYTHON (e.g. onnxruntime==1.20.1)"
        )
    if eq and not _VERSION.fullmatch(version):
        raise ValueError(f"{text!r}: {version!r} is not a release number (e.g. 1.20.1, 2025.4.0)")
    if at and not python:
        raise ValueError(f"{text!r}: name the interpreter after '@' (e.g. @/usr/bin/python3.11)")
    return RuntimeSpec(name, version or None, python or None)


def base_name(text: str) -> str:
    """The runtime name of a spec's text ('onnxruntime==1.20.1' -> 'onnxruntime')."""
    return re.split(r"==|@", text, maxsplit=1)[0].strip()


def spec_suffix(text: str) -> str:
    """What a spec's text adds to its name ('==1.20.1', '@/usr/bin/python3', or '')."""
    return text[len(base_name(text)) :].strip()
