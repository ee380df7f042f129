"""A user's model as bench workloads: `tconform bench PACKAGE.MODULE:FACTORY`.

The model is opened as `tconform check` opens it, as a suite (tconform.suites.module): the
factory called, the module run eagerly and its float64 copy at each input set; its models are
that suite's dtype cells (the float32 export, its float16 and int8 conversions with ONNX
Runtime's own tools, the module exported in bfloat16), made through the plan's lanes in its
export folder. Each chosen input set is one workload: the same inputs for every engine, the
float64 copy's outputs to judge each row against, the module as the user holds it (its dtype,
its device) for the module runtimes, and the matrix-multiply FLOP that torch's
FlopCounterMode counts on the module at those inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import numpy as np
import torch

from tconform.bench.engines import PLAIN_EXPORT
from tconform.bench.workload import Workload
from tconform.errors import EndedByUserCode, UsageError
from tconform.execution import BatchRows
from tconform.module_check.float64_copy import module_device
from tconform.module_check.inputs import ModuleInputs
from tconform.module_check.shapes import BATCH, SEQUENCE, axis_size, infer_axes
from tconform.plan import plan
from tconform.request import Axes, Request, Tolerances, UserModel
from tconform.runtimes import ModuleTarget, RuntimeOptions
from tconform.suites.module import (
    AUTO,
    EXAMPLE,
    ModuleSuite,
    module_dtype,
    module_suite,
    run_eagerly,
)
from tconform.units import GIVEN

ALL = "all"  # --input-set all: every input set the suite has (batch consistency is no timing)

Log = Callable[[str], None]


def module_workloads(
    subject: UserModel,
    dtypes: tuple[str, ...],
    input_sets: tuple[str, ...],
    log: Log,
    record: dict,
    tolerances: Tolerances | None = None,
    locks: contextlib.ExitStack | None = None,
) -> list[Workload]:
    """One workload per input set of `input_sets` (names of the suite's sets, or `all`), with
    the model of each of `dtypes` (none: no ONNX engine runs), its rows judged as check judges
    the model (`tolerances`: what the user set; else each precision's row); what the report
    records of the model joins `record` (the run's settings) as `model`."""
    request = Request(
        subject,
        tolerances=tolerances or Tolerances(),
        runtimes=RuntimeOptions(names=("onnxruntime",)),
        axes=Axes(matrix=True, exporters=(AUTO,), dtypes=dtypes or ("float32",)),
    )
    suite = module_suite(request, log, locks)  # its export folder locked in `locks`
    chosen = _chosen_sets(suite, input_sets)
    models = _models(suite, request, log) if dtypes else {}
    if subject.model is not None:  # the file as it is, timed where the plain export would be
        models = {PLAIN_EXPORT: suite.models([], set(), log)[(suite.case.name, GIVEN)]}
    target = suite.module_target(suite.case)
    device = module_device(suite.module)
    options = {"dtype": module_dtype(suite.module), "device_id": device.index or 0}
    axes = infer_axes(suite.inputs, suite.declared)
    record["model"] = {
        **suite.settings(),
        "files": {dtype: model.provenance.to_dict() for (_, dtype), model in models.items()},
    }
    workloads = []
    for found in chosen:
        shapes = {name: np.shape(value) for name, value in found.inputs.items()}
        workloads.append(
            Workload(
                suite.case.name,
                suite.case.tolerance,
                axis_size(shapes, axes, BATCH),
                axis_size(shapes, axes, SEQUENCE),
                found.inputs,
                _expected(found.outputs),
                target,
                models,
                flop=count_flop(target, found.inputs, device, suite.where),
                input_set=found.name,
                module_options=options,
                module_ep=device.type,
                judge=_judge(suite, found),
            )
        )
    return workloads


def _judge(suite: ModuleSuite, input_set) -> Callable:
    """(outputs, precision) -> comparisons: `input_set` judged as check judges it."""
    judge = suite.judge(suite.case)
    return lambda outputs, precision: judge(dict(outputs), input_set, precision)


def _expected(outputs: Mapping[str, np.ndarray]) -> Callable[[], Mapping[str, np.ndarray]]:
    return lambda: outputs


def _chosen_sets(suite: ModuleSuite, names: tuple[str, ...]) -> list:
    """The suite's input sets named in `names` (all of them for `all`), in the suite's order;
    a name the suite lacks is a usage error listing those it has. `example` is the example's
    set, also where --inputs named it after its file."""
    names = tuple(suite.example if name == EXAMPLE else name for name in names)
    timed = [s for s in suite.sets if not isinstance(s, BatchRows)]
    have = [s.name for s in timed]
    unknown = [n for n in names if n != ALL and n not in have]
    if unknown:
        why = "; ".join(suite.notes)
        raise UsageError(
            f"--input-set {unknown[0]}: {suite.where} has no such input set (it has "
            f"{', '.join(have)}{f'; {why}' if why else ''})"
        )
    return [s for s in timed if ALL in names or s.name in names]


def _models(suite: ModuleSuite, request: Request, log: Log) -> dict:
    """The model of each dtype cell of the request's axes, by the export it stands for
    (plain, dtype): exported or converted by the suite, through the plan's lanes."""
    lanes = [lane for lane in plan(request, suite).lanes if lane.export is not None]
    made = suite.models(lanes, set(), log)
    return {("plain", lane.export.dtype): made[lane.model_key] for lane in lanes}


def count_flop(
    target: ModuleTarget, feeds: Mapping[str, np.ndarray], device: torch.device, where: str
) -> int | None:
    """The matrix-multiply FLOP of one forward pass of the module at `feeds`, as torch's
    FlopCounterMode counts them (None where the module cannot run under it)."""
    from torch.utils.flop_counter import FlopCounterMode

    inputs = ModuleInputs(
        tuple(torch.as_tensor(np.array(feeds[n])) for n in target.args),
        {n: torch.as_tensor(np.array(feeds[n])) for n in target.kwargs},
        target.args,
    ).converted(None, device)
    try:
        with FlopCounterMode(display=False) as counter:
            run_eagerly(target.build(), inputs, where)
    except EndedByUserCode:
        raise  # the module ended itself: no count to leave out, the run ends
    except UsageError:  # it ran eagerly before, but not under the counter's dispatch
        return None
    return counter.get_total_flops()
