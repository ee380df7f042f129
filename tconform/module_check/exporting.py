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
import inspect
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
from tconform.check_folder import (
    MATRIX,
    OWN_FILES,
    OWN_RECORD,
    export_folder,
    export_lock,
    record_own_files,
    require_own_export_folder,
)
from tconform.errors import (
    EndedByUserCode,
    Terminated,
    UsageError,
    calling_user_code,
    first_line,
)
from tconform.files import atomic_write_bytes, atomic_write_text
from tconform.module_check.inputs import ModuleInputs
from tconform.runtimes.torch_session import eval_mode

__all__ = [
    "DEFAULT_OPSET",
    "EXPORTERS",
    "MATRIX",
    "OWN_FILES",
    "OWN_RECORD",
    "ExportFailed",
    "check_opset",
    "export_folder",
    "export_lock",
    "export_module",
    "record_own_files",
    "require_own_export_folder",
]

EXPORTERS = project_export.EXPORTERS
DEFAULT_OPSET = project_export.DEFAULT_OPSET


class ExportFailed(UsageError):
    """The exporter failed on the module: the run's input error where that one model was asked
    for, the verdict of its cells (an error row each) in a matrix of several."""


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
    with _taking_only(module, inputs) if exporter == "torchscript" else contextlib.nullcontext():
        project_export.export_with_torch(
            module,
            inputs.args,
            path,
            exporter,
            opset,
            output_names,
            input_names=None if exporter == "dynamo" else inputs.names,
            kwargs=inputs.kwargs or None,
            dynamic_shapes=_dynamic_shapes(module, inputs, dynamic) if dynamic else None,
            dynamic_axes=dynamic or None,
        )


def _dynamic_shapes(
    module: nn.Module, inputs: ModuleInputs, dynamic: dict[str, dict[int, str]]
) -> dict[str, object]:
    """torch.export's dynamic_shapes, keyed by forward's parameters: the inputs that fill its
    *args as one tuple under that parameter's name (torch.export refuses their own names)."""
    specs = {name: dynamic.get(name) for name in inputs.names}
    parameters = list(inspect.signature(module.forward).parameters.values())
    star = next((p for p in parameters if p.kind == p.VAR_POSITIONAL), None)
    if star is None:
        return specs
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    named = sum(p.kind in positional for p in parameters[: parameters.index(star)])
    rest = inputs.arg_names[named:]
    return {
        **{name: spec for name, spec in specs.items() if name not in rest},
        star.name: tuple(specs[name] for name in rest),
    }


@contextlib.contextmanager
def _taking_only(module: nn.Module, inputs: ModuleInputs) -> Iterator[None]:
    """While TorchScript exports it, the module's forward takes only the inputs given: given
    keyword inputs, TorchScript passes forward every parameter between them by position, a
    number default as a traced tensor (transformers' logits_to_keep=0 then indexes one position
    instead of slicing none): a graph of another function, with an input no set holds. The
    module itself is called, so the node names still carry its submodules' scopes."""
    if not inputs.kwargs:
        yield
        return
    forward, names = module.forward, inputs.names

    def given_only(*tensors):
        return forward(**dict(zip(names, tensors, strict=True)))

    parameter = inspect.Parameter
    given_only.__signature__ = inspect.Signature(  # what torch.onnx reads the inputs from
        [parameter(name, parameter.POSITIONAL_OR_KEYWORD) for name in names]
    )
    module.forward = given_only
    try:
        yield
    finally:
        del module.forward  # the class's forward again


def export_module(
    module: nn.Module,
    inputs: ModuleInputs,
    output_names: list[str],
    path: Path,
    exporter: str = "dynamo",
    opset: int = DEFAULT_OPSET,
    dynamic: dict[str, dict[int, str]] | None = None,
    label: str = "",
) -> tuple[str, ...]:
    """Export `module` (in eval mode) at `inputs` to `path`, atomically. -> the values the
    exporter froze at the example's (frozen_values).

    On failure: UsageError (starting with `label`) with the exporter's first error line, the
    full log written to `path`'s folder as export.log.
    """
    check_opset(exporter, opset)
    require_own_export_folder(path.parent)
    log = io.StringIO()
    log_path = path.parent / "export.log"
    failed = f"{label + ': ' if label else ''}export with {exporter} failed"
    with tempfile.TemporaryDirectory() as tmp, calling_user_code(failed):
        raw = Path(tmp) / "model.onnx"
        try:
            with _captured(log), eval_mode(module):
                _export(module, inputs, output_names, raw, exporter, opset, dynamic or {})
            model = project_export.checked_model(raw)
        except (KeyboardInterrupt, Terminated):
            raise
        except BaseException as exc:  # the user's forward may call sys.exit, raise anything
            log.write("\n" + "".join(traceback.format_exception(exc)))
            atomic_write_text(log_path, log.getvalue())
            record_own_files(path.parent)
            if isinstance(exc, EndedByUserCode | UsageError):
                summary = str(exc)
            elif isinstance(exc, Exception):
                summary = project_export.exporter_error_line(exc)
            else:  # SystemExit, GeneratorExit: what the user's code did, in one line
                raise EndedByUserCode(
                    f"{failed}: {first_line(exc)} (full log: {log_path})"
                ) from None
            if isinstance(exc, EndedByUserCode):
                raise EndedByUserCode(f"{failed}: {summary} (full log: {log_path})") from None
            way_on = (
                "; the TorchScript exporter may export it: --exporter torchscript, or --exporter "
                "auto to try dynamo first"
                if exporter == "dynamo"
                else ""
            )
            raise ExportFailed(f"{failed}: {summary} (full log: {log_path}){way_on}") from None
    atomic_write_bytes(path, model.SerializeToString())
    atomic_write_text(log_path, log.getvalue())
    record_own_files(path.parent)
    return frozen_values(log.getvalue())


# torch's TracerWarnings for a tensor made a Python value (the rest, such as torch.tensor's
# constants, are about values that are constant anyway)
FROZEN = (
    "TracerWarning: Converting a tensor to a Python",
    "TracerWarning: Iterating over a tensor",
)


def frozen_values(log: str) -> tuple[str, ...]:
    """What the TorchScript tracer turned from a tensor into a Python value (a branch on
    `x.sum() > 0`, a loop over a tensor): the graph holds the example's outcome, whatever
    the inputs. Each warning once, without torch's advice."""
    found = (line.split(": ", 1)[1] for line in log.splitlines() if line.startswith(FROZEN))
    return tuple(dict.fromkeys(text.split(" might cause")[0] for text in found))
