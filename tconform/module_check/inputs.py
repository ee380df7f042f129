"""A user's module and its inputs: loading PACKAGE.MODULE:FACTORY, reading --inputs FILE.npz,
naming the inputs after forward's parameters, and parsing --dynamic NAME=AXES.

Inputs are kept as positional arguments and keyword arguments, exactly as the module is called;
each has a name, which becomes the ONNX input name (forward's parameter name for a positional
argument, the key for a keyword argument).
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tconform.check_folder import require_target
from tconform.errors import UsageError, calling_user_code
from tconform.runtimes.torch_session import as_array


@dataclass
class ModuleInputs:
    """The tensors a module is called with: module(*args, **kwargs)."""

    args: tuple[torch.Tensor, ...]
    kwargs: dict[str, torch.Tensor]
    arg_names: tuple[str, ...]  # forward's parameter names for the positional arguments

    @property
    def names(self) -> list[str]:
        return [*self.arg_names, *self.kwargs]

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [*self.args, *self.kwargs.values()]

    def named(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.tensors, strict=True))

    def converted(self, dtype: torch.dtype | None, device: torch.device | None) -> ModuleInputs:
        """A copy with floating-point tensors cast to `dtype` (integers and booleans unchanged),
        all on `device`. Always a copy: a module that changes its inputs in place (x.add_(1))
        changes this run's, never the example every other run starts from."""

        def convert(t: torch.Tensor) -> torch.Tensor:
            wanted = dtype if dtype is not None and t.is_floating_point() else t.dtype
            return t.to(device=device or t.device, dtype=wanted, copy=True)

        return ModuleInputs(
            tuple(convert(t) for t in self.args),
            {k: convert(t) for k, t in self.kwargs.items()},
            self.arg_names,
        )

    def feeds(self) -> dict[str, np.ndarray]:
        return {name: as_array(t) for name, t in self.named().items()}


def _positional_names(module: nn.Module, count: int) -> tuple[str, ...]:
    """forward's first `count` parameter names (input_N where forward takes *args)."""
    names = []
    for p in inspect.signature(module.forward).parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            break
    names += [f"input_{i}" for i in range(len(names), count)]
    return tuple(names[:count])


def _forward_parameters(module: nn.Module) -> list[str]:
    return [
        p.name
        for p in inspect.signature(module.forward).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def as_inputs(module: nn.Module, example_inputs: object, origin: str) -> ModuleInputs:
    """A tensor, a tuple or list of tensors (positional) or a dict of tensors (keyword
    arguments) -> ModuleInputs. `origin` names where they came from in error messages."""
    require_materialised(module, origin)
    if isinstance(example_inputs, ModuleInputs):
        return example_inputs
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if isinstance(example_inputs, dict):
        args: tuple = ()
        kwargs = dict(example_inputs)
    elif isinstance(example_inputs, (tuple, list)):
        args, kwargs = tuple(example_inputs), {}
    else:
        raise UsageError(
            f"{origin}: example inputs must be a tensor, a tuple of tensors or a dict of "
            f"tensors, not {type(example_inputs).__name__}"
        )
    for name, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, torch.Tensor):
            raise UsageError(
                f"{origin}: input {name!r} is a {type(value).__name__}, not a torch.Tensor"
            )
        require_dense(value, f"{origin}: input {name!r}")
    known = _forward_parameters(module)
    takes_any = any(
        p.kind == p.VAR_KEYWORD for p in inspect.signature(module.forward).parameters.values()
    )
    for name in kwargs:
        if name not in known and not takes_any:
            raise UsageError(
                f"{origin}: {type(module).__name__}.forward has no parameter {name!r} "
                f"(it takes {', '.join(known) or 'no named parameters'})"
            )
    return ModuleInputs(args, kwargs, _positional_names(module, len(args)))


