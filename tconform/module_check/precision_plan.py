"""Precision plans: which modules of a user's model a float16 or int8 conversion leaves in
float32, found from the numbers, and the model made with them (the dtypes `float16-planned` and
`int8-planned` of `tconform check --dtype`; docs/reduced-precision.md, "Precision plans").

Kept in float32 are
  range     (float16) the own ops of every module with a tensor at its boundary, in the float64
            copy's run, that float16 cannot hold: finite magnitudes above its largest, 65504
            (the tensor would be infinite), or a whole tensor below its smallest normal number
            (a few bits or zero). Own ops, not its submodules' (a block's residual Add and the
            norms reading the residual stream, not the feed-forward between them): where the
            value is made and read. Magnitudes of 1e9 and more are mask fills (-1e9, a type's
            minimum), which the converter clamps to float16's range, where they still mask;
  isolated  every node of a module whose own error leaves the precision's row: its nodes cut
            out of the converted model and fed the float64 copy's inputs (tconform.localise's
            isolation), against the copy's outputs, element-wise or (int8) on the row's SQNR
            floor. Only the innermost such modules: a module around one fails with it.
The nodes (by module scope in the float32 export, tconform.localise.scopes) go to the
converter's own list: `node_block_list` of onnxruntime.transformers.float16's
convert_float_to_float16, `nodes_to_exclude` of onnxruntime.quantization.quantize_dynamic.

The plan is verified by running it: the planned model is localised again on the example, and
where its outputs still leave the row, the innermost modules whose own error does (or, where
none does, the one using the largest share of the row) are kept too, for at most MAX_ROUNDS
planned models; plan.json says each round, and whether the last passed. The pipeline then
checks the planned model like any other, on every input set and runtime, under the row of the
precision it computes in.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tconform.compare import OutputComparison, Tolerance
from tconform.export.settings import INT8_QUANTIZATION
from tconform.files import atomic_write_bytes, atomic_write_json, sha256_file
from tconform.localise import Localisation, localise
from tconform.localise.capture import Call
from tconform.localise.judge import Boundary, inside, share_used, worst_of
from tconform.localise.scopes import Graph
from tconform.models import derived_file, read_graph
from tconform.module_check.convert import MASK_FILL, convert
from tconform.module_check.float64_copy import Float64Copy
from tconform.runtimes import Runtime, label

PLAN_FILE = "plan.json"
MAX_ROUNDS = 3  # planned models made and localised, at most
FLOAT16_MAX = float(np.finfo(np.float16).max)
FLOAT16_TINY = float(np.finfo(np.float16).tiny)  # its smallest normal number, 6.1e-05
# The converter's call and the argument the plan fills, per precision.
TOOLS = {
    "float16": (
        "onnxruntime.transformers.float16.convert_float_to_float16, then OnnxModel's "
        "remove_cascaded_cast_nodes and remove_useless_cast_nodes (module_check/convert.py)",
        "node_block_list",
        {"keep_io_types": True},
    ),
    "int8": ("onnxruntime.quantization.quantize_dynamic", "nodes_to_exclude", INT8_QUANTIZATION),
}

Progress = Callable[[str], None]


@dataclass
class KeptModule:
    """A module the plan keeps in float32 (its own ops, or every node of it), and why."""

    module: str  # its path in the user's module ("": the module itself)
    cls: str
    why: str  # range | isolated | largest share
    detail: str  # the numbers
    round: int  # the round that added it (1: from the float64 run and the plain conversion)
    own_ops: bool  # its own ops alone, not its submodules'
    nodes: list[str]  # those nodes in the float32 export

    @property
    def label(self) -> str:
        if not self.module:
            return "(the module's own ops)" if self.own_ops else "(the whole module)"
        return f"{self.module} (own ops)" if self.own_ops else self.module

    def keeps(self, path: str, own_ops: bool) -> bool:
        """Whether keeping this keeps `path`'s own ops (`own_ops`) or every node of it."""
        if self.own_ops:
            return own_ops and path == self.module
        return path == self.module or inside(path, self.module)


@dataclass
class Round:
    """One converted model localised on the example: the plain conversion (round 0), then each
    planned model."""

    round: int
    kept_nodes: int
    outputs: str  # pass | fail: the model's outputs against the row
    worst: str  # its worst output, in figures


