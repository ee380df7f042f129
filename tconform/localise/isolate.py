"""A module's own error, apart from what it inherited, and the bundle to file upstream.

Isolated beside cumulative, the split ONNX Runtime's quantisation debugger (qdq_loss_debug)
makes, applied to conformance: the module's nodes are cut out of the ONNX model with onnx's own
`onnx.utils.Extractor` between the tensors that enter and leave its call, fed the float64
reference's inputs rounded to the model's type (integer and boolean inputs, which are exact, as
the model computed them), and run on the same runtime. Its outputs against the reference are the
module's isolated error: outside tolerance, the module computes wrong; within it while the
cumulative error is outside, the module amplifies what it inherited.

The repro bundle is that subgraph with its inputs and expected outputs in the ONNX test-data
layout (`model.onnx`, `test_data_set_0/input_K.pb`, `output_K.pb`) that onnx's backend runner
and ONNX Runtime's onnx_test_runner read, a `reproduce.py` that needs nothing but numpy, onnx
and onnxruntime, and a README with the tolerance, versions and provenance.
"""

from __future__ import annotations

import io
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tconform.compare import GROWN_ABOVE, OutputComparison, Tolerance, expanded_mask
from tconform.execution import Subject, open_subject
from tconform.files import atomic_write_bytes, atomic_write_text
from tconform.folders import BUNDLE_MARKER, BUNDLE_TOOL, replace_whole
from tconform.localise.capture import Call
from tconform.localise.crosscheck import CrossCheck, NotEvaluable, cross_check
from tconform.localise.judge import Boundary, compare_boundary, share_used
from tconform.localise.observe import PlainRun
from tconform.localise.scopes import Graph
from tconform.models import derived_file
from tconform.runtimes import Runtime
from tconform.versions import library_versions

# Modules cut out and run while naming one (along the error's path, and again inside a module
# named): bounds the cost on a model whose every boundary leaves a tolerance tighter than its
# arithmetic.
MAX_ISOLATED = 24


@dataclass
class Isolation:
    """A module call cut out and run on the reference's inputs."""

    subgraph: onnx.ModelProto = field(repr=False)
    feeds: dict[str, np.ndarray]  # by subgraph input, in its order
    inputs_from: dict[str, str]  # subgraph input -> "reference" | "model"
    expected: dict[str, np.ndarray]  # by subgraph output: the reference, in the model's type
    comparisons: list[OutputComparison]
    nodes: int
    model_nodes: int
    check: CrossCheck | None = None  # the plain evaluations, where the runtime's run fails
    unchecked: str = ""  # why they could not run
    # Unchecked, whether its error also leaves the precision's own row (measured above its
    # rounding): where the tolerance is tighter than that, rounding is not ruled out.
    beyond_rounding: bool = True

    @property
    def status(self) -> str:
        return "fail" if any(c.status == "fail" for c in self.comparisons) else "pass"

    @property
    def finding(self) -> str:
        """Where the isolated run fails: 'function', 'runtime' or 'rounding' (crosscheck.py),
        'unchecked' where the plain evaluations could not run, 'unproven' where besides its
        error is within the precision's own row (it could be rounding); '' where it passes."""
        if self.status == "pass":
            return ""
        if self.check is not None:
            return self.check.finding
        return "unchecked" if self.beyond_rounding else "unproven"

    @property
    def proves(self) -> bool:
        """Whether the module's own error leaves tolerance by more than rounding: it is named."""
        return self.finding in ("function", "runtime", "unchecked")


def not_isolatable(graph: Graph, boundary: Boundary) -> str:
    """Why `boundary` cannot be cut out and fed the reference's inputs ('' where it can): a
    float tensor entering it that no reference input was paired with would be fed the model's
    own value, error and all, and prove nothing; one the model made exactly (Graph.exact: a
    mask another module's scope built) is fed as it is."""
    if not boundary.region:
        return "no ONNX node carries its scope"
    if not boundary.onnx_outputs:
        return "its outputs are not matched"
    fed = set(boundary.onnx_inputs.values()) | graph.exact
    unfed = [n for n in graph.entering(boundary.region) if n not in fed]
    if unfed:
        return f"its input {unfed[0]} is not matched to one of the reference's"
    return ""


