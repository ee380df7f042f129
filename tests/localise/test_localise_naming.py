"""Which module localisation names, on hand-built graphs whose verdict is known in advance: a
module is named only where its isolated run proves it (more than rounding), a value read by
two modules is never paired with the outputs of a module that has no nodes, a failure at padded
positions names nothing, zero tolerances work, and a run that observing changes is localised by
isolation."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from onnx import TensorProto
from torch import nn

from tconform.compare import Tolerance
from tconform.localise import ModuleTree, capture_calls, localise, render
from tconform.models import derived_file
from tconform.runtimes import make_runtime
from tests.localise.graphs import Chain, Scale, save_model, scoped_node

pytestmark = pytest.mark.unit

TOL = Tolerance(1e-5, 1e-5, "test")
EXACT = Tolerance(0.0, 0.0, "test: exactness")


def _localise(net: nn.Module, path, feeds: dict[str, np.ndarray], tol=TOL, **options):
    reference = net.double().eval()
    args = {
        k: torch.from_numpy(v).double() if v.dtype.kind == "f" else torch.from_numpy(v)
        for k, v in feeds.items()
    }
    calls, _ = capture_calls(reference, (), args)
    return localise(
        derived_file(path), calls, ModuleTree.of(reference), feeds, make_runtime("onnxruntime"),
        tol, **options,
    )  # fmt: skip


def _failing(loc) -> list[str]:
    return [b.label for b in loc.boundaries if b.status == "fail"]


# --- a value two modules read: parallel residual ------------------------------------------------


class Affine(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((3,), scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + 1.0


class Parallel(nn.Module):
    """y = n1(e) + n2(e) + e, e = emb(x): both norms read the layer's input, as in GPT-NeoX's
    parallel residual; n1 and n2 are the same function, which the exporter computes once."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = Affine(2.0)
        self.n1 = Affine(1.0)
        self.n2 = Affine(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.emb(x)
        return self.n1(e) + self.n2(e) + e


def _parallel(path, emb_scale=2.0):
    """Parallel's export after common-subexpression elimination: n2 has no node, and no node
    reads its weight (deduplicated into n1's)."""
    nodes = [
        scoped_node("Mul", ["x", "emb.weight"], ["e0"], ["emb"]),
        scoped_node("Add", ["e0", "one"], ["e"], ["emb"]),
        scoped_node("Mul", ["e", "n1.weight"], ["p0"], ["n1"]),
        scoped_node("Add", ["p0", "one"], ["p"], ["n1"]),
        scoped_node("Add", ["p", "p"], ["q"], []),
        scoped_node("Add", ["q", "e"], ["y"], []),
    ]
    weights = {
        "emb.weight": np.full(3, emb_scale, np.float32),
        "n1.weight": np.ones(3, np.float32),
        "one": np.array(1.0, np.float32),
    }
    return save_model(path, nodes, {"x": (TensorProto.FLOAT, [2, 3])}, {"y": [2, 3]}, weights)


def _x() -> np.ndarray:
    return np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)


def test_a_value_two_modules_read_is_not_paired_with_a_module_without_nodes(tmp_path):
    loc = _localise(Parallel(), _parallel(tmp_path / "m.onnx"), {"x": _x()})
    statuses = {b.path: b.status for b in loc.boundaries}
    # n2's computation was merged into n1's node: nothing carries n2's output on its own, and
    # emb's output (which n2 reads, beside n1) is not n2's output
    assert statuses == {"emb": "pass", "n1": "pass", "n2": "unmatched", "": "pass"}
    assert not _failing(loc) and loc.first is None, render(loc)
    assert [b.label for b in loc.boundaries if b.fused_from or b.absorbed] == []


def test_a_fault_beside_a_merged_module_names_that_module_alone(tmp_path):
    loc = _localise(Parallel(), _parallel(tmp_path / "m.onnx", emb_scale=2.5), {"x": _x()})
    assert loc.first is not None and loc.first.label == "emb", loc.verdict
    assert loc.first.finding == "function" and loc.first.isolated_status == "fail"


# --- zero and tight tolerances ------------------------------------------------------------------


