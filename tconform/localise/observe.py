"""The plain run beside the observed one.

Localisation reads boundary tensors from a copy of the model that returns them as extra graph
outputs. That copy is not the model that ran: ONNX Runtime cannot fuse a node whose output is a
graph output (an Add exposed as a LayerNorm's input stays an Add instead of becoming part of a
SkipLayerNormalization), and the field reports mismatches that vanish once outputs are marked
(TensorRT #4400 and #3645, OpenVINO #25744). So the model also runs as it is, twice (the second
run measures its own run-to-run noise), and the observed run's final outputs are compared with
it: where they differ beyond that noise by more than the tolerance allows, or one passes where
the other fails, the observed boundary values are not those of the run being judged, and
localisation names a module by isolation alone.

Padded positions' outputs are whatever a framework computes there (no framework defines them):
where the model takes an attention mask, boundaries are compared at its real positions only, and
a failure of the plain run that lies only at padded positions names no module.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from tconform.compare import Tolerance, expanded_mask, mask_like
from tconform.execution import Subject, open_subject
from tconform.localise.judge import clamped, compare_boundary
from tconform.models import ModelUnderTest
from tconform.runtimes import Runtime


@dataclass
class PlainRun:
    outputs: dict[str, np.ndarray]  # the model's float outputs, by name
    noise: dict[str, np.ndarray]  # |first run - second run|, per element


def plain_run(
    model: ModelUnderTest, runtime: Runtime, feeds: dict[str, np.ndarray], names: list[str]
) -> PlainRun:
    """The model as it is on `runtime`, run twice: its outputs `names` and their run-to-run
    noise (zero on a deterministic provider)."""
    with open_subject(runtime, Subject(model)) as opened:
        first = opened.run(feeds, names)
        second = opened.run(feeds, names)
    outputs, noise = {}, {}
    for name in names:
        a, b = first[name], second[name]
        if a.dtype.kind == "f":
            outputs[name] = a
            with np.errstate(invalid="ignore"):
                noise[name] = np.nan_to_num(np.abs(clamped(a, a.dtype) - clamped(b, a.dtype)))
    return PlainRun(outputs, noise)


@dataclass
class Observer:
    """The observed run's final outputs against the plain run's."""

    max_diff: float  # the largest |observed - plain| of any output element
    noise: float  # the largest |plain - plain again|: the plain run's own noise
    used: float  # the largest share of the tolerance the difference beyond that noise takes
    verdicts_differ: bool  # an output within tolerance in one run and outside it in the other

    @property
    def changed(self) -> bool:
        """Whether observing changed the run: its boundary values are then not the judged
        run's, and only isolation names a module."""
        return self.verdicts_differ or self.used > 1.0

    def describe(self) -> str:
        noise = (
            "the plain run repeats itself exactly"
            if self.noise == 0
            else f"the plain run's own noise {self.noise:.3g}"
        )
        share = "inf" if math.isinf(self.used) else f"{self.used:.1%}"
        line = (
            f"the run with the boundaries as outputs differs from the plain run by at most "
            f"{self.max_diff:.3g} ({share} of the tolerance beyond the noise; {noise})"
        )
        if self.verdicts_differ:
            line += "; an output passes in one run and fails in the other"
        return line

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["used"] = None if math.isinf(self.used) else self.used
        data["changed"] = self.changed
        return data


def observer(
    observed: dict[str, np.ndarray],
    plain: PlainRun,
    expected: dict[str, np.ndarray],
    tol: Tolerance,
    keep: np.ndarray | None,
) -> Observer:
    """`observed` (the final outputs of a run with the boundaries as outputs) against `plain`;
    `expected`: the reference's outputs, by the same names, for the verdicts."""
    max_diff = noise = used = 0.0
    verdicts_differ = False
    for name, plain_value in plain.outputs.items():
        seen = clamped(observed[name], plain_value.dtype)
        base = clamped(plain_value, plain_value.dtype)
        with np.errstate(invalid="ignore"):
            diff = np.nan_to_num(np.abs(seen - base), nan=math.inf)
        beyond = np.maximum(diff - plain.noise[name], 0.0)
        allowed = tol.atol + tol.rtol * np.abs(np.nan_to_num(base))
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(allowed > 0, beyond / allowed, np.where(beyond > 0, math.inf, 0.0))
        if keep is not None and base.shape[: keep.ndim] == keep.shape:
            share = np.where(expanded_mask(keep, base.ndim), share, 0)
        if diff.size:
            max_diff = max(max_diff, float(diff.max()))
            noise = max(noise, float(plain.noise[name].max()))
            used = max(used, float(share.max()))
        statuses = {
            compare_boundary(name, value, expected[name], tol, keep=keep).status
            for value in (observed[name], plain_value)
        }
        verdicts_differ = verdicts_differ or len(statuses) > 1
    return Observer(max_diff, noise, used, verdicts_differ)


def padding_mask(feeds: dict[str, np.ndarray]) -> tuple[str, np.ndarray | None]:
    """(the input, its real positions) of the first input named like a mask (attention_mask)
    that holds a (batch, sequence) array of integer 0s and 1s with a 0 in it: transformers'
    padding convention, 1 a real token; ("", None) where there is none. Boolean masks are left
    out, since PyTorch's (key_padding_mask) mean the opposite, True for padding."""
    for name, value in feeds.items():
        value = np.asarray(value)
        integers = value.dtype.kind in "iu"
        if "mask" in name.lower() and integers and mask_like(value) and not value.all():
            return name, value != 0
    return "", None


def fails_only_where_padded(
    plain: PlainRun, expected: dict[str, np.ndarray], tol: Tolerance, keep: np.ndarray
) -> bool:
    """Whether the plain run's outputs leave tolerance, but not at the real positions `keep`."""
    if not all(v.shape[: keep.ndim] == keep.shape for v in plain.outputs.values()):
        return False
    everywhere = [compare_boundary(n, v, expected[n], tol) for n, v in plain.outputs.items()]
    real = [compare_boundary(n, v, expected[n], tol, keep=keep) for n, v in plain.outputs.items()]
    return any(c.status == "fail" for c in everywhere) and all(c.status == "pass" for c in real)
