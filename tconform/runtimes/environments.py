"""The Python environments versioned runtimes run in: made on first use, kept, reused.

`--runtime onnxruntime==1.20.1` needs that release importable somewhere: tconform makes a virtual
environment holding the runtime's package at that release, numpy and onnx, and nothing else (no
tconform: the worker's code is sent by tconform, tconform.runtimes.remote). One environment per
runtime package, release and Python, in the cache folder:

    $TCONFORM_RUNTIME_CACHE, else $XDG_CACHE_HOME/tconform/runtimes, else ~/.cache/tconform/runtimes
        onnxruntime-1.20.1-py3.11-<interpreter hash>/    the environment
            tconform-environment.json                    what is in it, exact versions
        .locks/                                          one maker at a time per environment

It is made with `uv` where uv is installed (about a second once its cache holds the wheels),
else with `python -m venv` and pip; in a temporary folder beside its final place, renamed into
place only once its runtime imports, so a half-made environment is never used. A release that
imports only with NumPy 1 (ONNX Runtime before 1.19) gets `numpy<2`.

`--runtime onnxruntime@PYTHON` uses an interpreter as it is: it must have the package (and numpy
and onnx); nothing is installed into it.

Whatever cannot be made is one line (UsageError, exit 2) naming the spec and the way on: a
release the index does not have, one without a build for this Python, no network.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tconform.errors import UsageError
from tconform.files import new_folder, require_name_fits
from tconform.folders import managed_folder, open_lock, require_not_link
from tconform.runtimes.specs import RuntimeSpec
from tconform.variables import value

RECORD = "tconform-environment.json"
# 2: ml_dtypes installed too (onnx brings it only since 1.19: onnx-reference==1.17.0 had none)
SCHEMA = "tconform-environment/2"
# The packages a worker imports besides the runtime's (tconform.compare's bfloat16 is ml_dtypes').
SUPPORT = ("numpy", "onnx", "ml_dtypes")
INSTALL_SECONDS = 1800  # an installer that runs longer is stopped (a hung download)


@dataclass(frozen=True)
class Environment:
    """An interpreter a worker runs in, and what it holds."""

    python: Path  # the interpreter the worker is started with
    packages: dict[str, str | None]  # distribution -> exact version (None: absent)
    python_version: str
    made_with: str  # "uv 0.x", "venv + pip", or "given" (NAME@PYTHON)
    folder: Path | None = None  # the environment tconform made (None: a given interpreter)
    notes: list[str] = field(default_factory=list)

    def record(self) -> dict[str, object]:
        """What reports record of it: every exact version, and where it lives."""
        return {
            "python": str(self.python),
            "python_version": self.python_version,
            "packages": dict(self.packages),
            "made_with": self.made_with,
            "folder": str(self.folder) if self.folder else None,
        }


# The cache folder's own subfolders beside the environments: makers' locks, uv's and pip's caches
LOCKS, INSTALLERS = ".locks", ".installers"


def cache_root() -> Path:
    """The folder environments are kept in (see the module docstring); a bad
    TCONFORM_RUNTIME_CACHE is one line naming it (tconform.variables)."""
    given = value("TCONFORM_RUNTIME_CACHE")
    if given is not None:
        return _own_cache(Path(given), "TCONFORM_RUNTIME_CACHE")
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        if Path(xdg).exists() and not Path(xdg).is_dir():
            raise UsageError(
                f"XDG_CACHE_HOME={xdg!r:.200}: not a folder (the runtimes' environments are kept "
                "under it; TCONFORM_RUNTIME_CACHE names another folder)"
            )
        return _own_cache(Path(xdg) / "tconform" / "runtimes", "XDG_CACHE_HOME")
    return _own_cache(Path.home() / ".cache" / "tconform" / "runtimes", "the default cache")


def _own_cache(folder: Path, named_by: str) -> Path:
    """The cache folder, a folder of its own: no link, nowhere in a golden or artifacts folder
    (whose checks would then hold environments of hundreds of MB)."""
    try:  # a name too long for the file system fails later, without naming where it came from
        require_name_fits(folder)
    except UsageError as exc:
        raise UsageError(f"{named_by}: {exc}") from None
    require_not_link(folder, named_by)
    for inner in (LOCKS, INSTALLERS):  # made inside it, never through a link planted there
        require_not_link(folder / inner, named_by)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), folder)
    if existing.exists() and not existing.is_dir():
        raise UsageError(f"{folder} ({named_by}): {existing} is not a folder")
    managed = managed_folder(folder, itself=True)
    if managed is not None:
        raise UsageError(
            f"{folder} ({named_by}) is or lies in {managed}, a tconform golden or artifacts "
            "folder; the runtimes' environments go into a folder of their own"
        )
    return folder


def interpreter(text: str, spec: RuntimeSpec) -> Path:
    """The interpreter a spec names after '@': a path, or a command on PATH."""
    found = shutil.which(text) if os.sep not in text else text
    path = Path(found) if found else None
    if path is None or not path.is_file() or not os.access(path, os.X_OK):
        raise UsageError(
            f"runtime spec {spec.text}: {text} is not an interpreter here (a path to a python "
            "executable, or one on PATH)"
        )
    return path.absolute()


def python_running(python: Path, code: str) -> list[str]:
    """The command that runs `code` in `python`, with neither its environment variables (-E)
    nor the current folder on its import path: `-c` puts that folder first, and a json.py or
    numpy/ of the user's there would be imported (and a __pycache__ written beside it)
    instead of the module asked for (-P, which says the same, is Python 3.11's)."""
    first = "import sys\nif sys.path and sys.path[0] == '':\n    del sys.path[0]\n"
    return [str(python), "-E", "-c", first + code]


# Run in the interpreter: its Python version and, per module asked for, the distributions that
# provide it with their exact versions, read from the installed metadata (top_level.txt where a
# distribution has one, else the top folders of its file list, as packages_distributions does
# from Python 3.10; nothing is imported). Written for any Python, so that one too old for the
# worker still says which it is.
# How long an interpreter may take to say what it holds (importing a runtime can take seconds)
PROBE_SECONDS = 120.0
# The worker's code is tconform's own (tconform.runtimes), written for the Python tconform
# needs; every release the index serves (ONNX Runtime 1.15 on, OpenVINO 2023.0 on) has a build
# for it.
OLDEST_PYTHON = (3, 10)
_PROBE = """
import json, platform, sys
answer = {"python": platform.python_version(), "modules": {}}
if sys.version_info >= tuple(json.loads(sys.argv[2])):
    from importlib import metadata
    wanted = set(json.loads(sys.argv[1]))
    for dist in metadata.distributions():
        tops = set((dist.read_text("top_level.txt") or "").split())
        tops.update(f.parts[0].split(".")[0] for f in (dist.files or ()) if f.parts)
        for module in wanted & tops:
            answer["modules"].setdefault(module, {})[dist.metadata["Name"]] = dist.version
print(json.dumps(answer))
"""


def probe(
    spec: RuntimeSpec, python: Path, modules: tuple[str, ...]
) -> tuple[str, dict[str, dict[str, str]]]:
    """(Python version, {module: {distribution: version}}) of what `python` holds of
    `modules` (a module it lacks is absent). An interpreter that does not answer within
    PROBE_SECONDS, or TCONFORM_WORKER_TIMEOUT where that is shorter, is ended with all it
    started (a process group of its own); one older than OLDEST_PYTHON is refused."""
    timeout = min(PROBE_SECONDS, float(value("TCONFORM_WORKER_TIMEOUT")))
    command = [
        *python_running(python, _PROBE),
        json.dumps(list(modules)),
        json.dumps(OLDEST_PYTHON),
    ]
    try:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        raise UsageError(
            f"runtime spec {spec.text}: {python} could not be asked what it holds: {exc}"
        ) from None
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise UsageError(
            f"runtime spec {spec.text}: {python} did not say what it holds within {timeout:g} s "
            "(TCONFORM_WORKER_TIMEOUT sets a shorter wait)"
        ) from None
    try:
        found = json.loads(out)
        if _answered(found):
            return _new_enough(spec, python, found["python"]), found["modules"]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        pass
    said = next((line.strip() for line in out.splitlines() if line.strip()), "nothing")
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    # A traceback ends with its error; a shell's or a shim's complaint comes first
    last = (lines[-1] if "Traceback" in err else lines[0]) if lines else ""
    raise UsageError(
        f"runtime spec {spec.text}: {python} did not answer as a Python interpreter does "
        f"(it printed {said[:80]!r}, exit status {process.returncode}"
        + (f", on stderr {last[:120]!r}" if last else "")
        + "); --runtime NAME@PYTHON takes an interpreter"
    )


def _new_enough(spec: RuntimeSpec, python: Path, version: str) -> str:
    """`version`, where it is at least OLDEST_PYTHON; else one line saying so."""
    if tuple(int(part) for part in version.split(".")[:2]) < OLDEST_PYTHON:
        oldest = ".".join(map(str, OLDEST_PYTHON))
        raise UsageError(
            f"runtime spec {spec.text}: {python} is Python {version}; a runtime's worker needs "
            f"Python {oldest} or newer "
            f"(name an interpreter of {oldest} or newer with @PYTHON)"
        )
    return version


def _answered(found: object) -> bool:
    """Whether a probe's answer has the shape _PROBE prints: a version, and per module a map of
    distribution names to versions (all text)."""
    if not isinstance(found, dict) or not isinstance(found.get("python"), str):
        return False
    modules = found.get("modules")
    return isinstance(modules, dict) and all(
        isinstance(dists, dict) and all(isinstance(v, str) for v in (*dists, *dists.values()))
        for dists in modules.values()
    )


def _versions(modules: dict[str, dict[str, str]]) -> dict[str, str]:
    return {dist: version for dists in modules.values() for dist, version in dists.items()}


def given_environment(spec: RuntimeSpec, package: str, module: str) -> Environment:
    """NAME@PYTHON: the interpreter as it is, which must hold the runtime, numpy and onnx."""
    python = interpreter(str(spec.python), spec)
    version, modules = probe(spec, python, (module, *SUPPORT))
    needed = list(dict.fromkeys((module, *SUPPORT)))  # onnx-reference's module is onnx
    missing = [m for m in needed if not modules.get(m)]
    if missing:
        installs = " ".join(dict.fromkeys((package, *SUPPORT)))
        raise UsageError(
            f"runtime spec {spec.text}: {python} has no {', '.join(missing)}; way on: "
            f"{python} -m pip install {installs}, or name a release for tconform to "
            f"install (--runtime {spec.name}==VERSION)"
        )
    return Environment(python, _versions(modules), version, "given")


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# Where the lines of making an environment go: stderr, or the command's progress (silent with -q)
_announce: list[Callable[[str], None]] = [_to_stderr]


@contextlib.contextmanager
def announced_to(progress: Callable[[str], None]) -> Iterator[None]:
    """While a command runs, the environments it makes say so through its own progress."""
    _announce.append(progress)
    try:
        yield
    finally:
        _announce.pop()


def made_environment(spec: RuntimeSpec, package: str, module: str) -> Environment:
    """NAME==VERSION[@PYTHON]: the environment holding that release, made where it is missing
    (locked: one maker at a time; atomic: renamed into place once it works)."""
    say = _announce[-1]
    base = interpreter(spec.python, spec) if spec.python else Path(sys.executable)
    python_version, _ = probe(spec, base, ())
    key = "-".join(
        (
            package,
            str(spec.version),
            "py" + ".".join(python_version.split(".")[:2]),
            hashlib.sha256(str(base.resolve()).encode()).hexdigest()[:10],
        )
    )
    root = cache_root()
    folder = root / key
    with _locked(root, key, say):
        found = _read_record(folder)
        if found is None:
            _make(spec, package, module, base, folder, say)
            found = _read_record(folder)
        elif found.packages.get(package) is not None:  # reused: as it was made, or refused
            _require_as_made(spec, found, module, package)
        if found is None:
            raise UsageError(f"runtime spec {spec.text}: {folder} holds no usable environment")
        return found


def _require_as_made(spec: RuntimeSpec, found: Environment, module: str, package: str) -> None:
    """A reused environment still holds the release it was made with: one changed since (a
    package installed over it) would run another release under this spec's name, so it is
    refused with the way on (tconform deletes no environment it cannot vouch for)."""
    _, modules = probe(spec, found.python, (module, *SUPPORT))
    installed = _versions(modules)
    if installed.get(package) != found.packages[package]:
        raise UsageError(
            f"runtime spec {spec.text}: {found.folder} holds {package} "
            f"{installed.get(package) or 'none'}, not the {found.packages[package]} it was made "
            "with (changed since): remove that folder and tconform makes it again"
        )


def _python_in(folder: Path) -> Path:
    return folder / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _record(folder: Path) -> dict:
    """The record tconform wrote in `folder` ({} where there is none, or it is unreadable)."""
    if folder.is_symlink() or not (folder / RECORD).is_file():
        return {}
    try:
        data = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_record(folder: Path) -> Environment | None:
    """The environment recorded in `folder`, or None where there is none (or it is not ours)."""
    data = _record(folder)
    if data.get("schema") != SCHEMA or not _python_in(folder).exists():
        return None
    return Environment(
        _python_in(folder),
        dict(data["packages"]),
        str(data["python_version"]),
        str(data["made_with"]),
        folder,
    )


@contextlib.contextmanager
def _locked(root: Path, key: str, say) -> Iterator[None]:
    """One maker of environment `key` at a time (across processes): the others wait."""
    locks = root / LOCKS
    locks.mkdir(parents=True, exist_ok=True)
    fd = open_lock(locks / f"{key}.lock")  # never through a link, a regular file only
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another tconform making the environment {key} ...")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def installer() -> list[str] | None:
    """The uv command where uv is installed (on PATH, or its Python package), else None."""
    found = shutil.which("uv")
    if found:
        return [found]
    try:
        import uv  # the uv package ships its binary

        return [uv.find_uv_bin()]
    except (ImportError, FileNotFoundError):
        return None


def _make(spec: RuntimeSpec, package: str, module: str, base: Path, folder: Path, say) -> None:
    """Make the environment in a temporary folder beside `folder` and rename it into place."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(f".{folder.name}.*"):  # a maker that was killed mid-way
        if stale.is_dir() and not stale.is_symlink():  # (the lock is ours: no one else's)
            shutil.rmtree(stale, ignore_errors=True)
    staging = new_folder(folder.parent, f".{folder.name}.")
    uv = installer()
    tool = f"uv {_uv_version(uv)}" if uv else "venv + pip"
    say(f"making an environment for {spec.text} with {tool} in {folder} (once) ...")
    started = time.monotonic()
    # The installers' own caches in the cache folder too: nothing is written outside it
    caches = folder.parent / INSTALLERS
    env = {**os.environ, "UV_CACHE_DIR": str(caches / "uv"), "PIP_CACHE_DIR": str(caches / "pip")}
    try:
        python = _python_in(staging)
        if uv:
            _run(spec, [*uv, "venv", "--quiet", "--python", str(base), str(staging)], env)
        else:
            _run(spec, [str(base), "-m", "venv", str(staging)], env)
        requirements = [f"{package}=={spec.version}", *SUPPORT]
        install = (
            [*uv, "pip", "install", "--quiet", "--python", str(python)]
            if uv
            else [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        )
        install += ["--only-binary", ":all:"]  # wheels only: an sdist's build runs its code
        _run(spec, [*install, *requirements], env)
        failure = _import_failure(python, module)
        if _BUILT_FOR_NUMPY_1.search(failure):
            _run(spec, [*install, *requirements[:1], "numpy<2", *SUPPORT[1:]], env)
            failure = _import_failure(python, module)
        if failure:
            lines = [ln.strip() for ln in failure.splitlines() if "Error" in ln]
            raise UsageError(
                f"runtime spec {spec.text}: installed, but `import "
                f"{', '.join(dict.fromkeys((module, *SUPPORT)))}` fails: "
                + (lines[-1] if lines else failure.strip().splitlines()[-1])
            )
        python_version, modules = probe(spec, python, (module, *SUPPORT))
        record = {
            "schema": SCHEMA,
            "spec": spec.text,
            "package": package,
            "version": spec.version,
            "base_python": str(base),
            "python_version": python_version,
            "packages": _versions(modules),
            "made_with": tool,
            "seconds": round(time.monotonic() - started, 1),
        }
        (staging / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        if _made_before(folder):  # ours, by an earlier tconform (its record's older schema)
            shutil.rmtree(folder)
        if folder.exists() or folder.is_symlink():  # not ours (no record): left alone
            raise UsageError(
                f"runtime spec {spec.text}: {folder} exists and is not an environment "
                "tconform made; move it away"
            )
        os.rename(staging, folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _uv_version(uv: list[str] | None) -> str:
    if not uv:
        return ""
    done = subprocess.run([*uv, "--version"], capture_output=True, text=True)
    return done.stdout.split()[1] if len(done.stdout.split()) > 1 else "?"


def _made_before(folder: Path) -> bool:
    """Whether `folder` is an environment an earlier tconform made (an older record schema)."""
    schema = str(_record(folder).get("schema", ""))
    return schema != SCHEMA and schema.startswith("tconform-environment/")


def _import_failure(python: Path, module: str) -> str:
    """'' where `module` and the worker's SUPPORT import in `python`, else what it printed.
    A module built for NumPy 1 fails under NumPy 2 even where the import exits 0 (NumPy only
    warns, and the module breaks when it is used): that warning is a failure too."""
    imports = ", ".join(dict.fromkeys((module, *SUPPORT)))
    done = subprocess.run(
        python_running(python, f"import {imports}"), capture_output=True, text=True
    )
    said = (done.stderr + done.stdout).strip()
    if done.returncode == 0 and not _BUILT_FOR_NUMPY_1.search(said):
        return ""
    return said or f"exit status {done.returncode}"


# What NumPy 2 prints on importing a module built for NumPy 1.
_BUILT_FOR_NUMPY_1 = re.compile(r"compiled using numpy 1\.x", re.IGNORECASE)
# What installers print when the index cannot be reached.
_NO_NETWORK = re.compile(
    r"failed to fetch|error sending request|dns error|name resolution|network is unreachable|"
    r"connection refused|max retries exceeded|connecttimeout|timed out|offline|"
    r"network was disabled",
    re.IGNORECASE,
)
# ... and when the release has no build for this Python.
_NO_BUILD = re.compile(
    r"no wheels with a matching python|requires-python|only has wheels for|"
    r"no matching distribution found for .* python",
    re.IGNORECASE,
)


def _run(spec: RuntimeSpec, command: list[str], env: dict[str, str]) -> None:
    """An installer step; its failure as the one line that says why, with the way on."""
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=INSTALL_SECONDS,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise UsageError(
            f"runtime spec {spec.text}: {command[0]} ran {INSTALL_SECONDS} s without finishing"
        ) from None
    if done.returncode == 0:
        return
    text = done.stderr + done.stdout
    cause = _cause([line.strip() for line in text.splitlines() if line.strip()])
    name = spec.name
    if _NO_NETWORK.search(text):
        raise UsageError(
            f"runtime spec {spec.text}: the package index could not be reached ({cause}); "
            f"way on: run once with network (environments are kept in {cache_root()}), or "
            f"--runtime {name}@PYTHON with an interpreter that has it"
        )
    if _NO_BUILD.search(text):
        raise UsageError(
            f"runtime spec {spec.text}: no build of that release for this Python ({cause}); "
            f"way on: --runtime {name}=={spec.version}@PYTHON with an interpreter it supports"
        )
    raise UsageError(  # pip says the same where its index cannot be reached
        f"runtime spec {spec.text}: cannot be installed ({cause}); way on: name a release the "
        f"package index has (pip index versions {_package_hint(command)}), or without network "
        f"--runtime {name}@PYTHON with an interpreter that has it"
    )


def _cause(lines: list[str]) -> str:
    """The line of an installer's output that says why (uv's "Because ...", pip's "Could not
    find a version ...", else the innermost "cause:"), without its prefix, at most 240 chars."""
    keys = ("because", "could not find a version", "no matching distribution")
    found = next((ln for key in keys for ln in lines if key in ln.lower()), None)
    causes = [ln for ln in lines if ln.lower().startswith("cause:")]
    line = found or (causes[-1] if causes else lines[-1] if lines else "no output")
    return re.sub(r"^(error|cause|hint)\s*:\s*", "", line, flags=re.IGNORECASE)[:240]


def _package_hint(command: list[str]) -> str:
    pinned = [part for part in command if "==" in part]
    return pinned[0].split("==")[0] if pinned else "PACKAGE"