def _chain(path, three=3.0, third=1.0 / 3.0):
    nodes = [
        scoped_node("Mul", ["x", "two"], ["h1"], ["a"]),
        scoped_node("Add", ["h1", "third"], ["h2"], []),
        scoped_node("Mul", ["h2", "three"], ["y"], ["b"]),
    ]
    consts = {"two": 2.0, "third": third, "three": three}
    weights = {k: np.array(v, np.float32) for k, v in consts.items()}
    return save_model(path, nodes, {"x": (TensorProto.FLOAT, [2, 3])}, {"y": [2, 3]}, weights)


def test_zero_tolerance_names_no_module_for_rounding(tmp_path):
    path = _chain(tmp_path / "m.onnx")
    loc = _localise(Chain(1.0 / 3.0), path, {"x": _x()}, EXACT, repro_dir=tmp_path / "r")
    assert loc.first is None and loc.verdict.startswith("no module is named"), loc.verdict
    b = next(b for b in loc.boundaries if b.path == "b")
    assert b.isolated_status == "fail" and b.finding == "rounding"  # float32 rounds it anyway
    assert "inf" in render(loc)  # no tolerance to use: an unbounded share
    assert not (tmp_path / "r").exists()  # no bundle for a module nothing proves


def test_an_unchecked_module_within_its_own_row_is_not_named_under_a_tighter_tolerance(
    tmp_path, monkeypatch
):
    """Where no plain evaluation can check a module's isolated failure (onnx.reference failed
    on a BertEmbeddings cut, seen at --atol 0 --rtol 0), its failure proves nothing the
    tolerance could not: it is named only if it also leaves its precision's own row. An
    unmodified BERT had its healthy embeddings named 'it computes wrong'."""
    import importlib

    from tconform.localise.crosscheck import NotEvaluable

    isolate = importlib.import_module("tconform.localise.isolate")  # the module, not the function

    def cannot(*args, **kwargs):
        raise NotEvaluable("onnx.reference failed on it: ValueError: cannot reshape")

    monkeypatch.setattr(isolate, "cross_check", cannot)
    path = _chain(tmp_path / "m.onnx")
    loc = _localise(Chain(1.0 / 3.0), path, {"x": _x()}, EXACT, rounding=TOL)
    assert loc.first is None and loc.verdict.startswith("no module is named"), loc.verdict
    b = next(b for b in loc.boundaries if b.path == "b")
    assert b.isolated_status == "fail" and b.finding == "unproven"
    assert "rounding is not ruled out" in loc.verdict and "cannot reshape" in loc.verdict
    wrong = _chain(tmp_path / "wrong.onnx", three=3.03)  # 1 % off: beyond the row too
    loc = _localise(Chain(1.0 / 3.0), wrong, {"x": _x()}, EXACT, rounding=TOL)
    assert loc.first is not None and loc.first.path == "b" and loc.first.finding == "unchecked"


def test_zero_tolerance_still_names_a_wrong_weight(tmp_path):
    path = _chain(tmp_path / "m.onnx", three=3.001)
    loc = _localise(Chain(1.0 / 3.0), path, {"x": _x()}, EXACT, repro_dir=tmp_path / "r")
    assert loc.first is not None and loc.first.path == "b", loc.verdict
    assert loc.first.finding == "function"
    assert (tmp_path / "r" / "bundle.json").is_file()


def test_a_wrong_weight_under_outputs_far_below_the_atol_is_named(tmp_path):
    """Outputs of about 1e-7 under a row's atol of 1e-5, scaled to their RMS as check scales
    it: a weight 1 % off is another function, and named. The float64 evaluation was held to
    the unscaled atol, passed, and the module was called rounding."""
    path = _chain(tmp_path / "m.onnx", three=3.03, third=1e-7 / 3)
    row = Tolerance(1e-5, 1e-5, "test: a row", atol_rms=1.0)
    loc = _localise(Chain(1e-7 / 3), path, {"x": _x() * np.float32(1e-7)}, row)
    assert loc.first is not None and loc.first.path == "b", loc.verdict
    assert loc.first.finding == "function"