def read_npz(path: Path, module: nn.Module) -> ModuleInputs:
    """--inputs FILE.npz: arrays named after forward's parameters (keyword arguments), or
    arr_0, arr_1, ... as `np.savez(path, a, b)` writes them (positional)."""
    tensors = {name: _tensor(path, name, array) for name, array in read_arrays(path).items()}
    origin = str(path)
    positional = [f"arr_{i}" for i in range(len(tensors))]
    if sorted(tensors) == sorted(positional):
        return as_inputs(module, tuple(tensors[n] for n in positional), origin)
    return as_inputs(module, tensors, origin)


# numpy kinds an input may have: bool, signed and unsigned integers, floating point. Not text
# (U, S), structured or raw bytes (V), objects (O), complex (c) or times (M, m).
INPUT_KINDS = "biuf"


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz of inputs, each of bool, integers or floating point, or one line
    naming the file and what is wrong: all it takes is numpy, so `check` reads the file before
    its child starts (the module's names are matched there)."""
    if not path.is_file():
        raise UsageError(f"{path}: no such file (--inputs)")
    with open(path, "rb") as file:
        start = file.read(6)
    zipped = start[:4] in (b"PK\x03\x04", b"PK\x05\x06")  # a member first, or none at all
    if not zipped and start != b"\x93NUMPY":  # neither a zip nor a .npy
        raise UsageError(
            f"{path}: not a .npz archive (not a zip of .npy arrays); write the inputs with np.savez"
        )
    if zipped:
        _require_unpacks_in_memory(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise UsageError(f"{path}: not a .npz archive ({type(exc).__name__}: {exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise UsageError(f"{path}: a single .npy array, not a .npz archive; use np.savez")
    with archive:
        try:
            arrays = {name: archive[name] for name in archive.files}
        except Exception as exc:
            raise UsageError(f"{path}: unreadable array in the archive: {exc}") from None
    if not arrays:
        raise UsageError(f"{path}: the archive holds no arrays")
    for name, value in arrays.items():
        if not isinstance(value, np.ndarray):  # numpy hands back a member that is no .npy as bytes
            raise UsageError(
                f"{path}: member {name!r} is not a .npy array; write the inputs with np.savez"
            )
        if value.dtype.kind not in INPUT_KINDS or value.dtype.fields is not None:
            what = _KIND_NAMES.get(value.dtype.kind, "an unsupported type")
            if value.dtype.fields is not None:
                what = "a structured type"
            raise UsageError(
                f"{path}: array {name!r} holds {value.dtype} ({what}); inputs are arrays of "
                "bool, integers or floating-point numbers"
            )
    return arrays


def _require_unpacks_in_memory(path: Path) -> None:
    """An archive whose members unpack (by the sizes its directory declares) to more than the
    memory available is refused before any is read: a compressed archive of a few kilobytes can
    declare gigabytes, and reading it would end the command in the out-of-memory killer."""
    import zipfile

    import psutil

    try:
        with zipfile.ZipFile(path) as archive:
            declared = sum(member.file_size for member in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a .npz archive ({type(exc).__name__}: {exc})") from None
    available = psutil.virtual_memory().available
    if declared > available:
        raise UsageError(
            f"{path}: its arrays unpack to {declared / 2**20:,.1f} MiB, more than the "
            f"{available / 2**20:,.1f} MiB of memory available; give smaller inputs"
        )


def _tensor(path: Path, name: str, array: np.ndarray) -> torch.Tensor:
    """One array of --inputs as a tensor, or one line naming it and its type."""
    try:
        return torch.from_numpy(np.ascontiguousarray(array))
    except (TypeError, ValueError, RuntimeError) as exc:  # a dtype torch has no type for
        raise UsageError(f"{path}: array {name!r} ({array.dtype}): {exc}") from None


_KIND_NAMES = {
    "U": "text",
    "S": "bytes",
    "V": "a structured or raw-bytes type",
    "O": "Python objects",
    "c": "complex numbers",
    "M": "dates",
    "m": "time spans",
}


def parse_dynamic(
    specs: list[str] | tuple[str, ...], inputs: ModuleInputs
) -> dict[str, dict[int, str]]:
    """--dynamic NAME=AXES, AXES a comma list of axis indices, each optionally named
    (`ids=0,1` or `ids=0:batch,1:seq`; equal names mark equal sizes). -> {input: {axis: name}}"""
    named = inputs.named()
    dynamic: dict[str, dict[int, str]] = {}
    for spec in specs:
        name, sep, axes = spec.partition("=")
        name = name.strip()
        if not sep or not name or not axes.strip():
            raise UsageError(f"--dynamic {spec!r}: expected NAME=AXES, e.g. ids=0:batch,1:seq")
        if name not in named:
            raise UsageError(
                f"--dynamic {spec!r}: the module has no input {name!r} "
                f"(its inputs: {', '.join(named)})"
            )
        rank = named[name].dim()
        for item in axes.split(","):
            index, colon, label = item.strip().partition(":")
            if not re.fullmatch(r"-?[0-9]{1,9}", index.strip()):  # int() takes any script's digits
                raise UsageError(f"--dynamic {spec!r}: {index!r} is not an axis index")
            axis = int(index)
            require_axis(axis, name, rank, f"--dynamic {spec!r}")
            if colon and not label.strip():
                raise UsageError(f"--dynamic {spec!r}: no name after '{index}:'")
            if colon:
                require_label(label.strip(), f"--dynamic {spec!r}")
            axis %= rank
            if axis in dynamic.get(name, {}):
                raise UsageError(f"--dynamic {spec!r}: axis {axis} of {name} is given twice")
            dynamic.setdefault(name, {})[axis] = label.strip() or f"{name}_dim{axis}"
    _require_equal_sizes(dynamic, named)
    return dynamic


def _require_equal_sizes(dynamic: dict[str, dict[int, str]], named) -> None:
    """Axes given one name are one size (the export says so): names on axes whose sizes differ
    in the example contradict it."""
    sizes: dict[str, dict[str, int]] = {}  # name -> "input axis N" -> its size
    for name, axes in dynamic.items():
        for axis, label in axes.items():
            sizes.setdefault(label, {})[f"{name} axis {axis}"] = int(named[name].shape[axis])
    for label, found in sizes.items():
        if len(set(found.values())) > 1:
            listed = ", ".join(f"{where} ({size})" for where, size in found.items())
            raise UsageError(
                f"--dynamic: {label!r} names axes of different sizes in the example: {listed}; "
                "one name marks one size"
            )


def _file_hint(module_name: str, attribute: str) -> str:
    """The way on for a file name given where a module name belongs (`m.py:make`)."""
    stem, _, suffix = module_name.rpartition(".")
    if suffix == "py" and stem and Path(*stem.split(".")).with_suffix(".py").is_file():
        return f" (a module is named without .py: give {stem}:{attribute})"
    return ""


def _import_target(target: str):
    module_name, _, attribute = require_target(target).partition(":")
    # Like `python -m`, the current folder is importable, so a user's own package is found.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    importlib.invalidate_caches()  # files written since the interpreter started are found
    with calling_user_code(f"{target}: importing {module_name!r}"):  # its top level runs
        try:
            python_module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            hint = _file_hint(module_name, attribute)
            raise UsageError(f"{target}: cannot import {module_name!r}: {exc}{hint}") from None
    try:
        factory = getattr(python_module, attribute)
    except AttributeError:
        raise UsageError(f"{target}: {module_name!r} has no attribute {attribute!r}") from None
    if isinstance(factory, nn.Module):
        raise UsageError(
            f"{target}: is a module instance, not a factory; name a function that returns "
            "(module, example_inputs)"
        )
    if not callable(factory):
        raise UsageError(f"{target}: {type(factory).__name__} is not callable")
    return factory


def load_factory(target: str) -> tuple[nn.Module, object | None, dict[str, dict[int, str]]]:
    """Call PACKAGE.MODULE:FACTORY; it returns (module, example_inputs), (module,
    example_inputs, dynamic axes: {input: {axis: name}}) or just the module. -> (module,
    example_inputs or None, the axes it declares or {})."""
    factory = _import_target(target)
    with calling_user_code(f"{target}: the factory"):
        made = factory()
    if inspect.iscoroutine(made):
        made.close()  # never awaited: closed, so that Python does not warn about it on stderr
        raise UsageError(f"{target}: the factory is async; name a plain function")
    if isinstance(made, nn.Module):
        return made, None, {}
    if isinstance(made, tuple) and len(made) in (2, 3) and isinstance(made[0], nn.Module):
        declared = made[2] if len(made) == 3 else {}
        return made[0], made[1], _declared_axes(target, declared)
    returned = type(made).__name__
    if isinstance(made, tuple) and len(made) in (2, 3):  # the right shape, the wrong first item
        returned = f"a {len(made)}-tuple whose first item is a {type(made[0]).__name__}"
    raise UsageError(
        f"{target}: the factory returned {returned}, not a torch.nn.Module, "
        "(module, example_inputs) or (module, example_inputs, dynamic_axes)"
    )


def _declared_axes(target: str, declared: object) -> dict[str, dict[int, str]]:
    """A factory's dynamic axes, {input: {axis: name}} (a list of axes names them NAME_dimK)."""
    shape = f"{target}: the dynamic axes must be {{input: {{axis: name}}}}"
    if not isinstance(declared, dict):
        raise UsageError(f"{shape}, not {type(declared).__name__}")
    axes: dict[str, dict[int, str]] = {}
    for name, found in declared.items():
        if isinstance(found, list | tuple):
            found = {axis: f"{name}_dim{axis}" for axis in found}
        if not isinstance(name, str) or not isinstance(found, dict):
            raise UsageError(f"{shape}; {name!r} holds {type(found).__name__}")
        if not all(isinstance(a, int) and isinstance(n, str) for a, n in found.items()):
            raise UsageError(f"{shape}; {name!r}: axes are integers, names text")
        axes[name] = dict(found)
    return axes


def require_dense(value: torch.Tensor, what: str) -> None:
    """A module's input or output that tconform can compare and ONNX can carry: a dense tensor
    of bool, integer or floating-point numbers (never complex, quantised or sparse)."""
    if value.is_complex() or value.is_quantized or value.layout != torch.strided:
        raise UsageError(
            f"{what} is a {str(value.dtype).removeprefix('torch.')} "
            f"{str(value.layout).removeprefix('torch.')} tensor; tconform checks dense "
            "tensors of bool, integer or floating-point numbers"
        )
    if value.is_meta:
        raise UsageError(f"{what} is on the meta device: a shape without values; give values")


def require_materialised(module: nn.Module, where: str) -> None:
    """A module with values in its parameters and buffers: one on the meta device (made under
    accelerate's init_empty_weights, or with device="meta") has shapes and no values, and
    every run of it fails far from the cause ("Cannot copy out of meta tensor")."""
    empty = [name for name, t in (*module.named_parameters(), *module.named_buffers()) if t.is_meta]
    if empty:
        named = ", ".join(empty[:3]) + (", ..." if len(empty) > 3 else "")
        raise UsageError(
            f"{where}: {len(empty)} parameter(s) and buffer(s) of the module are on the meta "
            f"device, shapes without values ({named}); give them values first "
            "(module.to_empty(device='cpu'), then load or initialise its weights)"
        )


def require_label(label: object, what: str) -> None:
    """An axis's name is text that names (it becomes the export's dim_param), without the
    separators of --dynamic NAME=AXIS:LABEL,...: `0:b:c` is a mistake to say, not an axis
    named "b:c"."""
    if not (
        isinstance(label, str)
        and label.strip()
        and label.isprintable()
        and not any(mark in label for mark in ":,=")
    ):
        raise UsageError(
            f"{what}: {label!r:.60} is not an axis name (printable text without ':', ',' or '=')"
        )


def require_axis(axis: int, name: str, rank: int, what: str) -> None:
    """An axis of input `name` (of rank `rank`), counted from either end, as `what` gives it."""
    if not -rank <= axis < rank:
        raise UsageError(f"{what}: axis {axis} out of range for {name} (rank {rank})")
