"""The shapes a user's model is checked at: the example's, and shapes it never had.

An export fixed at the example's shape is the most common surprise after an export ("works only
at the export shape"; "a batch gives other results than one sample"). So a model's inputs keep
their batch and sequence axes free, and the check runs at batch 1, at a larger batch, at a
shorter and at a longer sequence, and checks that row i of a batch equals the run of row i alone.

Which axes are free: those the factory declares (a third item, {input: {axis: name}}) or
`--dynamic NAME=AXES` names; for every other input they are inferred from the example:
- batch: axis 0 of every input, where all inputs of rank >= 1 share their leading size;
- sequence: axis 1 of every input whose axis 1 has the size of the integer or boolean inputs'
  axis 1 (token ids, attention masks), where those share one size.
Nothing else is guessed: an image's height, a vocabulary. A shape the module itself cannot take
(a sequence beyond its positions) is left out with the reason, never run.

Every other shape is made from the example's own values, so that it stays valid input for the
model (token ids in its vocabulary, masks of 0 and 1): batch 1 is row 0; the larger batch is the
example followed by its rows in reverse; the shorter sequence its first half; the longer one the
sequence twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from tconform.module_check.inputs import ModuleInputs

BATCH, SEQUENCE = "batch", "seq"
Axes = dict[str, dict[int, str]]  # input -> {axis: name}


def infer_axes(inputs: ModuleInputs, declared: Axes) -> Axes:
    """`declared` (kept as given) plus the batch and sequence axes of every other input."""
    named = inputs.named()
    axes: Axes = {name: dict(found) for name, found in declared.items()}
    free = {name: t for name, t in named.items() if name not in declared and t.dim() >= 1}
    leading = {t.shape[0] for t in named.values() if t.dim() >= 1}
    if free and len(leading) == 1:
        for name in free:
            axes.setdefault(name, {})[0] = BATCH
    tokens = {t.shape[1] for t in named.values() if t.dim() == 2 and not t.is_floating_point()}
    if len(tokens) == 1:
        length = tokens.pop()
        for name, t in free.items():
            if t.dim() >= 2 and t.shape[1] == length:
                axes.setdefault(name, {})[1] = SEQUENCE
    return axes


def unseen_sequence(inputs: ModuleInputs, axes: Axes) -> str:
    """Why no sequence shape is checked though the module reads token ids ('' where one is, or
    none are read): its integer inputs' axis 1 sizes differ (an encoder-decoder's source and
    target ids), so no length is taken for the sequence."""
    if any(SEQUENCE in found.values() for found in axes.values()):
        return ""
    tokens = {
        name: t.shape[1]
        for name, t in inputs.named().items()
        if t.dim() == 2 and not t.is_floating_point()
    }
    if len(set(tokens.values())) < 2:
        return ""
    sizes = ", ".join(f"{name} {size}" for name, size in tokens.items())
    return (
        f"seq-N: not checked: no sequence axis was inferred, its integer inputs' axis 1 sizes "
        f"differ ({sizes}); one name marks one size, so name one input's axis seq and each "
        "other length's a name of its own (--dynamic NAME=0:batch,1:seq --dynamic "
        "OTHER=0:batch,1:tgt, or the factory's third item): the seq axis is varied, the "
        "others kept free"
    )


def without_batch(axes: Axes, declared: Axes) -> Axes:
    """`axes` without the batch axes it inferred (those `declared` stay as given)."""
    kept: Axes = {}
    for name, found in axes.items():
        own = {
            a: label for a, label in found.items() if label != BATCH or a in declared.get(name, {})
        }
        if own:
            kept[name] = own
    return kept


@dataclass(frozen=True)
class Variant:
    """Inputs at one shape: `name` is the input set's name (e.g. batch-1, seq-24)."""

    name: str
    inputs: ModuleInputs


def _along(inputs: ModuleInputs, axes: Axes, label: str, change) -> ModuleInputs:
    """`inputs` with `change(tensor, axis)` applied along every axis named `label`."""

    def changed(name: str, tensor: torch.Tensor) -> torch.Tensor:
        for axis, found in axes.get(name, {}).items():
            if found == label:
                tensor = change(tensor, axis)
        return tensor

    named = inputs.named()
    args = tuple(changed(name, named[name]) for name in inputs.arg_names)
    kwargs = {name: changed(name, named[name]) for name in inputs.kwargs}
    return ModuleInputs(args, kwargs, inputs.arg_names)


def row_of(inputs: ModuleInputs, axes: Axes, row: int) -> ModuleInputs:
    """Row `row` of the batch of `inputs`, as a batch of one."""
    return _along(inputs, axes, BATCH, lambda t, a: t.narrow(a, row, 1))


def input_axis_size(inputs: ModuleInputs, axes: Axes, label: str) -> int | None:
    """axis_size of `inputs` as they are."""
    return axis_size({name: tuple(t.shape) for name, t in inputs.named().items()}, axes, label)


def axis_size(shapes: Mapping[str, Sequence[int]], axes: Axes, label: str) -> int | None:
    """The size of the axes named `label` (batch, seq) in inputs of these `shapes` (None where
    no input has one)."""
    for name, found in axes.items():
        for axis, axis_label in found.items():
            if axis_label == label and name in shapes:
                return int(shapes[name][axis])
    return None


def variants(inputs: ModuleInputs, axes: Axes) -> list[Variant]:
    """The shapes beside the example's: batch 1 and a larger batch where a batch axis is free,
    a shorter and a longer sequence where a sequence axis is."""
    found = []
    batch = input_axis_size(inputs, axes, BATCH)
    if batch:  # an empty batch (0) has no rows to take or repeat
        if batch > 1:
            found.append(Variant("batch-1", row_of(inputs, axes, 0)))
        larger = _along(inputs, axes, BATCH, lambda t, a: torch.cat([t, t.flip(a)], dim=a))
        found.append(Variant(f"batch-{2 * batch}", larger))
    length = input_axis_size(inputs, axes, SEQUENCE)
    if length:
        if length > 1:
            half = max(1, length // 2)
            shorter = _along(inputs, axes, SEQUENCE, lambda t, a: t.narrow(a, 0, half))
            found.append(Variant(f"seq-{half}", shorter))
        longer = _along(inputs, axes, SEQUENCE, lambda t, a: torch.cat([t, t], dim=a))
        found.append(Variant(f"seq-{2 * length}", longer))
    return found


def batch_axes(inputs: ModuleInputs, axes: Axes) -> dict[str, int]:
    """Each input's batch axis (inputs without one are shared by every row)."""
    return {
        name: axis
        for name, found in axes.items()
        for axis, label in found.items()
        if label == BATCH and name in inputs.names
    }
