"""The reference for any module: a float64 copy of it, run in eager mode.

The copy is `copy.deepcopy(module).double().eval()`; floating-point inputs are cast to float64,
integer and boolean inputs are passed unchanged. Its outputs are then exact to about 1e-16
relative per operation, so the float32 error of any runtime stands out against them.

Limits (docs/check.md, "The oracle"):
- ops without a float64 kernel (some quantised or fused ops) cannot run in the copy;
- a module that creates float32 tensors in forward or branches on dtype computes something else
  (or mixes dtypes and raises) in float64;
- randomness: the copy runs in eval mode (dropout off); a module that draws random numbers in
  eval mode is caught by running the copy twice;
- PyTorch's fused "fast path" of nn.TransformerEncoderLayer / nn.MultiheadAttention is switched
  off while the reference runs, so that the reference is the plain composition of its
  submodules (the same function) and forward hooks see every submodule.
Where the float64 copy cannot run, the reference falls back to the module in float32 (its own
dtype), and every result says `reference: float32`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from tconform.errors import UsageError
from tconform.module_check.inputs import ModuleInputs


def flatten_outputs(out: object, prefix: str = "output") -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor in a module's output, in the order the exporters flatten
    it: a tensor is `output`, a tuple gives output_0, output_1, ..., a dict its keys; anything
    that is not a tensor (None, numbers) is left out, as the exporters leave it out."""
    if isinstance(out, torch.Tensor):
        return [(prefix, out)]
    if isinstance(out, dict):
        items = [(str(k) if prefix == "output" else f"{prefix}.{k}", v) for k, v in out.items()]
    elif isinstance(out, (tuple, list)):
        items = [(f"{prefix}_{i}", v) for i, v in enumerate(out)]
    else:
        return []
    return [pair for name, value in items for pair in flatten_outputs(value, name)]


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """The module in eval mode for the duration, each submodule's own mode restored after."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, training in modes:
            m.training = training


@contextlib.contextmanager
def plain_composition() -> Iterator[None]:
    """PyTorch's fused Transformer fast path off (it skips the submodules' forward)."""
    mha = torch.backends.mha
    previous = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(previous)


def module_device(module: nn.Module) -> torch.device:
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def floating_dtype(module: nn.Module) -> torch.dtype:
    """The module's first floating-point parameter or buffer dtype (float32 when it has none)."""
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


def run_module(module: nn.Module, inputs: ModuleInputs) -> list[tuple[str, torch.Tensor]]:
    with torch.no_grad():
        return flatten_outputs(module(*inputs.args, **inputs.kwargs))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


@dataclass
class Reference:
    """What the outputs are judged against."""

    module: nn.Module  # the copy that ran, in eval mode
    inputs: ModuleInputs  # its inputs (floats in float64 for the float64 reference)
    outputs: dict[str, np.ndarray]  # name -> float64 array
    kind: str  # "float64", or "float32" where the float64 copy could not run
    notes: list[str] = field(default_factory=list)

    def run(self, inputs: ModuleInputs | None = None) -> list[tuple[str, torch.Tensor]]:
        with eval_mode(self.module), plain_composition():
            return run_module(self.module, inputs or self.inputs)


def _as_float64(outputs: list[tuple[str, torch.Tensor]]) -> dict[str, np.ndarray]:
    return {
        name: t.detach().cpu().to(torch.float64 if t.is_floating_point() else t.dtype).numpy()
        for name, t in outputs
    }


def _float64_copy(module: nn.Module, inputs: ModuleInputs) -> Reference:
    copied = copy.deepcopy(module).double().eval()
    converted = inputs.converted(torch.float64, module_device(module))
    with plain_composition():
        outputs = run_module(copied, converted)
    narrow = [n for n, t in outputs if t.is_floating_point() and t.dtype != torch.float64]
    if narrow:
        raise TypeError(
            f"output {narrow[0]} came back in {dict(outputs)[narrow[0]].dtype}, not float64 "
            "(the module casts or creates tensors of a fixed dtype)"
        )
    return Reference(copied, converted, _as_float64(outputs), "float64")


def _float32_fallback(module: nn.Module, inputs: ModuleInputs, why: str) -> Reference:
    try:
        copied = copy.deepcopy(module).eval()
    except Exception:  # a module that cannot be copied is used itself, in eval mode
        copied = module
    converted = inputs.converted(None, module_device(module))
    with eval_mode(copied), plain_composition():
        outputs = run_module(copied, converted)
    note = f"reference: float32 (the module in its own dtype), since the float64 copy {why}"
    return Reference(copied, converted, _as_float64(outputs), "float32", [note])


def _differences(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    worst = 0.0
    for name, x in a.items():
        y = b[name]
        if x.shape != y.shape:
            return float("inf")
        same = (x == y) | (np.isnan(x) & np.isnan(y)) if x.dtype.kind == "f" else x == y
        if not same.all():
            with np.errstate(invalid="ignore"):
                worst = max(worst, float(np.nanmax(np.abs(x - y))) if x.dtype.kind == "f" else 1.0)
    return worst


def build_reference(module: nn.Module, inputs: ModuleInputs, label: str) -> Reference:
    """The float64 reference of `module` at `inputs` (float32 where float64 cannot run).

    Raises UsageError when the module is not deterministic in eval mode: no reference exists.
    """
    try:
        reference = _float64_copy(module, inputs)
    except Exception as exc:  # no float64 kernel, a dtype clash, a module that cannot be copied
        reference = _float32_fallback(module, inputs, f"could not run: {_first_line(exc)}")
    if module.training:
        reference.notes.append(
            "the module was in training mode; tconform checks it in eval mode (dropout off, "
            "batch norm on running statistics), as it exports it"
        )
    again = _as_float64(reference.run())
    if _differences(reference.outputs, again) != 0.0:
        raise UsageError(
            f"{label}: the module is not deterministic in eval mode: two runs of its "
            f"{reference.kind} copy differ by up to {_differences(reference.outputs, again):.3g} "
            "(random numbers in forward?); no reference exists to judge it against"
        )
    return reference