class Absorbing(nn.Module):
    """y = x + 1e-7 * a(x): what a computes barely reaches the output (a layer scale's)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Scale(2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.a(x) * 1e-7


def test_a_wrong_weight_the_outputs_absorb_is_named_and_the_verdict_stays_the_outputs(tmp_path):
    """A weight 1 % off inside, invisible at the outputs: named where the run passes (the
    isolated run proves it) with its bundle, and said to be absorbed; the outputs pass."""
    nodes = [
        scoped_node("Mul", ["x", "two"], ["h"], ["a"]),
        scoped_node("Mul", ["h", "small"], ["s"], []),
        scoped_node("Add", ["x", "s"], ["y"], []),
    ]
    weights = {"two": np.array(2.02, np.float32), "small": np.array(1e-7, np.float32)}
    path = save_model(
        tmp_path / "m.onnx", nodes, {"x": (TensorProto.FLOAT, [2, 3])}, {"y": [2, 3]}, weights
    )
    loc = _localise(Absorbing(), path, {"x": _x()}, repro_dir=tmp_path / "r")
    assert next(b for b in loc.boundaries if b.path == "").status == "pass"
    assert loc.first is not None and loc.first.path == "a", loc.verdict
    assert loc.verdict.startswith("the outputs are within tolerance, yet a module inside")
    assert (tmp_path / "r" / "bundle.json").is_file()
    weights["two"] = np.array(2.0, np.float32)  # the same graph, right: nothing named
    clean = save_model(
        tmp_path / "c.onnx", nodes, {"x": (TensorProto.FLOAT, [2, 3])}, {"y": [2, 3]}, weights
    )
    loc = _localise(Absorbing(), clean, {"x": _x()})
    assert loc.first is None and loc.verdict.startswith("no divergence"), loc.verdict


class Lookup(nn.Module):
    """y = x + emb(x > 0), a width of 1: an embedding whose only input is an integer another
    op made."""

    def __init__(self, table: np.ndarray) -> None:
        super().__init__()
        self.emb = nn.Embedding(*table.shape)
        self.emb.weight.data = torch.from_numpy(table.copy())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.emb((x > 0).long()).squeeze(-1)


def test_a_module_reading_an_untyped_integer_is_cut_out_and_named(tmp_path):
    """TorchScript leaves T5's bucket index untyped: taken for a float input no reference
    tensor was paired with, its relative attention bias could not be cut out, and its parent
    was named for a corrupted table. The type it ran with settles it."""
    table = np.array([[0.1], [0.2]], np.float32)
    nodes = [
        scoped_node("Greater", ["x", "zero"], ["g"], []),
        scoped_node("Cast", ["g"], ["idx"], [], to=TensorProto.INT64),
        scoped_node("Gather", ["table", "idx"], ["e"], ["emb"]),
        scoped_node("Squeeze", ["e", "last"], ["s"], []),
        scoped_node("Add", ["x", "s"], ["y"], []),
    ]
    wrong = table.copy()
    wrong[1, 0] += 0.5
    weights = {"table": wrong, "zero": np.array(0.0, np.float32), "last": np.array([-1])}
    path = save_model(
        tmp_path / "m.onnx", nodes, {"x": (TensorProto.FLOAT, [2, 3])}, {"y": [2, 3]}, weights
    )
    loc = _localise(Lookup(table), path, {"x": _x()})
    assert loc.first is not None and loc.first.path == "emb", loc.verdict


def test_a_file_scoped_to_modules_the_module_lacks_is_said_to_be_anothers(tmp_path):
    """A Qwen2 export checked against a Bloom module matched 3 of 29 calls by chance and named
    lm_head without a word on the file; a module's own export names only its own paths."""
    nodes = [
        scoped_node("Mul", ["x", "two"], ["h1"], ["p"]),
        scoped_node("Add", ["h1", "third"], ["h2"], []),
        scoped_node("Mul", ["h2", "three"], ["y"], ["q"]),
    ]
    weights = {k: np.array(v, np.float32) for k, v in (("two", 2), ("third", 1), ("three", 3))}
    path = save_model(
        tmp_path / "m.onnx", nodes, {"x": (TensorProto.FLOAT, [2, 3])}, {"y": [2, 3]}, weights
    )
    loc = _localise(Chain(), path, {"x": _x()})
    assert loc.foreign == ["p", "q"]
    assert "mostly scoped to modules this module does not have (p, q)" in loc.verdict
    own = _localise(Chain(), _chain(tmp_path / "own.onnx", third=1.0), {"x": _x()})
    assert own.foreign == [] and "scoped to modules" not in own.verdict


