"""The float64 copy of any module, run in eager mode: what `tconform check` judges a module's
runtimes against (verify judges the shipped cases against the float64 NumPy oracle instead).

The copy is `copy.deepcopy(module).double().eval()`; floating-point inputs are cast to float64,
integer and boolean inputs are passed unchanged. Its outputs are then exact to about 1e-16
relative per operation, so the float32 error of any runtime stands out against them.

Limits (docs/check.md, "The float64 copy"):
- ops without a float64 kernel (some quantised or fused ops) cannot run in the copy;
- a module that creates float32 tensors in forward or branches on dtype computes something else
  (or mixes dtypes and raises) in float64;
- randomness: the copy runs in eval mode (dropout off); a module that draws random numbers in
  eval mode is caught by running the copy twice;
- PyTorch's fused "fast path" of nn.TransformerEncoderLayer / nn.MultiheadAttention is switched
  off while the copy runs, so that it is the plain composition of its submodules (the same
  function) and forward hooks see every submodule.
Where the float64 copy cannot run, the module itself in float32 (its own dtype) stands in for
it, and every result says so (`reference: float32`, the JSON field naming what it was judged
against).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from tconform.errors import UsageError, calling_user_code, first_line
from tconform.module_check.inputs import ModuleInputs
from tconform.runtimes.torch import eval_mode, flatten_outputs, plain_composition


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


@dataclass
class Float64Copy:
    """What the outputs are judged against."""

    module: nn.Module  # the copy that ran, in eval mode
    inputs: ModuleInputs  # its inputs (floats in float64 for the float64 copy)
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


def _copy_in_float64(module: nn.Module, inputs: ModuleInputs) -> Float64Copy:
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
    return Float64Copy(copied, converted, _as_float64(outputs), "float64")


def _float32_fallback(module: nn.Module, inputs: ModuleInputs, why: str) -> Float64Copy:
    try:
        copied = copy.deepcopy(module).eval()
    except Exception:  # a module that cannot be copied is used itself, in eval mode
        copied = module
    converted = inputs.converted(None, module_device(module))
    with eval_mode(copied), plain_composition():
        outputs = run_module(copied, converted)
    note = f"reference: float32 (the module in its own dtype), since the float64 copy {why}"
    return Float64Copy(copied, converted, _as_float64(outputs), "float32", [note])


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


def build_float64_copy(module: nn.Module, inputs: ModuleInputs, label: str) -> Float64Copy:
    """The float64 copy of `module` at `inputs` (the module in float32 where float64 cannot
    run). UsageError when the module is not deterministic in eval mode: nothing exists to
    judge it against."""
    with calling_user_code(f"{label}: its float64 copy"):
        try:
            copy64 = _copy_in_float64(module, inputs)
        except Exception as exc:  # no float64 kernel, a dtype clash, a module not copyable
            copy64 = _float32_fallback(module, inputs, f"could not run: {first_line(exc)}")
    if module.training:
        copy64.notes.append(
            "the module was in training mode; tconform checks it in eval mode (dropout off, "
            "batch norm on running statistics), as it exports it"
        )
    with calling_user_code(f"{label}: its {copy64.kind} copy"):
        again = _as_float64(copy64.run())
    if _differences(copy64.outputs, again) != 0.0:
        raise UsageError(
            f"{label}: the module is not deterministic in eval mode: two runs of its "
            f"{copy64.kind} copy differ by up to {_differences(copy64.outputs, again):.3g} "
            "(random numbers in forward?); nothing exists to judge it against"
        )
    return copy64
