"""Export a user's module to ONNX with torch.onnx (dynamo or TorchScript), quietly.

Everything the exporter prints or logs goes to a log; when the export fails, the log and the
traceback are written to a file beside the model and the error names it, with the exporter's
own first error line.

The export folder is tconform's own: `check.json` there records the sha256 of the files it
wrote (model.onnx, export.log), and a file that is not recorded so, or changed since, is never
replaced; nor is anything written into a golden or artifacts folder.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path

from torch import nn

from tconform import export as project_export
from tconform.errors import UsageError
from tconform.files import atomic_write_bytes, atomic_write_json, read_json_object, sha256_file
from tconform.folders import ARTIFACTS, MANIFEST, managed_folder, manifest_kind
from tconform.module_check.inputs import ModuleInputs
from tconform.runtimes.torch import eval_mode

EXPORTERS = project_export.EXPORTERS
DEFAULT_OPSET = project_export.DEFAULT_OPSET


def check_opset(exporter: str, opset: int) -> None:
    """The opsets tconform exports with (the same range as `tconform export`)."""
    top = 20 if exporter == "torchscript" else 23
    if not 17 <= opset <= top:
        raise UsageError(f"--opset {opset} out of range for {exporter}: 17..{top}")


@contextlib.contextmanager
def _captured(log: io.StringIO) -> Iterator[None]:
    """Send the exporter's prints, warnings, torch log records and C++ output to `log`."""
    torch_logger = logging.getLogger("torch")
    handlers, propagate = torch_logger.handlers[:], torch_logger.propagate
    handler = logging.StreamHandler(log)
    torch_logger.handlers = [handler]
    torch_logger.propagate = False
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as sink:
        saved = [os.dup(1), os.dup(2)]
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            with (
                warnings.catch_warnings(record=True) as caught,
                contextlib.redirect_stdout(log),
                contextlib.redirect_stderr(log),
            ):
                warnings.simplefilter("always")
                yield
        finally:
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)
            torch_logger.handlers, torch_logger.propagate = handlers, propagate
            sink.seek(0)
            log.write(sink.read().decode(errors="replace"))
            for w in caught:
                log.write(f"{w.category.__name__}: {w.message}\n")


def _export(
    module: nn.Module,
    inputs: ModuleInputs,
    output_names: list[str],
    path: Path,
    exporter: str,
    opset: int,
    dynamic: dict[str, dict[int, str]],
) -> None:
    # dynamo names inputs after forward's parameters itself; TorchScript needs them given.
    project_export.export_with_torch(
        module,
        inputs.args,
        path,
        exporter,
        opset,
        output_names,
        input_names=None if exporter == "dynamo" else inputs.names,
        kwargs=inputs.kwargs or None,
        dynamic_shapes={name: dynamic.get(name) for name in inputs.names} if dynamic else None,
        dynamic_axes=dynamic or None,
    )


def export_module(
    module: nn.Module,
    inputs: ModuleInputs,
    output_names: list[str],
    path: Path,
    exporter: str = "dynamo",
    opset: int = DEFAULT_OPSET,
    dynamic: dict[str, dict[int, str]] | None = None,
    label: str = "",
) -> None:
    """Export `module` (in eval mode) at `inputs` to `path`, atomically.

    On failure: UsageError (starting with `label`) with the exporter's first error line, the
    full log written to `path`'s folder as export.log.
    """
    check_opset(exporter, opset)
    require_own_export_folder(path.parent)
    log = io.StringIO()
    log_path = path.parent / "export.log"
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "model.onnx"
        try:
            with _captured(log), eval_mode(module):
                _export(module, inputs, output_names, raw, exporter, opset, dynamic or {})
            model = project_export.checked_model(raw)
        except Exception as exc:
            log.write("\n" + "".join(traceback.format_exception(exc)))
            atomic_write_bytes(log_path, log.getvalue().encode())
            _record_own_files(path.parent)
            summary = (
                exc if isinstance(exc, UsageError) else project_export.exporter_error_line(exc)
            )
            way_on = (
                "; the TorchScript exporter may export it: --exporter torchscript, or --exporter "
                "auto to try dynamo first"
                if exporter == "dynamo"
                else ""
            )
            raise UsageError(
                f"{label + ': ' if label else ''}export with {exporter} failed: {summary} "
                f"(full log: {log_path}){way_on}"
            ) from None
    atomic_write_bytes(path, model.SerializeToString())
    atomic_write_bytes(log_path, log.getvalue().encode())
    _record_own_files(path.parent)


OWN_RECORD = "check.json"  # what tconform check wrote into its export folder
OWN_FILES = ("model.onnx", "export.log")


CHECK_AREA = "check"  # an artifacts folder's subfolder for tconform check's exports


def default_export_dir(name: str) -> Path:
    """Where `tconform check` exports a module named `name` unless told otherwise."""
    return Path("artifacts") / CHECK_AREA / name.replace(":", ".")


def _recorded(folder: Path) -> dict:
    """The sha256 of each file check wrote here, as a readable check.json records them."""
    try:
        hashes = read_json_object(folder / OWN_RECORD, what="check record").get("sha256")
    except UsageError:  # missing or unreadable: nothing here is known to be check's own
        return {}
    return hashes if isinstance(hashes, dict) else {}


def in_check_area(folder: Path, managed: Path | None) -> bool:
    """Whether `folder` lies in the `check/` area of the artifacts folder `managed`: the one
    place inside an artifacts folder that is tconform check's (as doc/ is the document
    checks'), so that its default folder works where `tconform verify` made artifacts/."""
    if managed is None or manifest_kind(managed) != ARTIFACTS:
        return False
    area = managed / CHECK_AREA
    resolved = folder.resolve()
    return resolved != area and resolved.is_relative_to(area)


def require_own_export_folder(folder: Path) -> None:
    """check writes only where it may replace what is there: a new or tconform check's own
    folder, never a golden or artifacts folder (but for an artifacts folder's check/ area),
    never over a file it did not write."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder}: exists and is not a folder")
    managed = managed_folder(folder, itself=True)
    if (folder / MANIFEST).exists() or (managed is not None and not in_check_area(folder, managed)):
        raise UsageError(
            f"{folder} is or lies in a golden or artifacts folder ({managed or folder}); "
            "check --out needs a folder of its own"
        )
    recorded = _recorded(folder)
    for name in OWN_FILES:
        path = folder / name
        if path.exists() and (not path.is_file() or sha256_file(path) != recorded.get(name)):
            ways = f"check it as it is with --model {path}, or " if name == "model.onnx" else ""
            raise UsageError(
                f"{path}: not written by tconform check (or changed since); {ways}choose "
                "another --out"
            )


def _record_own_files(folder: Path) -> None:
    hashes = {n: sha256_file(folder / n) for n in OWN_FILES if (folder / n).is_file()}
    atomic_write_json(folder / OWN_RECORD, {"tool": "tconform check", "sha256": hashes})