# --- padding ------------------------------------------------------------------------------------


class Masked(Chain):
    """Chain for a (batch, sequence, feature) x; the mask is for the exporter."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


def _masked(path, real_fault=False):
    """Masked's graph, whose b computes something else where the mask is 0 (padding) and, with
    `real_fault`, also at the first real position."""
    nodes = [
        scoped_node("Mul", ["x", "two"], ["h1"], ["a"]),
        scoped_node("Add", ["h1", "third"], ["h2"], []),
        scoped_node("Mul", ["h2", "three"], ["y0"], ["b"]),
        scoped_node("Sub", ["mask", "fault"], ["kept"], ["b"]),
        scoped_node("Cast", ["kept"], ["real"], ["b"], to=TensorProto.BOOL),
        scoped_node("Unsqueeze", ["real", "last"], ["real3"], ["b"]),
        scoped_node("Mul", ["y0", "half"], ["y1"], ["b"]),
        scoped_node("Where", ["real3", "y0", "y1"], ["y"], ["b"]),
    ]
    consts = {"two": 2.0, "third": 1.0 / 3.0, "three": 3.0, "half": 0.5}
    weights = {k: np.array(v, np.float32) for k, v in consts.items()}
    weights["last"] = np.array([-1], np.int64)
    weights["fault"] = np.zeros((2, 3), np.int64)
    weights["fault"][0, 0] = int(real_fault)
    inputs = {"x": (TensorProto.FLOAT, [2, 3, 4]), "mask": (TensorProto.INT64, [2, 3])}
    return save_model(path, nodes, inputs, {"y": [2, 3, 4]}, weights)


class Flattened(nn.Module):
    """y = b(a(x) flattened to (batch x sequence, feature)), back in (batch, sequence, feature)
    shape, as OPT's decoder layers run their feed-forward part."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = Scale(2.0), Scale(3.0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).reshape(6, 4)).reshape(2, 3, 4)


def test_a_flattened_boundary_that_differs_at_padded_rows_is_not_said_to_at_real_ones(tmp_path):
    """b's output is (batch x sequence, feature): the mask cannot lead it, so it is compared
    at every position, and its padded row (the last) differs. The verdict names no module and
    says b was compared with the padding included, never that it left tolerance at the real
    positions."""
    nodes = [
        scoped_node("Mul", ["x", "two"], ["h1"], ["a"]),
        scoped_node("Reshape", ["h1", "flat"], ["h2"], []),
        scoped_node("Mul", ["h2", "three"], ["f0"], ["b"]),
        scoped_node("Mul", ["f0", "half"], ["f1"], ["b"]),
        scoped_node("Where", ["real", "f0", "f1"], ["f"], ["b"]),
        scoped_node("Reshape", ["f", "shape"], ["y"], []),
    ]
    weights = {
        k: np.array(v, np.float32) for k, v in {"two": 2.0, "three": 3.0, "half": 0.5}.items()
    }
    weights |= {"flat": np.array([6, 4]), "shape": np.array([2, 3, 4])}
    weights["real"] = np.array([[1], [1], [1], [1], [1], [0]], bool)
    inputs = {"x": (TensorProto.FLOAT, [2, 3, 4]), "mask": (TensorProto.INT64, [2, 3])}
    path = save_model(tmp_path / "m.onnx", nodes, inputs, {"y": [2, 3, 4]}, weights)
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)
    feeds = {"x": x, "mask": np.array([[1, 1, 1], [1, 1, 0]], np.int64)}
    loc = _localise(Flattened(), path, feeds)
    assert loc.padding_only and loc.first is None and _failing(loc) == ["b"], loc.verdict
    assert "b left it compared at every position, padded ones included" in loc.verdict
    assert "at the real positions" not in loc.verdict, loc.verdict