@dataclass
class PrecisionPlan:
    """What a plan keeps in float32, the rounds that verified it, and where it was measured."""

    precision: str  # float16 | int8
    runtime: str  # the runtime the modules' errors were measured on
    input_set: str
    tolerance: Tolerance
    base_sha256: str  # the float32 export the plan converts
    total_nodes: int
    kept: list[KeptModule] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    unkept: list[str] = field(default_factory=list)  # modules found, with no node to keep

    @property
    def nodes(self) -> list[str]:
        """Every kept node, once, in the order the modules were kept."""
        return list(dict.fromkeys(n for k in self.kept for n in k.nodes))

    @property
    def passes(self) -> bool:
        """Whether the last planned model's outputs were within the row on the example."""
        return bool(self.rounds) and self.rounds[-1].outputs == "pass"

    @property
    def summary(self) -> str:
        """One line for the results' notes."""
        modules = ", ".join(k.label for k in self.kept[:5])
        more = f" and {len(self.kept) - 5} more" if len(self.kept) > 5 else ""
        kept = f"keeps {modules}{more} in float32" if self.kept else "keeps nothing in float32"
        last = self.rounds[-1]
        return (
            f"precision plan ({PLAN_FILE}): {kept} ({len(self.nodes)} of {self.total_nodes} "
            f"nodes); on {self.input_set} its model's outputs {last.outputs} the {self.precision} "
            f"row ({last.worst}) after {len(self.rounds) - 1} round(s)"
        )

    def to_dict(self) -> dict[str, object]:
        tool, argument, settings = TOOLS[self.precision]
        return {
            "precision": self.precision,
            "converter": tool,
            "arguments": {**settings, argument: self.nodes},
            "float32_model_sha256": self.base_sha256,
            "measured_on": {
                "runtime": self.runtime,
                "input_set": self.input_set,
                "tolerance": asdict(self.tolerance),
            },
            "kept": [asdict(k) for k in self.kept],
            "kept_nodes": len(self.nodes),
            "total_nodes": self.total_nodes,
            "not_kept": self.unkept,
            "rounds": [asdict(r) for r in self.rounds],
            "passes_on_input_set": self.passes,
        }


def out_of_float16(calls: list[Call]) -> dict[str, str]:
    """Module path -> why float16 cannot hold a tensor at its boundary (the first such tensor
    of its calls), from the float64 copy's run."""
    found: dict[str, str] = {}
    for c in calls:
        for role, tensors in (("output", c.outputs), ("input", c.inputs)):
            for tensor in tensors:
                why = _out_of_float16(tensor)
                if why and c.path not in found:
                    found[c.path] = f"an {role} {why}"
    return found


def _out_of_float16(tensor: np.ndarray) -> str:
    magnitude = np.abs(tensor[np.isfinite(tensor)])
    over = magnitude[(magnitude > FLOAT16_MAX) & (magnitude < MASK_FILL)]
    if over.size:
        return f"reaches {over.max():.3g}, beyond float16's largest {FLOAT16_MAX:g}"
    nonzero = magnitude[magnitude > 0]
    if nonzero.size and nonzero.max() < FLOAT16_TINY:
        return (
            f"lies wholly below float16's smallest normal {FLOAT16_TINY:.2g} (largest "
            f"{nonzero.max():.3g})"
        )
    return ""


def module_nodes(graph: Graph, path: str, own_ops: bool) -> list[str]:
    """The names of `path`'s nodes in the float32 export: its own ops (those whose innermost
    scope it is), or every node of it, its submodules' too (the module itself, "": every node
    of the model)."""
    nodes = graph.model.graph.node
    if own_ops:
        chosen = [i for i, scope in enumerate(graph.scopes) if scope[-1] == path]
    else:
        chosen = graph.region(path)
    return [nodes[i].name for i in chosen if nodes[i].name]


def _innermost(boundaries: list[Boundary]) -> list[Boundary]:
    """One boundary per module, leaving out any module around another of them."""
    unique = list({b.path: b for b in boundaries}.values())
    return [b for b in unique if not any(inside(o.path, b.path) for o in unique)]


def _figures(comparisons: list[OutputComparison]) -> tuple[OutputComparison | None, str]:
    """The worst comparison (a failing one first: a non-finite value fails with a small share
    of the finite elements) and its figures."""
    failing = [c for c in comparisons if c.status == "fail"]
    worst = worst_of(failing) or worst_of(comparisons)
    if worst is None:
        return None, ""
    if worst.kind == "nonfinite":
        return worst, worst.message.split(",")[0]  # how many, without the first one's values
    figures = f"max abs err {worst.max_abs_err:.3g}"
    if worst.sqnr_db is not None:
        figures += f", SQNR {worst.sqnr_db:.1f} dB"
        if worst.min_sqnr_db is not None:
            figures += f" (floor {worst.min_sqnr_db:g})"
    return worst, figures


def _isolated_detail(b: Boundary) -> str:
    worst, figures = _figures(b.isolated or [])
    if worst is None:
        return "its isolated run left the row"
    share = share_used(worst)
    if worst.kind == "nonfinite" or share == float("inf"):
        return f"isolated: {figures}"
    used = f"{share:.3g}x the row" if share >= 1 else f"{share:.1%} of the row"
    return f"isolated: {figures}; {used}"


