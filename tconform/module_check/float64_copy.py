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

The copy runs twice, to see that it is deterministic, and is then dropped. Localisation's
reference side (every module call's inputs and outputs, tconform.localise.capture) comes from a
new copy run once more, only when a localisation asks for it.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from tconform.errors import UsageError, calling_user_code, first_line
from tconform.localise.capture import Call, ModuleTree, capture_calls
from tconform.module_check.inputs import ModuleInputs
from tconform.provenance import ModelProvenance, module_provenance
from tconform.runtimes.torch_session import DTYPES, eval_mode, flatten_outputs, plain_composition


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


def run_module(module: nn.Module, inputs: ModuleInputs) -> object:
    """The module's output as it returns it."""
    with torch.no_grad():
        return module(*inputs.args, **inputs.kwargs)


@dataclass
class Float64Copy:
    """What the outputs are judged against: the copy's outputs, and, on demand, every module
    call it makes (localisation's reference side). Neither the copy nor its calls are kept: on
    a large model the copy is twice the model's size, and on a large input every call's float64
    inputs and outputs are many times the input, which a check that localises nothing never
    needs. `calls` runs a new copy once more with every call captured."""

    outputs: dict[str, np.ndarray]  # name -> float64 array
    kind: str  # "float64", or the module's own dtype where the float64 copy could not run
    tree: ModuleTree
    provenance: ModelProvenance  # the copy that ran
    capture: Callable[[], list[Call]] = field(repr=False)
    notes: list[str] = field(default_factory=list)
    _calls: list[Call] | None = field(default=None, repr=False)

    @property
    def calls(self) -> list[Call]:
        """Every module call of the reference, captured at the first use (the run must give
        the outputs judged: NotDeterministic otherwise)."""
        if self._calls is None:
            self._calls = self.capture()
        return self._calls


def _as_float64(outputs: list[tuple[str, torch.Tensor]]) -> dict[str, np.ndarray]:
    return {
        name: t.detach().cpu().to(torch.float64 if t.is_floating_point() else t.dtype).numpy()
        for name, t in outputs
    }


class NotDeterministic(Exception):
    def __init__(self) -> None:
        super().__init__("two runs give different outputs")


def _in_float64(module: nn.Module) -> nn.Module:
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
    return copy.deepcopy(module, memo).double().eval()


def _in_own_dtype(module: nn.Module) -> nn.Module:
    try:
        return copy.deepcopy(module).eval()
    except Exception:  # a module that cannot be copied is used itself, in eval mode
        return module


def _reference(module: nn.Module, inputs: ModuleInputs, kind: str):
    """The reference module and its inputs: the float64 copy, or the module in its own dtype."""
    copied = _in_float64(module) if kind == "float64" else _in_own_dtype(module)
    return copied, _inputs_for(module, inputs, kind)


def _inputs_for(module: nn.Module, inputs: ModuleInputs, kind: str) -> ModuleInputs:
    """A fresh copy of the reference's inputs (a module may change what it is given)."""
    return inputs.converted(torch.float64 if kind == "float64" else None, module_device(module))


def _run_copy(module: nn.Module, inputs: ModuleInputs, kind: str, notes: list[str]) -> Float64Copy:
    """Run the reference twice, to see that it is deterministic; its calls are captured only
    where localisation asks for them (Float64Copy.calls)."""
    copied, converted = _reference(module, inputs, kind)
    with eval_mode(copied), plain_composition(), torch.no_grad():
        outputs = flatten_outputs(copied(*converted.args, **converted.kwargs))
        narrow = [n for n, t in outputs if t.is_floating_point() and t.dtype != DTYPES[kind]]
        if kind == "float64" and narrow:
            raise TypeError(
                f"output {narrow[0]} came back in {dict(outputs)[narrow[0]].dtype}, not float64 "
                "(the module casts or creates tensors of a fixed dtype)"
            )
        # Only a fingerprint of the first run is kept while the second runs, whose outputs are
        # the reference: two copies of a large output at once would be the run's peak.
        first = _fingerprint(_as_float64(outputs))
        del outputs
        converted = _inputs_for(module, inputs, kind)
        kept = _as_float64(flatten_outputs(copied(*converted.args, **converted.kwargs)))
    if _fingerprint(kept) != first:
        raise NotDeterministic()

    def capture() -> list[Call]:
        copied, converted = _reference(module, inputs, kind)
        calls, out = capture_calls(copied, converted.args, converted.kwargs)
        if _fingerprint(_as_float64(flatten_outputs(out))) != first:
            raise NotDeterministic()
        return calls

    return Float64Copy(
        kept, kind, ModuleTree.of(copied), module_provenance(copied, kind), capture, notes
    )


def _own_dtype_fallback(module: nn.Module, inputs: ModuleInputs, why: str) -> Float64Copy:
    kind = str(floating_dtype(module)).removeprefix("torch.")
    note = f"reference: {kind} (the module in its own dtype), since the float64 copy {why}"
    return _run_copy(module, inputs, kind, [note])


def _fingerprint(outputs: dict[str, np.ndarray]) -> str:
    """sha256 over each output's name, dtype, shape and values (every NaN alike), read a
    chunk at a time."""
    digest = hashlib.sha256()
    for name, value in outputs.items():
        digest.update(f"{name}:{value.dtype}:{value.shape}".encode())
        flat = value.reshape(-1)
        for start in range(0, flat.size, FINGERPRINT_CHUNK):
            part = flat[start : start + FINGERPRINT_CHUNK]
            if part.dtype.kind == "f":
                part = np.where(np.isnan(part), np.nan, part)
            digest.update(np.ascontiguousarray(part).tobytes())
    return digest.hexdigest()


FINGERPRINT_CHUNK = 1 << 20


def _nonfinite_where_finite(
    reference: dict[str, np.ndarray], own_finite: dict[str, np.ndarray]
) -> str | None:
    """The first output that the float64 copy makes NaN or infinite where the module itself
    (in its own dtype) is finite (`own_finite`: where it is, per output): the copy then
    computes something else (a module that computes parts in a fixed dtype: a mask fill of
    float64's minimum cast to float32 is -inf, and a fully masked softmax row NaN)."""
    for name, value in reference.items():
        finite = own_finite.get(name)
        if finite is None or value.dtype.kind != "f" or finite.shape != value.shape:
            continue
        if (~np.isfinite(value) & finite).any():
            return name
    return None


def build_float64_copy(
    module: nn.Module,
    inputs: ModuleInputs,
    label: str,
    own_finite: dict[str, np.ndarray] | None = None,
) -> Float64Copy:
    """The float64 copy of `module` at `inputs` (the module in its own dtype where float64
    cannot run, or gives NaN or infinity where the module's own outputs are finite: where
    `own_finite` is true, per output; a mask, not the outputs, since a large output is kept
    as little as possible).

    Raises UsageError when the module is not deterministic in eval mode: nothing exists to
    judge it against.
    """
    with calling_user_code(f"{label}: its float64 copy"):
        try:
            try:
                copy64 = _run_copy(module, inputs, "float64", [])
            except NotDeterministic:
                raise
            except Exception as exc:  # no float64 kernel, a dtype clash, not copyable
                copy64 = _own_dtype_fallback(module, inputs, f"could not run: {first_line(exc)}")
            else:
                odd = _nonfinite_where_finite(copy64.outputs, own_finite or {})
                if odd is not None:
                    copy64 = _own_dtype_fallback(
                        module,
                        inputs,
                        f"gives NaN or infinity in {odd} where the module itself is finite (in "
                        "float64 it computes something else: parts in a fixed dtype, or a mask "
                        "fill at the dtype's minimum that overflows, leaving a fully masked row "
                        "NaN)",
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
