"""The reference side of localisation: every module call's floating-point inputs and outputs,
kept as float64 copies while the reference runs.

Copies, not views: a later in-place op (`ReLU(inplace=True)`, `out += identity`) rewrites the
storage a module returned, and a view would then record what the tensor became rather than
what the module produced. One tensor seen twice unchanged (the output of one module passed to
the next) is copied once: tensors are keyed by identity and PyTorch's in-place version counter.
"""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from tconform.runtimes.torch_session import eval_mode, flatten_outputs, plain_composition


@dataclass
class Call:
    """One call of one module in the reference: its floating-point inputs (positional, then
    keyword, in the order given) and outputs (flattened: tuples, dicts, ModelOutputs)."""

    path: str  # "" for the module itself
    call: int  # 0 for its first call, 1 for its second, ...
    calls: int  # how many times the module ran
    cls: str
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]


@dataclass
class ModuleTree:
    """What localisation needs of the module besides its calls: every submodule's path and
    class, and the names of the parameters each holds itself (to find a weight the exporter
    fused into another module's node)."""

    classes: dict[str, str] = field(default_factory=dict)  # path -> class
    parameters: dict[str, list[str]] = field(default_factory=dict)  # path -> own param names

    @classmethod
    def of(cls, module: nn.Module) -> ModuleTree:
        tree = cls()
        for path, sub in module.named_modules():
            kind = type(sub)
            tree.classes[path] = f"{kind.__module__}.{kind.__qualname__}"
            tree.parameters[path] = [name for name, _ in sub.named_parameters(recurse=False)]
        return tree


class _Copies:
    """float64 copies of tensors, one per (tensor, in-place version). A weak reference tells a
    live tensor from a new one that reuses a freed tensor's id, without keeping it alive."""

    def __init__(self) -> None:
        self._kept: dict[tuple[int, int], tuple[weakref.ref, np.ndarray]] = {}

    def __call__(self, tensors: list[torch.Tensor]) -> list[np.ndarray]:
        found = []
        for t in tensors:
            key = (id(t), t._version)
            seen = self._kept.get(key)
            if seen is None or seen[0]() is not t:
                copy = t.detach().to(device="cpu", dtype=torch.float64, copy=True).numpy()
                seen = self._kept[key] = (weakref.ref(t), copy)
            found.append(seen[1])
        return found


def _float_tensors(value: object) -> list[torch.Tensor]:
    unique: dict[int, torch.Tensor] = {}
    for _, t in flatten_outputs(value):
        if t.is_floating_point():
            unique.setdefault(id(t), t)
    return list(unique.values())


def capture_calls(module: nn.Module, args: tuple, kwargs: dict) -> tuple[list[Call], object]:
    """Run `module(*args, **kwargs)` (eval mode, PyTorch's fused fast path off) with every
    call's float inputs and outputs kept; returns the calls, in the order they finish, and the
    module's output."""
    paths = {id(m): name for name, m in module.named_modules()}
    counts: Counter[str] = Counter()
    open_calls: list[tuple[str, int, list[np.ndarray]]] = []
    finished: list[tuple[str, int, str, list[np.ndarray], list[np.ndarray]]] = []
    copies = _Copies()

    def before(mod, args, kwargs):
        path = paths[id(mod)]
        open_calls.append((path, counts[path], copies(_float_tensors((args, kwargs)))))
        counts[path] += 1

    def after(mod, args, kwargs, output):
        path, call, ins = open_calls.pop()
        outs = copies([t for _, t in flatten_outputs(output) if t.is_floating_point()])
        kind = type(mod)
        finished.append((path, call, f"{kind.__module__}.{kind.__qualname__}", ins, outs))

    handles = []
    for m in module.modules():
        handles.append(m.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(m.register_forward_hook(after, with_kwargs=True))
    try:
        with eval_mode(module), plain_composition(), torch.no_grad():
            output = module(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    calls = [Call(p, c, counts[p], cls, ins, outs) for p, c, cls, ins, outs in finished]
    return calls, output