def _worst_output(found: Localisation) -> tuple[str, str]:
    """(pass | fail, the worst output in figures) of the localised model's outputs."""
    root = next(b for b in found.boundaries if b.path == "")
    worst, figures = _figures(root.outputs)
    return root.status, figures if worst is not None else root.reason or "no output compared"


def make_plan(
    base: Path,
    precision: str,
    reference: Float64Copy,
    feeds: dict[str, np.ndarray],
    runtime: Runtime,
    tol: Tolerance,
    folder: Path,
    keep: np.ndarray | None = None,
    input_set: str = "example",
    progress: Progress = lambda _: None,
) -> PrecisionPlan:
    """Plan `precision` (float16 or int8) for the float32 export `base` from the float64 copy
    `reference` run at `feeds` (the input set `input_set`; `keep`: its real positions, where
    only those are compared), the modules' errors measured on `runtime` under `tol`; write the
    planned model and the plan to `folder` (model.onnx, plan.json)."""
    graph = Graph.read(read_graph(base), set(reference.tree.classes))
    plan = PrecisionPlan(
        precision, label(runtime), input_set, tol, sha256_file(base), len(graph.model.graph.node)
    )
    classes = reference.tree.classes

    def add(path: str, why: str, detail: str, round_: int, own_ops: bool = False) -> None:
        if any(k.keeps(path, own_ops) for k in plan.kept):
            return  # already float32
        nodes = module_nodes(graph, path, own_ops)
        own_ops = own_ops and nodes != module_nodes(graph, path, False)  # a leaf is kept whole
        if not nodes:
            plan.unkept.append(f"{path or '(the module itself)'}: {detail} (no node of it)")
            return
        if set(nodes) <= set(plan.nodes):
            return  # kept for another reason already (a leaf kept for its range)
        if not own_ops:  # the modules it holds: their nodes are among its own
            plan.kept = [k for k in plan.kept if not (k.module == path or inside(k.module, path))]
        kept = KeptModule(path, classes.get(path, ""), why, detail, round_, own_ops, nodes)
        plan.kept.append(kept)

    if precision == "float16":
        for path, detail in out_of_float16(reference.calls).items():
            add(path, "range", detail, 1, own_ops=True)
    with tempfile.TemporaryDirectory(prefix="tconform-plan-") as tmp:
        for n in range(MAX_ROUNDS + 1):
            model = Path(tmp) / f"round{n}.onnx"
            convert(base, precision, model, plan.nodes if n else ())
            progress(
                f"{precision} plan, round {n}: localising "
                + (f"with {len(plan.nodes)} nodes kept" if n else "the plain conversion")
            )
            with np.errstate(over="ignore", invalid="ignore"):  # float16's inf, on purpose
                found = localise(
                    derived_file(model), reference.calls, reference.tree, feeds, runtime, tol,
                    isolate_modules="all", keep=keep,
                )  # fmt: skip
            status, worst = _worst_output(found)
            plan.rounds.append(Round(n, len(plan.nodes) if n else 0, status, worst))
            if (n and status == "pass") or n == MAX_ROUNDS:
                break
            before = set(plan.nodes)
            failing = [b for b in found.boundaries if b.path and b.isolated_status == "fail"]
            for b in _innermost(failing):
                add(b.path, "isolated", _isolated_detail(b), n + 1)
            # Where the outputs fail and no module's own error shows why: the largest share
            # (not before the modules kept for their range have had their round).
            unchanged = set(plan.nodes) == before
            if status == "fail" and unchanged and (n or not plan.kept):
                _keep_largest_share(found, plan, add, n + 1)
            if set(plan.nodes) == before and (n or not plan.kept):
                break  # nothing (more) to keep: the last model localised is the plan's
        atomic_write_bytes(folder / "model.onnx", model.read_bytes())
    atomic_write_json(folder / PLAN_FILE, plan.to_dict())
    return plan


def _keep_largest_share(found: Localisation, plan: PrecisionPlan, add, round_: int) -> None:
    """The module whose isolated error uses the largest share of the row, of those neither
    kept whole, inside one kept whole, nor around one."""
    whole = [k.module for k in plan.kept if not k.own_ops]
    candidates = [
        b
        for b in found.boundaries
        if b.path
        and b.isolated
        and not any(b.path == k or inside(b.path, k) or inside(k, b.path) for k in whole)
    ]
    if candidates:
        worst = max(candidates, key=lambda b: share_used(worst_of(b.isolated)))
        add(worst.path, "largest share", _isolated_detail(worst), round_)
