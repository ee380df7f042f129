"""A user's model as a suite: one case, its module judged against the module's own float64 copy.

The case's input sets are the example's and, where its batch and sequence axes are free, the
shapes it never had (tconform.module_check.shapes), each with the float64 copy's outputs, and
the batch-consistency set (row i of a batch against row i run alone). Its cells are those of the
request's axes: the one export of a plain run (in the export folder itself), or every cell of
`--matrix` (each under <export folder>/matrix/<cell>/): the float32 export, float16 and int8
made from it with ONNX Runtime's own tools (float16-planned and int8-planned leaving in float32
the modules a precision plan names: tconform.module_check.precision_plan), the module exported
in bfloat16. A given model (`--model`) is the case's model as it is. The PyTorch runtimes run
the module itself, in its own dtype and on its own device. Localisation compares every module
call of the float64 copy, on the input set that failed, with the model's boundary tensors.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from tconform.check_folder import require_repro_folder
from tconform.compare import Tolerance, judge_outputs, rms_of, tolerance_for, tolerance_value
from tconform.config import PLANNED_DTYPES
from tconform.errors import (
    EndedByUserCode,
    TconformError,
    UsageError,
    calling_user_code,
    first_line,
)
from tconform.execution import BatchRows, InputSet, Judge, row_axis
from tconform.golden import InputSet as ExpectedSet
from tconform.localise import ISOLATE, Localisation, localise
from tconform.models import ModelUnderTest, given_file, read_graph
from tconform.module_check.convert import CONVERTED, DTYPES, ConversionFailed, convert
from tconform.module_check.exporting import (
    EXPORTERS,
    MATRIX,
    ExportFailed,
    check_opset,
    export_folder,
    export_lock,
    export_module,
    record_own_files,
    require_own_export_folder,
)
from tconform.module_check.float64_copy import (
    Float64Copy,
    build_float64_copy,
    floating_dtype,
    module_device,
    run_module,
)
from tconform.module_check.inputs import (
    ModuleInputs,
    as_inputs,
    parse_dynamic,
    require_axis,
    require_dense,
    require_label,
)
from tconform.module_check.precision_plan import PrecisionPlan, make_plan
from tconform.module_check.shapes import (
    BATCH,
    SEQUENCE,
    batch_axes,
    infer_axes,
    input_axis_size,
    row_of,
    unseen_sequence,
    variants,
    without_batch,
)
from tconform.plan import Lane, Progress, Suite, matrix_cells
from tconform.request import Axes, Request, UserModel
from tconform.results import Result, Status
from tconform.runtimes import ModuleTarget, Runtime, make_runtime, make_runtimes
from tconform.runtimes.torch import TorchRuntime
from tconform.runtimes.torch_session import DTYPES as TORCH_DTYPES
from tconform.runtimes.torch_session import eval_mode, flatten_outputs, opaque_outputs
from tconform.units import GIVEN, Cell

AUTO = "auto"  # the exporter setting that tries dynamo, then TorchScript where dynamo fails
ROWS_ALONE = 8  # the example's rows each run alone to find a module that mixes them
# The tolerance row of a module nobody has measured: the loosest float32 row (a whole model).
TOLERANCE_CLASS = "model"
EXAMPLE = "example"
BATCH_CONSISTENCY = "batch-consistency"


@dataclass(frozen=True)
class ModuleCase:
    name: str  # the factory (PACKAGE.MODULE:FACTORY) or the module's name
    component: str  # the module's class
    tolerance: str = TOLERANCE_CLASS


@dataclass(frozen=True)
class Tolerances:
    """The tolerances of a user's model: the "model" row of tconform.compare.TOLERANCES for the
    run's precision, unless atol/rtol override it, then per-output overrides."""

    outputs: tuple[str, ...]
    atol: float | None = None
    rtol: float | None = None
    per_output: tuple[tuple[str, tuple[float, float]], ...] = ()

    def __post_init__(self) -> None:
        # Finite and >= 0 whoever gives them (the command line's types check the same): NaN
        # passes nothing, infinity everything, and a report holds neither.
        for what in ("atol", "rtol"):
            value = getattr(self, what)
            if value is not None:
                object.__setattr__(self, what, tolerance_value(value, what))
        checked = []
        for item in self.per_output:
            try:
                name, (atol, rtol) = item
            except (TypeError, ValueError):
                raise UsageError(f"tolerances: {item!r} is not OUTPUT: (ATOL, RTOL)") from None
            where = f"--tolerance {name}"
            atol = tolerance_value(atol, f"{where} atol")
            checked.append((name, (atol, tolerance_value(rtol, f"{where} rtol"))))
            if name not in self.outputs:
                raise UsageError(
                    f"--tolerance {name}=...: the module has no output {name!r} "
                    f"(its outputs: {', '.join(self.outputs)})"
                )
        object.__setattr__(self, "per_output", tuple(checked))

    def module(self, precision: str) -> Tolerance:
        """For the module as a whole (and every boundary localisation compares). A precision
        with no row (float64: a module that computes in float64) is judged by bounds the user
        gives, both --atol and --rtol or every output's own (the widest of them here), or not
        at all."""
        if self.atol is not None and self.rtol is not None:
            return Tolerance(self.atol, self.rtol, "set by the user", given=True)
        overrides = dict(self.per_output)
        try:
            row = tolerance_for(precision, TOLERANCE_CLASS)
        except UsageError:
            if set(overrides) == set(self.outputs):  # every output's bounds given: the widest
                atol, rtol = (max(bounds) for bounds in zip(*overrides.values(), strict=True))
                return Tolerance(atol, rtol, "the widest of the outputs' own, set by the user",
                                 given=True)  # fmt: skip
            raise UsageError(
                f"results computed in {precision} have no tolerance row in tconform (docs/"
                "tolerances.md): give both bounds, --atol and --rtol (tconform.check(atol=..., "
                "rtol=...)) or --tolerance for every output, or check the module's float32 copy "
                "(model.float(), float32 inputs)"
            ) from None
        if self.atol is None and self.rtol is None:
            # The row's own reason describes tconform's Transformer, not the user's module.
            why = f"tconform's {precision} {TOLERANCE_CLASS} row, check's default"
            return replace(row, why=why)
        # The row's atol keeps scaling to each output's RMS; an atol the user set is theirs.
        return Tolerance(
            row.atol if self.atol is None else self.atol,
            row.rtol if self.rtol is None else self.rtol,
            "set by the user",
            atol_rms=row.atol_rms if self.atol is None else None,
            given=True,  # either part: an rtol of 1 or more cannot see an error either
        )

    def boundaries(self, precision: str, outputs: Iterable[np.ndarray]) -> Tolerance:
        """For every tensor localisation compares at a module's boundary. An atol the user set
        is for the module's `outputs`: inside, it stands for their scale (the smallest RMS
        among them) and is scaled to each boundary's as a row's atol is, so that a hidden state
        of RMS 1 in a model whose outputs are 1e-7 is not held to 1e-7."""
        tol = self.module(precision)
        scales = [scale for scale in map(rms_of, outputs) if scale]
        if self.atol is None or not scales:
            return tol
        return replace(tol, atol_rms=min(scales))

    def by_output(self, precision: str) -> dict[str, Tolerance]:
        overrides = dict(self.per_output)
        return {
            name: Tolerance(*overrides[name], "set by the user for this output", given=True)
            if name in overrides
            else self.module(precision)
            for name in self.outputs
        }