def test_a_failure_only_at_padded_positions_names_no_module(tmp_path):
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)
    feeds = {"x": x, "mask": np.array([[1, 1, 1], [1, 1, 0]], np.int64)}
    loc = _localise(Masked(1.0 / 3.0), _masked(tmp_path / "m.onnx"), feeds)
    assert loc.padding_only and loc.real_positions == "mask" and loc.first is None, loc.verdict
    assert "only where mask is 0" in loc.verdict and "--padding-mask mask" in loc.verdict
    assert not _failing(loc)  # at the real positions every boundary is within tolerance
    # with the mask given (--padding-mask), no failure: said as none, not as "no module named"
    given = _localise(Masked(1.0 / 3.0), tmp_path / "m.onnx", feeds, keep=feeds["mask"] != 0)
    assert given.verdict.startswith("no divergence at the real positions"), given.verdict
    # wrong at a real position too: not padding, and b is named
    loc = _localise(Masked(1.0 / 3.0), _masked(tmp_path / "f.onnx", real_fault=True), feeds)
    assert not loc.padding_only and loc.first is not None and loc.first.path == "b", loc.verdict
    # its bundle, with the mask given, compares what the check compared: the 5 real positions'
    # 20 elements, of which the first position's 4 are wrong (the padded one's 4 left out)
    bundle = tmp_path / "bundle"
    keep = feeds["mask"] != 0
    loc = _localise(Masked(1.0 / 3.0), tmp_path / "f.onnx", feeds, keep=keep, repro_dir=bundle)
    assert loc.first is not None and loc.first.path == "b", loc.verdict
    run = subprocess.run(
        [sys.executable, "reproduce.py"], cwd=bundle, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1 and "4 of 20 elements outside" in run.stdout, run.stdout
    assert "real positions only" in (bundle / "README.md").read_text()


# --- observing changes the run ------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return self.norm(x + r)


class Residual(nn.Module):
    """head(norm(x + r)): the residual Add in `block`'s own ops, the LayerNorm its submodule."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x, r))


def _residual(path, net: Residual):
    """Residual's graph as dynamo writes it. ONNX Runtime fuses the Add and the LayerNorm into
    one SkipLayerNormalization, unless the Add's output is a graph output."""
    nodes = [
        scoped_node("Add", ["x", "r"], ["s"], ["block"]),
        scoped_node(
            "LayerNormalization", ["s", "g", "b"], ["n"], ["block", "block.norm"], epsilon=1e-5
        ),
        scoped_node("MatMul", ["n", "w"], ["m"], ["head"]),
        scoped_node("Add", ["m", "bias"], ["y"], ["head"]),
    ]
    p = {k: v.detach().numpy().astype(np.float32) for k, v in net.named_parameters()}
    weights = {
        "g": p["block.norm.weight"],
        "b": p["block.norm.bias"],
        "w": p["head.weight"].T.copy(),
        "bias": p["head.bias"],
    }
    inputs = {"x": (TensorProto.FLOAT, [2, 4, 32]), "r": (TensorProto.FLOAT, [2, 4, 32])}
    return save_model(path, nodes, inputs, {"y": [2, 4, 8]}, weights)


def test_a_fusion_that_observing_breaks_is_localised_by_isolation(tmp_path):
    """A residual stream with a large common offset, on a grid float32 adds exactly: Add then
    LayerNormalization is all but exact, while ONNX Runtime's fused SkipLayerNormalization
    loses about 5e-3 to cancellation. The plain run (fused) fails; the run with the LayerNorm's
    input as an output (not fused) passes, and its boundaries show nothing wrong. Isolation
    cuts out `block` (Add and LayerNorm, fused again in the cut) and names it."""
    torch.manual_seed(0)
    net = Residual().eval()
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    rng = np.random.default_rng(0)
    step = 2.0**-8  # 1000 + k * step and their sums are exact in float32
    x = (1000 + step * rng.integers(-8, 9, (2, 4, 32))).astype(np.float32)
    r = (step * rng.integers(-8, 9, (2, 4, 32))).astype(np.float32)
    loc = _localise(net, _residual(tmp_path / "m.onnx", net), {"x": x, "r": r})
    whole = next(b for b in loc.boundaries if b.path == "")
    observed = [b for b in loc.boundaries if b.path]
    # the premise: ONNX Runtime's fusion is what fails, and observing undoes it
    assert whole.status == "fail" and all(b.status == "pass" for b in observed), render(loc)
    assert loc.observer is not None and loc.observer.changed
    assert loc.verdict.startswith("observing changed the run")
    assert loc.first is not None and loc.first.path == "block", render(loc)
    assert loc.first.finding == "runtime"  # a plain float32 evaluation of its nodes passes
    norm = next(b for b in loc.boundaries if b.path == "block.norm")
    assert norm.isolated_status == "pass"  # the LayerNorm alone computes right


# --- one module called again and again: its calls' tensors are never another call's -----------


class Step(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((3,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x * self.weight


class Repeated(nn.Module):
    """head(step(step(step(x)))): one module applied three times, its residual inside it (an
    ALBERT layer), so that the graph joins its calls into one run of nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.step = Step()
        self.head = Affine(2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = self.step(x)
        return self.head(x)


def _repeated(path, head_scale=2.0, shared_cast=False):
    """Repeated's graph; `shared_cast`: the step's weight cast once for all three calls (in the
    step's scope), so that its nodes no longer cut into three like runs."""
    weight = "w" if shared_cast else "step.weight"
    nodes = [scoped_node("Cast", ["step.weight"], ["w"], ["step"], to=TensorProto.FLOAT)]
    nodes = nodes if shared_cast else []
    for k in range(3):
        nodes += [
            scoped_node("Mul", [f"h{k}" if k else "x", weight], [f"m{k}"], ["step"]),
            scoped_node("Add", [f"h{k}" if k else "x", f"m{k}"], [f"h{k + 1}"], ["step"]),
        ]
    nodes += [
        scoped_node("Mul", ["h3", "head.weight"], ["p"], ["head"]),
        scoped_node("Add", ["p", "one"], ["y"], ["head"]),
    ]
    weights = {
        "step.weight": np.full(3, 0.5, np.float32),
        "head.weight": np.full(3, head_scale, np.float32),
        "one": np.array(1.0, np.float32),
    }
    return save_model(path, nodes, {"x": (TensorProto.FLOAT, [2, 3])}, {"y": [2, 3]}, weights)


@pytest.mark.parametrize("shared_cast", [False, True], ids=["cut-into-calls", "one-region"])
def test_a_module_called_again_and_again_is_never_named_for_a_later_fault(tmp_path, shared_cast):
    path = _repeated(tmp_path / "m.onnx", head_scale=2.02, shared_cast=shared_cast)
    loc = _localise(Repeated(), path, {"x": _x()})
    assert loc.first is not None and loc.first.label == "head", render(loc)
    statuses = {b.label: b.status for b in loc.boundaries if b.path == "step"}
    expected = "unmatched" if shared_cast else "pass"  # never a call's output paired with another's
    assert statuses == {"step#1": expected, "step#2": expected, "step#3": expected}, render(loc)
    clean = _localise(
        Repeated(), _repeated(tmp_path / "c.onnx", shared_cast=shared_cast), {"x": _x()}
    )
    assert not _failing(clean) and clean.first is None, render(clean)


class TwoOutputs(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(x), x * 1.0


def test_an_output_of_another_shape_is_said_in_its_own_words_not_by_the_others_figures(tmp_path):
    """The second output comes back (3, 2) where the module's is (2, 3) (an exporter that
    fixed a Reshape at the export's sizes, as dynamo did for a GRU): the named module's figures
    say the shape, not only the first output's error, which is within tolerance."""
    nodes = [
        scoped_node("Relu", ["x"], ["y"], []),
        scoped_node("Reshape", ["x", "shape"], ["z"], []),
    ]
    weights = {"shape": np.array([3, 2], np.int64)}
    outputs = {"y": [2, 3], "z": [3, 2]}
    path = save_model(
        tmp_path / "m.onnx", nodes, {"x": (TensorProto.FLOAT, [2, 3])}, outputs, weights
    )
    loc = _localise(TwoOutputs(), path, {"x": _x()})
    assert loc.first is not None and loc.first.path == ""
    assert "in the run shape [3, 2] != golden [2, 3]" in loc.verdict, loc.verdict
    assert "it fails too (shape [3, 2] != golden [2, 3])" in loc.verdict, loc.verdict