def value_infos(names: list[str], values: dict[str, np.ndarray]) -> list[onnx.ValueInfoProto]:
    """Type and shape of each tensor as it ran (the cut's inputs and outputs need one)."""
    return [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(values[name].dtype), list(values[name].shape)
        )
        for name in names
    ]


def cut(model: onnx.ModelProto, inputs: list[str], outputs: list[str], values) -> onnx.ModelProto:
    """The nodes between `inputs` and `outputs` as a model of their own (onnx's Extractor),
    typed and shaped as the tensors were at run time."""
    known = {v.name for v in (*model.graph.value_info, *model.graph.input, *model.graph.output)}
    missing = [n for n in (*inputs, *outputs) if n not in known]
    model.graph.value_info.extend(value_infos(missing, values))
    return onnx.utils.Extractor(model).extract_model(inputs, outputs)


def isolate(
    model: onnx.ModelProto,
    graph: Graph,
    boundary: Boundary,
    reference: Call,
    outputs_of: Call,
    values: dict[str, np.ndarray],
    runtime: Runtime,
    tol: Tolerance,
    keep: np.ndarray | None = None,
    rounding: Tolerance | None = None,
) -> Isolation:
    """`boundary`'s nodes on `runtime`, fed `reference`'s inputs (the call whose inputs the
    boundary starts at) and judged against `outputs_of`'s outputs (at the real positions
    `keep`, where given); `rounding`: the precision's own row, for an isolated failure that no
    plain evaluation can check. `values` holds the ONNX tensors entering the region and leaving it,
    as the whole model computed them."""
    entering = graph.entering(boundary.region, floats_only=False)
    subgraph = cut(model, entering, boundary.onnx_outputs, values)
    by_onnx = {name: k for k, name in boundary.onnx_inputs.items()}
    feeds, exact, inputs_from = {}, {}, {}
    for name in entering:
        own = values[name]
        if name in by_onnx:  # a float input the reference computed exactly
            exact[name] = reference.inputs[by_onnx[name]].reshape(own.shape)
            feeds[name] = exact[name].astype(own.dtype)
            inputs_from[name] = "reference"
        else:  # an integer or boolean input, or a float one made exactly (Graph.exact)
            feeds[name] = exact[name] = own
            inputs_from[name] = "model"
    expected = {
        name: outputs_of.outputs[k]
        for name, k in zip(boundary.onnx_outputs, boundary.output_indices, strict=True)
    }
    with tempfile.TemporaryDirectory(prefix="tconform-isolate-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save_model(subgraph, str(path))
        with open_subject(runtime, Subject(derived_file(path, subgraph))) as opened:
            actual = opened.run(feeds, list(expected))
    comparisons = [
        compare_boundary(
            f"{boundary.label} (isolated) <- {name}", actual[name], expected[name], tol, keep=keep
        )
        for name in expected
    ]
    found = Isolation(
        subgraph,
        feeds,
        inputs_from,
        {name: value.astype(values[name].dtype) for name, value in expected.items()},
        comparisons,
        len(subgraph.graph.node),
        len(model.graph.node),
    )
    if found.status == "fail":
        try:
            found.check = cross_check(subgraph, feeds, exact, expected, comparisons, tol, keep)
        except NotEvaluable as why:
            found.unchecked = str(why)
            found.beyond_rounding = _beyond(actual, expected, rounding, keep)
    return found


def _beyond(actual, expected, rounding: Tolerance | None, keep) -> bool:
    """Whether the isolated outputs also leave `rounding`, the precision's own row (None: the
    tolerance is that row)."""
    if rounding is None:
        return True
    return any(
        compare_boundary(name, actual[name], expected[name], rounding, keep=keep).status == "fail"
        for name in expected
    )


def isolate_whole(
    model: onnx.ModelProto,
    boundary: Boundary,
    feeds: dict[str, np.ndarray],
    reference: Call,
    plain: PlainRun,
    tol: Tolerance,
    keep: np.ndarray | None = None,
    rounding: Tolerance | None = None,
) -> Isolation:
    """The whole module as its own isolation: the model fed its own inputs, which are the
    reference's, is the plain run (`boundary` was judged on it), cross-checked as a cut is."""
    inputs = [i.name for i in model.graph.input if i.name in feeds]
    rounded = {n: np.asarray(feeds[n]) for n in inputs}
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    for name in inputs:
        numpy_type = helper.tensor_dtype_to_np_dtype(types[name])
        if rounded[name].dtype.kind == "f" and numpy_type.kind == "f":
            rounded[name] = rounded[name].astype(numpy_type)
    exact = {n: v.astype(np.float64) if v.dtype.kind == "f" else v for n, v in feeds.items()}
    exact = {n: exact[n] for n in inputs}
    expected = dict(zip(plain.outputs, reference.outputs, strict=True))
    found = Isolation(
        model,
        rounded,
        dict.fromkeys(inputs, "reference"),
        {n: value.astype(plain.outputs[n].dtype) for n, value in expected.items()},
        list(boundary.outputs),
        len(model.graph.node),
        len(model.graph.node),
    )
    if found.status == "fail":
        try:
            found.check = cross_check(model, rounded, exact, expected, found.comparisons, tol, keep)
        except NotEvaluable as why:
            found.unchecked = str(why)
            found.beyond_rounding = _beyond(plain.outputs, expected, rounding, keep)
    return found


def write_bundle(
    folder: Path,
    isolation: Isolation,
    boundary: Boundary,
    tol: Tolerance,
    about: dict[str, object],
    keep: np.ndarray | None = None,
) -> Path:
    """The repro bundle in `folder` (new, empty, or a bundle tconform wrote there and that is as
    it wrote it: folders.replace_whole), written beside it and moved into place whole. `about`:
    the model's provenance, the runtime and the command, for the README; `keep`: the (batch,
    sequence) mask of the real positions the check compared alone, where it left padded ones
    out (each output it applies to gets its `compared_K.npy`, which reproduce.py reads)."""
    # Each output's atol as it was judged: the tolerance's, scaled to the output's RMS where
    # the tolerance is a row's (tconform.compare.Tolerance.atol_for).
    atols = {
        o.name: c.atol
        for o, c in zip(isolation.subgraph.graph.output, isolation.comparisons, strict=True)
    }
    record = {
        "tool": BUNDLE_TOOL,
        "module": boundary.label,
        "class": boundary.cls,
        "atol": tol.atol,
        "atol_by_output": atols,
        "rtol": tol.rtol,
        "inputs_from": isolation.inputs_from,
        "nodes": isolation.nodes,
        "model_nodes": isolation.model_nodes,
        "isolated": [c.to_dict() for c in isolation.comparisons],
        "cumulative": [c.to_dict() for c in boundary.outputs],
        "versions": library_versions(),
        **about,
    }

    def write(staging: Path) -> None:
        _write_files(staging, isolation, boundary, tol, about, atols, keep)

    return replace_whole(folder, BUNDLE_MARKER, record, write, "--repro")


def _write_files(
    folder: Path,
    isolation: Isolation,
    boundary: Boundary,
    tol: Tolerance,
    about: dict,
    atols: dict[str, float],
    keep: np.ndarray | None,
) -> None:
    atomic_write_bytes(folder / "model.onnx", isolation.subgraph.SerializeToString())
    data = folder / "test_data_set_0"
    data.mkdir()
    for k, value in enumerate(i.name for i in isolation.subgraph.graph.input):
        tensor = numpy_helper.from_array(isolation.feeds[value], name=value)
        atomic_write_bytes(data / f"input_{k}.pb", tensor.SerializeToString())
    masked = False
    for k, value in enumerate(o.name for o in isolation.subgraph.graph.output):
        expected = isolation.expected[value]
        tensor = numpy_helper.from_array(expected, name=value)
        atomic_write_bytes(data / f"output_{k}.pb", tensor.SerializeToString())
        if keep is not None and expected.shape[: keep.ndim] == keep.shape:  # as judged
            where = expanded_mask(keep, expected.ndim) != 0
            buffer = io.BytesIO()
            np.save(buffer, np.broadcast_to(where, expected.shape))
            atomic_write_bytes(data / f"compared_{k}.npy", buffer.getvalue())
            masked = True
    atomic_write_text(folder / "reproduce.py", _REPRODUCE.format(atols=atols, rtol=tol.rtol))
    readme = _readme(isolation, boundary, tol, about, masked)
    atomic_write_text(folder / "README.md", readme)


def _readme(
    isolation: Isolation, boundary: Boundary, tol: Tolerance, about: dict, masked: bool
) -> str:
    worst = max(isolation.comparisons, key=share_used)
    cumulative = boundary.worst
    model = about.get("model") or {}
    scaled = (
        f" scaled with an output's RMS below {tol.atol_rms:g} and with its typical size above "
        f"{GROWN_ABOVE:g} times {tol.atol_rms:g} (each output's: bundle.json, atol_by_output)"
        if tol.atol_rms is not None
        else ""
    )
    lines = [
        f"# Repro: `{boundary.label}` ({boundary.cls})",
        "",
        f"A {isolation.nodes}-node subgraph cut out of a {isolation.model_nodes}-node ONNX model "
        "(`onnx.utils.Extractor`), with the inputs it was fed and the outputs it should give, "
        "in the ONNX test-data layout (`test_data_set_0/input_K.pb`, `output_K.pb`).",
        "",
        "- Expected outputs: the module's float64 reference (its own PyTorch module run in "
        "float64), rounded to the model's type.",
        "- Inputs: "
        + ", ".join(f"`{n}` from the {src}" for n, src in isolation.inputs_from.items())
        + " (the reference's values rounded to the model's type; integer and boolean inputs as "
        "the model computed them).",
        f"- Rule: |actual - expected| <= atol + rtol * |expected|, atol {tol.atol:g}{scaled}, "
        f"rtol {tol.rtol:g} ({tol.why}).",
        f"- Isolated (this subgraph on these inputs, {about.get('runtime')}): {worst.status}, "
        f"max abs err {worst.max_abs_err:.3g}, {worst.mismatches} elements outside tolerance.",
    ]
    if masked:
        lines.append(
            "- Compared at the real positions only, as the check was (--padding-mask): "
            "`test_data_set_0/compared_K.npy` marks them for output K; reproduce.py reads it, "
            "onnx_test_runner compares every position."
        )
    if cumulative is not None:
        lines.append(
            f"- Cumulative (in the whole model): max abs err {cumulative.max_abs_err:.3g}, "
            f"{cumulative.mismatches} elements outside tolerance."
        )
    lines += [
        "",
        "## Reproduce",
        "",
        "```",
        "pip install numpy onnx onnxruntime",
        "python reproduce.py      # exit 1 and the error figures where the outputs disagree",
        "```",
        "",
        "or with ONNX Runtime's own runner: `onnx_test_runner -a ATOL -r RTOL .`",
        "",
        "## Provenance",
        "",
        f"- model: `{model.get('path')}`, sha256 `{model.get('sha256')}`, {model.get('origin')}",
        f"- command: `{about.get('command')}`",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in library_versions().items()),
        "",
    ]
    return "\n".join(lines)