def run_eagerly(module: nn.Module, inputs: ModuleInputs, name: str):
    """The module as it is (its own dtype, eval mode): its outputs."""
    with calling_user_code(f"{name}: the module rejects its inputs"), eval_mode(module):
        returned = run_module(module, inputs)
    for output, kind in opaque_outputs(returned):
        # refused before the export, which would fail on it with every exporter
        cache = " (a transformers model: use_cache=False)" if kind.endswith("Cache") else ""
        raise UsageError(
            f"{name}: output {output} is a {kind}, which no ONNX exporter can return; return "
            f"tensors, or tuples, lists and dicts of them{cache}"
        )
    outputs = flatten_outputs(returned)
    if not outputs:
        raise UsageError(f"{name}: the module returns no tensor")
    for output, value in outputs:
        require_dense(value, f"{name}: output {output!r}")
    return outputs


class ModuleSuite(Suite):
    """`module` called with `example_inputs` (a tensor, a tuple of tensors, or a dict of
    keyword tensors), as `request`'s UserModel describes it; `declared`: dynamic axes the
    factory declared ({input: {axis: name}})."""

    def __init__(
        self,
        request: Request,
        module: nn.Module,
        example_inputs: object,
        progress: Progress,
        declared: dict[str, dict[int, str]] | None = None,
        locks: contextlib.ExitStack | None = None,
    ) -> None:
        subject = request.subject
        # where the export folder's lock is held, from the first export to the run's end
        self.locks = locks if locks is not None else contextlib.ExitStack()
        assert isinstance(subject, UserModel)
        self.request, self.subject, self.module = request, subject, module
        name = self.where = subject.target
        self.inputs = as_inputs(module, example_inputs, name)
        cls = type(module)
        self.case = ModuleCase(name, f"{cls.__module__}.{cls.__qualname__}")
        self.cases = (self.case,)
        self.notes: list[str] = []
        if request.localise.isolate not in ISOLATE:
            raise UsageError(f"isolate {request.localise.isolate!r}: one of {', '.join(ISOLATE)}")
        self.export_dir = export_folder(name, subject.out_dir)
        if subject.model is None:
            require_own_export_folder(self.export_dir)  # before anything slow runs
        if request.localise.repro is not None:
            read = [subject.model or self.export_dir, *([subject.inputs] if subject.inputs else [])]
            require_repro_folder(request.localise.repro, read)
        given = {**(declared or {}), **parse_dynamic(subject.dynamic, self.inputs)}
        named = self.inputs.named()
        for input_name, axes in given.items():
            if input_name not in named:
                raise UsageError(f"dynamic axes: the module has no input {input_name!r}")
            rank = named[input_name].dim()
            for axis, label in axes.items():  # the factory's as --dynamic's
                require_axis(axis, input_name, rank, "dynamic axes")
                require_label(label, "dynamic axes")
            given[input_name] = {axis % rank: label for axis, label in axes.items()}
        self.declared = given
        self.axes = infer_axes(self.inputs, given) if subject.shapes else given
        if subject.shapes and (unseen := unseen_sequence(self.inputs, self.axes)):
            self.notes.append(unseen)
        if subject.shapes and given and input_axis_size(self.inputs, self.axes, BATCH) is None:
            self.notes.append(  # the batch is inferred only for inputs whose axes are not given
                "batch-N, batch-consistency: not checked: the axes given (--dynamic or the "
                "factory's) name no batch axis, and none is inferred for an input whose axes "
                "are given (add NAME=0:batch to free it)"
            )
        self.references: dict[str, Float64Copy] = {}
        self.sets: list[InputSet] = []
        self._exported: dict[Path, ModelUnderTest] = {}
        # model key -> (status, why) where its converter or exporter failed
        self._failed: dict[tuple[str, str], tuple[Status, str]] = {}
        self._locked = False
        self.exported_with: str | None = None  # the exporter that ran (auto: which one)
        self.exporter_reason = ""  # why it is not the one asked for ("" when it is)
        self.export_axes: dict[str, dict[int, str]] = {}  # the axes the export kept free
        # the given inputs' set is named after their file, as `--inputs` names it
        self.example = subject.inputs.name if subject.inputs is not None else EXAMPLE
        progress(f"{name}: running the module in eager mode")
        self.output_names = self._add_set(self.example, self.inputs, progress)
        self.tolerances = Tolerances(
            tuple(self.output_names),
            request.tolerances.atol,
            request.tolerances.rtol,
            request.tolerances.per_output,
        )
        if subject.padding_mask is not None and subject.padding_mask not in self.inputs.names:
            raise UsageError(
                f"--padding-mask {subject.padding_mask}: the module has no input of that name "
                f"(its inputs: {', '.join(self.inputs.names)})"
            )
        if subject.shapes:
            self._add_shapes(progress)

    # --- input sets -------------------------------------------------------------------------

    def _add_set(self, set_name: str, inputs: ModuleInputs, progress: Progress) -> list[str]:
        """Run the module and its float64 copy at `inputs`; keep them as the input set
        `set_name`. The module's output names."""
        names, reference = self._reference(set_name, inputs, progress)
        self.references[set_name] = reference
        self.sets.append(ExpectedSet(set_name, inputs.feeds(), reference.outputs))
        return names

    def _reference(self, what: str, inputs: ModuleInputs, progress: Progress):
        """(the module's output names, its float64 copy's run) at `inputs`."""
        own = run_eagerly(
            self.module, inputs.converted(None, module_device(self.module)), self.where
        )
        finite = {n: torch.isfinite(t).cpu().numpy() for n, t in own if t.is_floating_point()}
        names = [n for n, _ in own]
        del own
        progress(f"{self.where}: running its float64 copy ({what})")
        return names, build_float64_copy(self.module, inputs, self.where, finite)

    def _rows_alone(self, rows: int, progress: Progress) -> dict[int, object]:
        """The float64 copy's run of each of the example's rows 1.. alone (row 0 alone is
        batch-1), up to ROWS_ALONE: a row the module sends elsewhere when it runs alone (a
        branch on the whole batch's sum) mixes the batch's rows as much as a centring does."""
        found = {}
        for row in range(1, min(rows, ROWS_ALONE)):
            try:
                _, found[row] = self._reference(
                    f"row {row} alone", row_of(self.inputs, self.axes, row), progress
                )
            except (EndedByUserCode, KeyboardInterrupt):
                raise
            except TconformError:  # as batch-1 did not: that row is not compared
                continue
        return found

    def _add_shapes(self, progress: Progress) -> None:
        """The shapes the example never had, where the module runs at them, and the batch
        consistency of the larger batch."""
        others = [
            f"{name} axis {axis} ({label})"
            for name, found in self.axes.items()
            for axis, label in found.items()
            if label not in (BATCH, SEQUENCE)
        ]
        if others:  # free in the export, yet no input set has another size there
            self.notes.append(
                f"{', '.join(others)}: free in the export, not checked at another size (the "
                f"shapes vary the axes named {BATCH!r} and {SEQUENCE!r}; name one so to vary it)"
            )
        size = _nbytes(self.inputs)
        refused: set[str] = set()  # the shapes the module itself rejects
        for variant in variants(self.inputs, self.axes):
            if size > LARGER_SHAPES_BUDGET and _nbytes(variant.inputs) > size:
                self.notes.append(
                    f"{variant.name}: not checked: the example's inputs hold {size / 2**20:.0f} "
                    "MiB, and a larger shape would multiply the check's memory (the smaller "
                    "shapes are checked)"
                )
                continue
            try:
                self._add_set(variant.name, variant.inputs, progress)
            except (EndedByUserCode, KeyboardInterrupt):
                raise
            except TconformError as exc:
                self.notes.append(f"{variant.name}: not checked: {_said(exc)}")
                refused.add(variant.name)
                continue
            if variant.name.startswith("batch-") and "batch-1" in refused:
                self.notes.append(
                    f"{BATCH_CONSISTENCY}: not checked: it runs each row of {variant.name} as a "
                    "batch of one, which the module rejects (batch-1)"
                )
            elif variant.name.startswith("batch-") and variant.name != "batch-1":
                rows = batch_axes(variant.inputs, self.axes)
                count = next(iter(variant.inputs.named()[n].shape[a] for n, a in rows.items()))
                mixed = self._mixed_rows(variant.name, count, progress)
                feeds = variant.inputs.feeds()
                self.sets.append(BatchRows(BATCH_CONSISTENCY, feeds, rows, count, mixed=mixed))

    def _mixed_rows(self, larger: str, count: int, progress: Progress) -> tuple[str, ...]:
        """The outputs in which the module itself mixes its batch's rows: the larger batch is
        the example's rows, then the same rows in reverse (tconform.module_check.shapes.
        variants), yet its reference at either end is not theirs run as the example, as
        batch-1 or each row alone (a module that centres its batch; one whose row depends on
        the rows before it, as a recurrent net or a cumulative sum along a sequence-first axis
        0, which only the reversed end shows; one that branches on the whole batch). Their
        batch consistency is not the runtime's to keep: noted, and not judged. Each output is
        compared along its own row axis (row_axis)."""
        theirs = self.references[larger]
        alone = self._rows_alone(count // 2, progress)
        against = [  # (reference, how many rows it holds, the first of them in the batch)
            (self.references.get(self.example), count // 2, 0),
            (self.references.get("batch-1"), 1, 0),
            *((reference, 1, row) for row, reference in alone.items()),
        ]
        mixed = []
        for name, whole in theirs.outputs.items():
            whole = np.asarray(whole, dtype=np.float64)  # a bool or integer output subtracts too
            for ours, rows, start in against:
                part = ours.outputs.get(name) if ours is not None else None
                axis = None if part is None else row_axis(whole.shape, part.shape, count, rows)
                if axis is None:
                    continue
                part = np.asarray(part, dtype=np.float64)
                # of the output's RMS: float64's rounding where both are float64 copies, else
                # the module's own dtype's (one set's copy may have fallen back to it)
                both64 = ours.kind == theirs.kind == "float64"
                noise = 1e-9 if both64 else 1e-3
                scale = float(np.sqrt(np.mean(np.square(part)))) if part.size else 0.0
                ends = (np.flip(whole, axis) if end else whole for end in (False, True))
                taken = range(start, start + rows)
                differ = max(
                    np.nanmax(np.abs(np.take(end, taken, axis) - part), initial=0.0) for end in ends
                )
                if differ > noise * max(scale, 1e-300):
                    mixed.append(name)
                    break
        if mixed:
            self.notes.append(
                f"{BATCH_CONSISTENCY}: {', '.join(mixed)} not judged: the module mixes the rows "
                f"of its batch there (its reference's rows at {larger} differ from the same rows "
                f"run as a smaller batch), so a row run alone is rightly another value"
                f"{self._batch_guess_note(mixed)}"
            )
        return tuple(mixed)

    def _batch_guess_note(self, mixed: list[str]) -> str:
        """Where every output mixes the rows along a batch axis tconform inferred (axis 0 of
        every input), that axis is likely no batch at all: a sequence-first module's."""
        inferred = sorted(
            f"{name} axis {axis}"
            for name, found in self.axes.items()
            for axis, label in found.items()
            if label == BATCH and axis not in self.declared.get(name, {})
        )
        if not inferred or set(mixed) != set(self.references[self.example].outputs):
            return ""
        return (
            f"; {', '.join(inferred)} was taken for the batch (every input leads with that size) "
            "and mixes rows in every output, so it is likely not the batch (a sequence-first "
            "module's): name the axes with --dynamic NAME=AXIS:batch,AXIS:seq (or the "
            "factory's third item) and the shapes vary those"
        )

    # --- planning ---------------------------------------------------------------------------

    def cells(self, axes: Axes) -> list[Cell]:
        if axes.matrix:
            return matrix_cells(axes)
        return [Cell(axes.exporters[0], axes.opsets[0], axes.dtypes[0], axes.graph_opts[0])]

    def not_applicable(self, cell: Cell) -> str:
        if cell.dtype not in DTYPES:
            return f"no {cell.dtype} model of a user's module (dtypes: {', '.join(DTYPES)})"
        if cell.exporter not in (*EXPORTERS, AUTO):
            return f"no exporter {cell.exporter!r} (exporters: {', '.join((*EXPORTERS, AUTO))})"
        try:
            check_opset("dynamo" if cell.exporter == AUTO else cell.exporter, cell.opset)
        except UsageError as exc:
            return str(exc)
        own = module_dtype(self.module)
        if own != "float32" and cell.dtype not in ("float32", own):
            # the converters read float32 tensors: another module's export comes out unchanged
            return (
                f"the module computes in {own}: a {cell.dtype} model is made from a float32 "
                "module (check module.float() for it)"
            )
        return ""

    def given(self, case: ModuleCase) -> bool:
        return self.subject.model is not None

    def module_runtimes(self, requested: list[Runtime]) -> list[Runtime]:
        """The module runtimes once each, on the module's own device and in its own dtype:
        they check the module as the user runs it."""
        device = module_device(self.module)
        own = {"dtype": module_dtype(self.module), "device_id": device.index or 0}
        names = dict.fromkeys(r.name for r in requested if r.consumes == "module")
        covered = {device.type, *(r.ep for r in requested if r.name not in names)}
        missing = sorted({r.ep for r in requested} - covered)
        if names and missing:  # nothing would run on a provider asked for: its pass unearned
            raise UsageError(
                f"--ep {','.join(missing)}: no runtime asked for runs there: the module is on "
                f"{device.type}, where {', '.join(names)} run it (as you do); ask for --ep "
                f"{device.type}, move the module in the factory, or add an ONNX runtime "
                "(--runtime onnxruntime)"
            )
        return [make_runtime(name, device.type, **own) for name in names]

    def row(self, case: ModuleCase) -> Result:
        reference = self.references[self.example]
        notes = [*reference.notes, *self.notes]
        if self.subject.padding_mask is not None:
            notes.append(
                f"--padding-mask {self.subject.padding_mask}: outputs led by its (batch, "
                "sequence) shape are compared at the real positions only"
            )
        return Result.about(case.name, case.component, notes=notes, reference=reference.kind)

    def set_names(self, case: ModuleCase) -> list[str]:
        return [s.name for s in self.sets]

    # --- models -----------------------------------------------------------------------------

    def models(
        self, lanes: list[Lane], mine: set[str], progress: Progress
    ) -> dict[tuple[str, str], ModelUnderTest]:
        if self.subject.model is not None:
            given = given_file(Path(self.subject.model))
            self._require_the_modules_outputs(given.path)
            return {(self.case.name, GIVEN): given}
        if not self._locked:  # a second run into the folder waits until this one ends
            self.locks.enter_context(export_lock(self.export_dir))
            self._locked = True
        cells = {
            lane.export.export_key: lane.export
            for lane in lanes
            if lane.export is not None and not lane.not_applicable
        }
        plain = not self.request.axes.matrix and len(cells) == 1
        models: dict[tuple[str, str], ModelUnderTest] = {}
        for key, cell in cells.items():
            folder = self.export_dir if plain and cell.dtype == "float32" else self._cell_dir(cell)
            try:
                models[(self.case.name, key)] = self._model(cell, folder, progress)
            except (ConversionFailed, ExportFailed) as exc:  # that cell's verdict: the others run
                typed = _type_not_in_opset(str(exc), cell.opset)
                if isinstance(exc, ExportFailed) and len(cells) == 1:
                    if typed:  # the one model asked for: the run cannot go on
                        raise ExportFailed(f"{exc}; {typed}") from None
                    raise
                progress(f"{self.where}: {exc}")
                failed = (Status.SKIP, typed) if typed else (Status.ERROR, str(exc))
                self._failed[(self.case.name, key)] = failed
        return models

    def _require_the_modules_outputs(self, path: Path) -> None:
        """A given model returns as many outputs as the module (matched by name, else by
        position): one more would be judged against nothing (a KeyError at the batch checks),
        one fewer leaves an output unchecked."""
        found = [value.name for value in read_graph(path).graph.output]
        ours = list(self.output_names)
        twice = sorted({name for name in found if found.count(name) > 1})
        if twice:  # one tensor listed twice is judged as two: one output of the module unchecked
            raise UsageError(f"{path}: the model lists output {', '.join(twice)} twice")
        if len(found) != len(ours):
            raise UsageError(
                f"{path}: the model returns {len(found)} output{'' if len(found) == 1 else 's'} "
                f"({', '.join(found)}); "
                f"the module returns {len(ours)} ({', '.join(ours)}): --model takes an export "
                "of this module"
            )

    def run(
        self, lane: Lane, models: dict, sets: list[InputSet], strict_placement: bool
    ) -> list[Result]:
        """The lane's results, or where its model's converter or exporter failed, an error on
        each set (a skip where the cell cannot exist: a type its opset's operator lacks)."""
        failed = self._failed.get(lane.model_key)
        if failed is None:
            results = super().run(lane, models, sets, strict_placement)
            for r in results:  # each set's own: a float64 copy may fail at one shape only
                if r.input_set in self.references:
                    r.reference = self.references[r.input_set].kind
            self._not_against_itself(lane.runtime, results)
            planned = {v: k for k, v in PLANNED_DTYPES.items()}.get(
                lane.export and lane.export.dtype
            )
            for r in results:  # a plain conversion that fails: the way on is its plan
                if planned and r.status == Status.FAIL:
                    r.message += (
                        f" (--dtype {planned} keeps in float32 the modules that leave the "
                        f"{lane.export.dtype} row)"
                    )
            hint = self._size_one_hint()
            for r in results:
                if hint and r.input_set != self.example and r.status == Status.ERROR:
                    r.message += f" ({hint})"
            return results
        row = self.row(lane.case)
        status, message = failed
        return [
            replace(
                row, runtime=lane.runtime.name, ep=lane.runtime.ep, input_set=s.name,
                status=status, message=message, precision=lane.precision,
                notes=list(row.notes),
            )
            for s in sets
        ]  # fmt: skip

    def _not_against_itself(self, runtime: Runtime, results: list[Result]) -> None:
        """Where the reference is the module in its own dtype (its float64 copy could not
        run, or gave NaN where it is finite), torch eager in that dtype is the reference
        itself: its pass would be the module compared with itself, so it checked nothing."""
        if not (isinstance(runtime, TorchRuntime) and runtime.eager):
            return
        for r in results:
            reference = self.references.get(r.input_set)
            if r.status == Status.PASS and reference and reference.kind == runtime.dtype:
                r.status, r.outputs = Status.SKIP, []  # no figures: nothing was measured
                why = (
                    "a float64 module is its own float64 copy"
                    if reference.kind == "float64"
                    else "see the notes for why its float64 copy is not"
                )
                r.message = (
                    f"not checked: the reference is this module itself in {reference.kind} "
                    f"({why}), so the row would compare it with itself"
                )

    def _size_one_hint(self) -> str:
        """Why a model may break at the other shapes when the example holds a free axis at size
        1 (a Segformer traced at batch 1 kept its input's batch free and fixed it in a Reshape):
        '' where none is."""
        for label in (BATCH, SEQUENCE):
            if input_axis_size(self.inputs, self.axes, label) == 1:
                return (
                    f"the example's {label} is 1, and an export traced at size 1 may fix that "
                    "dimension inside its graph while its input stays free (torch.export "
                    f"specialises sizes 0 and 1): trace it with an example of {label} 2 or more"
                )
        return ""

    def _cell_dir(self, cell: Cell) -> Path:
        return self.export_dir / MATRIX / cell.export_key

    def _model(self, cell: Cell, folder: Path, progress: Progress) -> ModelUnderTest:
        """The case's model in `cell`: exported into `folder`, or converted there from the
        float32 export of the cell's exporter and opset (with a precision plan, for the
        planned dtypes)."""
        if cell.dtype in (*CONVERTED, *PLANNED_DTYPES):
            float32 = replace(cell, dtype="float32")
            base = self._model(float32, self._cell_dir(float32), progress)
            require_own_export_folder(folder)
            folder.mkdir(parents=True, exist_ok=True)  # the quantiser writes no folder
            notes: tuple[str, ...] = ()
            planned = PLANNED_DTYPES.get(cell.dtype)  # the precision a plan is made for
            if planned:
                notes = (self._plan(base.path, planned, folder, progress).summary,)
            else:
                progress(f"{self.where}: converting to {cell.dtype} into {folder}")
                notes = convert(base.path, cell.dtype, folder / "model.onnx")
            record_own_files(folder)  # so that the next run may replace them
            model = replace(
                given_file(folder / "model.onnx", origin="exported"),
                notes=notes,
                fixed_way_on=base.fixed_way_on,  # the converted graph keeps its base's shapes
            )
            return _planned(model, planned) if planned else model
        path = folder / "model.onnx"
        if path in self._exported:
            return self._exported[path]
        module, inputs = self.module, self.inputs.converted(None, module_device(self.module))
        if cell.dtype == "bfloat16":
            module = copy.deepcopy(self.module).to(TORCH_DTYPES["bfloat16"])
            inputs = self.inputs.converted(TORCH_DTYPES["bfloat16"], module_device(self.module))
        ran, why = self._export(module, inputs, path, cell, progress)
        model = given_file(path, origin="exported")
        notes = tuple(n for n in (why,) if n)
        way_on = self._fixed_way_on(ran, cell)
        self._exported[path] = replace(model, notes=notes, fixed_way_on=way_on)
        self.exported_with, self.exporter_reason = ran, why
        return self._exported[path]

    def _fixed_way_on(self, ran: str, cell: Cell) -> str:
        """The way on for a dimension the export left static: an example not of size 1 where
        it was traced at 1 (--dynamic traces at 1 too); where the exporter could not keep an
        axis free that it was asked to, not the option that asks it (the note says why it
        failed), but the exporter not yet tried; else '' (that option)."""
        size_one = self._size_one_hint()
        if size_one:
            return size_one
        if self.export_axes == self.axes:
            return ""
        if ran == "dynamo":  # TorchScript was not tried at these axes
            return "dynamo could not export it free, as the note says; --exporter torchscript may"
        if cell.exporter == AUTO:
            return "neither dynamo nor TorchScript could export it free, as the note says"
        return "TorchScript could not export it free, as the note says; --exporter dynamo may"

    def _plan(self, base: Path, precision: str, folder: Path, progress) -> PrecisionPlan:
        """The precision plan of the float32 export `base` in `precision`, made on the example
        and the first ONNX runtime asked for: the planned model and plan.json into `folder`."""
        progress(f"{self.where}: planning {precision} into {folder}")
        reference, feeds, keep = self._at(self.example)
        runtime = make_runtimes(self.request.runtimes, consumes="onnx")[0]
        tol = self.tolerances.boundaries(precision, reference.outputs.values())
        return make_plan(
            base, precision, reference, feeds, runtime, tol, folder, keep, self.example, progress
        )

    def _export(self, module, inputs, path: Path, cell: Cell, progress) -> tuple[str, str]:
        """Export with the cell's exporter keeping the free axes free; where the export cannot
        keep the inferred ones, at the example's shape but for the axes declared. "auto" tries
        dynamo at each of those before TorchScript: TorchScript can trace a length into the
        graph while declaring its axis free, which then errs at every other length (a Funnel
        model). (the exporter that ran, why: '' unless it had to fall back)."""
        attempts = [(self.axes, "")]
        unbatched = without_batch(self.axes, self.declared)
        if unbatched not in (self.axes, self.declared):  # a traced batch of 1 fixed: keep seq
            attempts.append((unbatched, "the inferred batch axis could not stay free"))
        if self.axes != self.declared:
            attempts.append(
                (self.declared, "the inferred batch and sequence axes could not stay free")
            )
        exporters = (cell.exporter,) if cell.exporter != AUTO else ("dynamo", "torchscript")
        failures: dict[str, UsageError] = {}  # each exporter's last (at the fewest free axes)
        for exporter in exporters:
            failed = None
            for axes, because in attempts:
                try:
                    frozen = self._export_with(module, inputs, path, cell, exporter, axes, progress)
                    if axes != self.declared:
                        _require_batch_kept_free(path, self.inputs, axes)
                except EndedByUserCode:
                    raise  # the module ended itself: no exporter's limit to get round
                except UsageError as exc:
                    failures[exporter] = failed = exc
                    continue
                fixed = (  # the failure without its way on, which names the options given
                    f"exported at the example's shape ({because}: {self._reason(failed)})"
                    if because
                    else ""
                )
                fell_back = (
                    "exported by TorchScript (--exporter auto), since dynamo failed: "
                    f"{self._reason(failures['dynamo'])}"
                    if exporter != exporters[0]
                    else ""
                )
                traced = (
                    f"the TorchScript tracer froze values of the example ({'; '.join(frozen)}): "
                    "this graph takes the example's branches whatever its inputs, so inputs "
                    "that take others are not checked"
                    if frozen
                    else ""
                )
                self.export_axes = axes
                return exporter, "; ".join(w for w in (fell_back, fixed, traced) if w)
            if cell.exporter == AUTO and exporter == "dynamo":
                progress(f"{self.where}: dynamo failed; exporting with torchscript (auto)")
        raise _both_failed(failures, self._reason)

    def _reason(self, exc: UsageError) -> str:
        """An export's error without the model's name and its log's path."""
        return str(exc).split(" (full log:")[0].removeprefix(f"{self.where}: ")

    def _export_with(self, module, inputs, path, cell: Cell, exporter: str, axes, progress):
        opset = cell.opset if exporter == "dynamo" else min(cell.opset, 20)
        auto = " (auto)" if cell.exporter == AUTO else ""
        progress(f"{self.where}: exporting with {exporter} to {path}{auto}")
        return export_module(
            module, inputs, self.output_names, path, exporter, opset, axes, self.where
        )

    # --- running ----------------------------------------------------------------------------

    def input_sets(self, case: ModuleCase) -> list[InputSet]:
        return self.sets

    def module_target(self, case: ModuleCase) -> ModuleTarget:
        inputs, module = self.inputs, self.module
        return ModuleTarget(
            lambda: module,
            args=inputs.arg_names,
            kwargs=tuple(inputs.kwargs),
            floats=frozenset(n for n, t in inputs.named().items() if t.is_floating_point()),
            outputs=tuple(self.output_names),
        )

    def judge(self, case: ModuleCase) -> Judge:
        tolerances = self.tolerances
        return judge_outputs(
            lambda precision, output: tolerances.by_output(precision)[output],
            self.subject.padding_mask,
            self.output_names,
        )

    def localise(
        self, runtime: Runtime, model: ModelUnderTest, results: list[Result], sets
    ) -> list[Localisation]:
        """The first failing input set of the lane (the example, where every result passed
        and localisation is asked for always) against the float64 copy's calls there."""
        when = self.request.localise.when
        failing = [r for r in results if r.status == "fail" and r.input_set in self.references]
        if not failing and not (when == "always" and results):
            return []
        first = failing[0] if failing else next(r for r in results if r.input_set == self.example)
        if first.status not in ("pass", "fail"):
            return []
        reference, feeds, keep = self._at(first.input_set)
        tol = self.tolerances.boundaries(first.precision, reference.outputs.values())
        try:  # a named module's error must be above its precision's rounding
            rounding = tolerance_for(first.precision, TOLERANCE_CLASS)
        except UsageError:  # a precision with no row (float64): none to be above
            rounding = None
        where = self.request.localise
        try:
            found = localise(
                model, reference.calls, reference.tree, feeds, runtime, tol, first.model,
                where.isolate, where.repro, self.request.command, keep, rounding,
            )  # fmt: skip
        except (KeyboardInterrupt, EndedByUserCode):
            raise
        except BaseException as exc:  # localisation explains a result; it never replaces one
            first.notes.append(f"localisation could not run: {first_line(exc)}")
            return []
        first.notes.append(f"localisation ({first.input_set}): {found.verdict}")
        if where.repro is not None and found.repro is None:  # asked for, and nothing to file
            first.notes.append(
                f"--repro {where.repro}: no bundle from this run: no module is named"
            )
        if first.status == "fail" and found.first is not None:
            first.message += f"; first divergence: {found.first.label} ({found.first.cls})"
        return [found]

    def _at(self, set_name: str) -> tuple[Float64Copy, dict[str, np.ndarray], np.ndarray | None]:
        """The float64 copy's run at the input set `set_name`, its feeds, and the real
        positions alone compared there (with --padding-mask; else None)."""
        feeds = dict(next(s for s in self.sets if s.name == set_name).inputs)
        mask = self.subject.padding_mask
        keep = None if mask is None else np.asarray(feeds[mask]) != 0
        return self.references[set_name], feeds, keep

    def settings(self) -> dict[str, object]:
        subject, reference = self.subject, self.references[self.example]
        tolerances = self.request.tolerances
        return {
            "module": self.case.name,
            "class": self.case.component,
            "input_set": self.example,
            "input_sets": [s.name for s in self.sets],
            "inputs": {
                n: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                for n, t in self.inputs.named().items()
            },
            "outputs": self.output_names,
            "model": str(subject.model) if subject.model else str(self.export_dir),
            "exporter": self.exported_with,
            "exporter_reason": self.exporter_reason,
            "exporter_asked": None if subject.model else list(self.request.axes.exporters),
            "opset": None if subject.model else list(self.request.axes.opsets),
            "dynamic": {n: {str(a): d for a, d in axes.items()} for n, axes in self.axes.items()},
            "reference": reference.kind,
            "padding_mask": subject.padding_mask,
            "reference_model": reference.provenance.to_dict(),
            # the row of TOLERANCES and the user's overrides; each output's atol/rtol is in results
            "tolerance": {
                "class": TOLERANCE_CLASS,
                "atol": tolerances.atol,
                "rtol": tolerances.rtol,
                "per_output": {n: list(t) for n, t in self.tolerances.per_output},
            },
            "notes": self.notes,
        }


# Shapes larger than the example's are checked while its inputs hold at most this: a check of a
# large input stays within a small multiple of it (docs/check.md, "Large inputs").
LARGER_SHAPES_BUDGET = 64 * 2**20


def _nbytes(inputs: ModuleInputs) -> int:
    return sum(t.element_size() * t.nelement() for t in inputs.tensors)


def module_dtype(module: nn.Module) -> str:
    return str(floating_dtype(module)).removeprefix("torch.")


def module_suite(
    request: Request, progress: Progress, locks: contextlib.ExitStack | None = None
) -> ModuleSuite:
    """The suite of `request`'s UserModel: its factory called (PACKAGE.MODULE:FACTORY, which
    returns (module, example_inputs), optionally with the dynamic axes it declares, or the
    module alone with an .npz of inputs). `locks` holds its export folder's lock from its first
    export on: the caller's, released as the run ends."""
    from tconform.module_check.inputs import load_factory, read_npz

    subject = request.subject
    assert isinstance(subject, UserModel)
    progress(
        f"{subject.target}: importing {subject.target.partition(':')[0]!r} and calling the factory"
    )
    module, example_inputs, declared = load_factory(subject.target)
    if subject.inputs is not None:
        example_inputs = read_npz(subject.inputs, module)
    elif example_inputs is None:
        raise UsageError(
            f"{subject.target}: the factory returned only a module; pass --inputs FILE.npz"
        )
    return ModuleSuite(request, module, example_inputs, progress, declared, locks)


def _both_failed(failures: dict[str, UsageError], reason) -> UsageError:
    """The error of an export that no exporter made: the one failure where there was one
    exporter, or where both failed for the same reason (a folder it cannot write: said once);
    else the last exporter's, with the first's reason after it (else dynamo's is lost)."""
    errors = list(failures.values())
    if len(errors) == 1 or reason(errors[-1]) == reason(errors[0]):
        return errors[-1]
    return ExportFailed(f"{errors[-1]}; before it, {reason(errors[0])}")


def _type_not_in_opset(message: str, opset: int) -> str:
    """Where an export failed because ONNX's operator takes no such element type at `opset`
    (ONNX's shape inference: "(op_type:Conv, ...) has unsupported type: tensor(bfloat16)"),
    why the cell cannot exist, with the way on; else ''. A fact about the opset, not the
    exporter's or the module's failure."""
    found = _UNSUPPORTED_TYPE.search(message)
    if found is None:
        return ""
    op, dtype = found.groups()
    return (
        f"ONNX {op} takes no {dtype} at opset {opset}: no such model can exist at this opset "
        "(opset 22 gave bfloat16 to Conv, pooling and more: --opset 22)"
    )


_UNSUPPORTED_TYPE = re.compile(r"\(op_type:(\w+),[^)]*\).*?has unsupported type: tensor\((\w+)\)")


def _said(exc: BaseException | None) -> str:
    """tconform's own error as its sentence (its class name is no news), another with it."""
    if isinstance(exc, TconformError):
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return first_line(exc) if exc is not None else ""


def _require_batch_kept_free(path: Path, inputs: ModuleInputs, axes) -> None:
    """UsageError where an export traced at batch 1 fixed the batch it was asked to keep free:
    torch.export specialises a size of 1, and the graph's outputs then hold a batch of 1 while
    its inputs still name the axis free (the file fails at any other batch). Seen only where
    the example's batch is 1 and an output leads with a fixed 1."""
    if input_axis_size(inputs, axes, BATCH) != 1:
        return
    graph = onnx.load(str(path), load_external_data=False).graph
    for output in graph.output:
        dims = output.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value == 1:
            raise UsageError(
                f"traced at the example's batch of 1, the export fixed output {output.name!r}'s "
                "batch at 1 (torch.export specialises sizes 0 and 1)"
            )


def _planned(model: ModelUnderTest, precision: str) -> ModelUnderTest:
    """A precision plan's model computes in `precision` but for the nodes its plan keeps in
    float32, so it is judged by that precision's row. Read as a file, a small model's kept nodes
    can hold over a quarter of its node inputs, and the mixed-precision rule would hold it to
    the float32 row no float16 computation meets; here tconform made the model from its own
    float32 export, and plan.json says what it kept and why, so nothing in it is a claim."""
    provenance = model.provenance
    why = f"a precision plan's {precision} model, judged by the {precision} row"
    if provenance.compute_note:
        why += (
            f", not as the file alone would be ({provenance.compute_note}): plan.json names "
            "each node it keeps in float32 and why"
        )
    return replace(
        model, provenance=replace(provenance, compute_elem_type=precision, compute_note=why)
    )
