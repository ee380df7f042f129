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
Where the float64 copy cannot run, or gives NaN or infinity where the module itself is finite
(a module that computes parts in a fixed dtype: transformers' RMSNorm, rotary embeddings and
softmax upcast to float32, where float64's mask fill becomes -inf), the module itself in its
own dtype stands in for it, and every result says so and why (`reference: float32`, the JSON
field naming what it was judged against).

The copy runs once with every module call captured (tconform.localise.capture: localisation's
reference side), once more to see that it is deterministic, and is then dropped.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from tconform.errors import UsageError, calling_user_code, first_line
from tconform.localise.capture import Call, ModuleTree, capture_calls
from tconform.module_check.inputs import ModuleInputs
from tconform.provenance import ModelProvenance, module_provenance
from tconform.runtimes.torch import DTYPES, eval_mode, flatten_outputs, plain_composition


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
    """What the outputs are judged against: the copy's outputs, and every module call it made
    (localisation's reference side). The copy itself is not kept: on a large model it is twice
    the model's size."""

    outputs: dict[str, np.ndarray]  # name -> float64 array
    kind: str  # "float64", or the module's own dtype where the float64 copy could not run
    calls: list[Call]
    tree: ModuleTree
    provenance: ModelProvenance  # the copy that ran
    notes: list[str] = field(default_factory=list)


def _as_float64(outputs: list[tuple[str, torch.Tensor]]) -> dict[str, np.ndarray]:
    return {
        name: t.detach().cpu().to(torch.float64 if t.is_floating_point() else t.dtype).numpy()
        for name, t in outputs
    }


def _run_copy(copied: nn.Module, inputs: ModuleInputs, kind: str, notes: list[str]) -> Float64Copy:
    """Run the copy once with every call captured, once more to see that it is deterministic."""
    calls, out = capture_calls(copied, inputs.args, inputs.kwargs)
    outputs = flatten_outputs(out)
    narrow = [n for n, t in outputs if t.is_floating_point() and t.dtype != DTYPES[kind]]
    if kind == "float64" and narrow:
        raise TypeError(
            f"output {narrow[0]} came back in {dict(outputs)[narrow[0]].dtype}, not float64 "
            "(the module casts or creates tensors of a fixed dtype)"
        )
    first = _as_float64(outputs)
    with eval_mode(copied), plain_composition(), torch.no_grad():
        again = _as_float64(flatten_outputs(copied(*inputs.args, **inputs.kwargs)))
    worst = _differences(first, again)
    if worst != 0.0:
        raise NotDeterministic(worst)
    return Float64Copy(
        first, kind, calls, ModuleTree.of(copied), module_provenance(copied, kind), notes
    )


class NotDeterministic(Exception):
    def __init__(self, worst: float) -> None:
        super().__init__(f"two runs differ by up to {worst:.3g}")
        self.worst = worst


def _copy_in_float64(module: nn.Module, inputs: ModuleInputs) -> Float64Copy:
    # deepcopy takes each parameter and floating buffer from the memo as a float64 tensor made
    # from the original, never through a float32 copy first: on a large model that copy would
    # be the largest allocation of the run. (Tied weights stay tied: one memo entry each.)
    memo: dict[int, object] = {}
    for tensor in (*module.parameters(), *module.buffers()):
        if id(tensor) not in memo and tensor.is_floating_point():
            double = tensor.detach().to(torch.float64, copy=True)
            memo[id(tensor)] = (
                nn.Parameter(double, tensor.requires_grad)
                if isinstance(tensor, nn.Parameter)
                else double
            )
    copied = copy.deepcopy(module, memo).double().eval()
    converted = inputs.converted(torch.float64, module_device(module))
    return _run_copy(copied, converted, "float64", [])


def _float32_fallback(module: nn.Module, inputs: ModuleInputs, why: str) -> Float64Copy:
    try:
        copied = copy.deepcopy(module).eval()
    except Exception:  # a module that cannot be copied is used itself, in eval mode
        copied = module
    converted = inputs.converted(None, module_device(module))
    kind = str(floating_dtype(module)).removeprefix("torch.")
    note = f"reference: {kind} (the module in its own dtype), since the float64 copy {why}"
    return _run_copy(copied, converted, kind, [note])


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


def _nonfinite_where_finite(
    reference: dict[str, np.ndarray], own: dict[str, np.ndarray]
) -> str | None:
    """The first output that the float64 copy makes NaN or infinite where the module itself
    (in its own dtype) is finite: the copy then computes something else (a module that
    computes parts in a fixed dtype: a mask fill of float64's minimum cast to float32 is -inf,
    and a fully masked softmax row NaN)."""
    for name, value in reference.items():
        mine = own.get(name)
        if mine is None or value.dtype.kind != "f" or mine.shape != value.shape:
            continue
        if (~np.isfinite(value) & np.isfinite(mine.astype(np.float64))).any():
            return name
    return None


def build_float64_copy(
    module: nn.Module,
    inputs: ModuleInputs,
    label: str,
    own: dict[str, np.ndarray] | None = None,
) -> Float64Copy:
    """The float64 copy of `module` at `inputs` (the module in float32 where float64 cannot
    run, or gives NaN or infinity where the module's own outputs `own` are finite).

    Raises UsageError when the module is not deterministic in eval mode: nothing exists to
    judge it against.
    """
    with calling_user_code(f"{label}: its float64 copy"):
        try:
            try:
                copy64 = _copy_in_float64(module, inputs)
            except NotDeterministic:
                raise
            except Exception as exc:  # no float64 kernel, a dtype clash, not copyable
                copy64 = _float32_fallback(module, inputs, f"could not run: {first_line(exc)}")
            else:
                odd = _nonfinite_where_finite(copy64.outputs, own or {})
                if odd is not None:
                    copy64 = _float32_fallback(
                        module,
                        inputs,
                        f"gives NaN or infinity in {odd} where the module itself is finite (it "
                        "computes parts in a fixed dtype)",
                    )
        except NotDeterministic as exc:
            raise UsageError(
                f"{label}: the module is not deterministic in eval mode: {exc} (random numbers "
                "in forward?); nothing exists to judge it against"
            ) from None
    if module.training:
        copy64.notes.append(
            "the module was in training mode; tconform checks it in eval mode (dropout off, "
            "batch norm on running statistics), as it exports it"
        )
    return copy64