_REPRODUCE = '''"""Run this bundle's subgraph on ONNX Runtime's CPU provider and compare each
output with its expected value: |actual - expected| <= atol + rtol * |expected| (tconform's
tolerance). Exit 1 where any element is outside it."""

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import numpy_helper

ATOL, RTOL = {atols!r}, {rtol!r}  # atol by output
here = Path(__file__).resolve().parent
data = here / "test_data_set_0"
session = onnxruntime.InferenceSession(str(here / "model.onnx"), providers=["CPUExecutionProvider"])


def read(path):
    tensor = onnx.TensorProto()
    tensor.ParseFromString(path.read_bytes())
    return tensor.name, numpy_helper.to_array(tensor)


feeds = dict(read(p) for p in sorted(data.glob("input_*.pb")))
outputs = sorted(data.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
actual = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
failed = False
for k, path in enumerate(outputs):
    name, want = read(path)
    got = actual[name].astype(np.float64)
    want = want.astype(np.float64)
    limit = float(np.finfo(actual[name].dtype).max)  # a masked fill compares as itself
    got, want = np.clip(got, -limit, limit), np.clip(want, -limit, limit)
    compared = data / f"compared_{{k}}.npy"  # the real positions, where padding was left out
    if compared.exists():
        where = np.load(compared)
        got, want = got[where], want[where]
    err = np.abs(got - want)
    bad = ~(err <= ATOL[name] + RTOL * np.abs(want))
    print(f"{{name}}: max abs err {{np.nanmax(err):.3g}}, {{int(bad.sum())}} of {{bad.size}} "
          f"elements outside atol {{ATOL[name]:.3g}} + rtol {{RTOL:g}}*|expected|")
    failed = failed or bool(bad.any())
sys.exit(1 if failed else 0)
'''
