"""OpenVINO's error against the goldens, under hint f32 and hint bf16 (docs/openvino.md).

    python -m tconform verify --no-doc --artifacts artifacts-ov   # exports the models
    python scripts/openvino_errors.py --artifacts artifacts-ov [--json OUT.json] [--doc]

For every case of the golden folder and every input set it runs the exported model on OpenVINO's
CPU plugin asked for f32 and asked for bf16 (what OpenVINO read back is printed: a CPU without
AVX512-BF16 or AMX compiles a bf16 request to f32) and, for comparison, on ONNX Runtime's CPU
provider. Each output is compared with its golden under the float32 row of its tolerance class
(tconform.compare): the largest |error| and the share of the tolerance used.

"bf16 emulated" is no OpenVINO run: ONNX Runtime runs the model with bfloat16 rounding inserted
where OpenVINO's CPU plugin keeps bfloat16 (`emulate_bf16`), for a machine that cannot show the
real thing; "bf16 mm-only" rounds only what the MatMuls read, the fewest roundings a bf16 matrix
product can mean. "needed" is the smallest t with |err| <= t + t*|golden| for every element: the
tolerance row Tolerance(t, t) that the run would just pass.

--doc also runs the document checks (tconform doc) with OpenVINO f32 next to ONNX Runtime.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, shape_inference

from tconform import golden, registry
from tconform.compare import compare_output, tolerance_for
from tconform.runtimes.onnxruntime import OrtRuntime
from tconform.runtimes.openvino import OpenVinoRuntime

# Ops OpenVINO's CPU plugin runs in bf16 whatever follows them (graph.cpp,
# EnforceInferencePrecision: FullyConnected and MatMul are the ones these models have).
SIGNIFICANT = {"MatMul", "Gemm"}


def round_bf16(array: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).reshape(np.shape(array))


# Ops OpenVINO fuses into the MatMul before them, by what they read besides its result
# (docs/openvino.md: the executed graph's originalLayersNames): bias, scale, activation; and the
# attention block (scale, mask, softmax, second MatMul) of a MatMul of two activations.
_ELEMENTWISE = {"Add", "Sub", "Mul", "Div"}


def fused_chains(g, consts, consumers, producer) -> tuple[set[str], set[str]]:
    """(names of the nodes fused into a MatMul, tensors inside such a fused node).

    A MatMul's result runs on through single-reader successors that OpenVINO fuses into it:
    elementwise ops with a constant other operand, Relu, and for a MatMul of two activations
    (attention scores) also the mask's Where and the Softmax. A residual Add (two activations)
    or a normalisation ends the fused node, as in OpenVINO's executed graph."""
    members: set[str] = set()
    inside: set[str] = set()
    for start in g.node:
        if start.op_type not in SIGNIFICANT:
            continue
        scores = not any(i in consts for i in start.input)
        members.add(start.name)
        node = start
        while len(node.output) == 1 and len(consumers[node.output[0]]) == 1:
            nxt = consumers[node.output[0]][0]
            if nxt is None:
                break
            others = [i for i in nxt.input if i != node.output[0]]
            fusable = (
                (nxt.op_type in _ELEMENTWISE and all(i in consts for i in others))
                or nxt.op_type == "Relu"
                or (scores and nxt.op_type in ("Where", "Softmax"))
            )
            if not fusable:
                break
            inside.add(node.output[0])
            members.add(nxt.name)
            node = nxt
            if nxt.op_type == "Softmax":  # its result goes to the next MatMul in bf16
                break
    return members, inside


def emulate_bf16(model: onnx.ModelProto, stored: bool = True) -> onnx.ModelProto:
    """The model with bfloat16 rounding where OpenVINO's CPU plugin keeps bfloat16 at hint bf16.

    The plugin's rule (EnforceInferencePrecision): every node runs with bf16 inputs and outputs,
    except the graph's tail, the nodes between the last MatMul and an output, which stay f32;
    constant inputs keep f32 except a MatMul's weights; a MatMul's products are summed in f32
    and what OpenVINO fuses into it (bias, scale, Relu; attention's mask and softmax) is
    computed on the f32 sums (`fused_chains`), with no rounding in between. Rounding is a Cast
    to bfloat16 and back (round to nearest even, as oneDNN's conversion).

    stored=False rounds only what a MatMul reads (activations and weights) and keeps every other
    tensor float32: the fewest roundings a bf16 matrix product can mean."""
    model = shape_inference.infer_shapes(model)
    g = model.graph
    for k, n in enumerate(g.node):  # the rule goes by node names: make them unique
        n.name = f"{k}:{n.name}"
    inits = {i.name: i for i in g.initializer}
    consts = set(inits) | {o for n in g.node if n.op_type == "Constant" for o in n.output}
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.value_info, *g.output)}
    producer = {o: n.name for n in g.node for o in n.output}
    consumers = defaultdict(list)
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)
    for o in g.output:  # an output is read outside: it cannot stay inside a fused node
        consumers[o.name].append(None)
    is_float = {t for t, k in types.items() if k == TensorProto.FLOAT}

    significant, unfused = fused_chains(g, consts, consumers, producer)

    tail: set[str] = set()  # f32: reached from an output without passing a significant node
    nodes = {n.name: n for n in g.node}
    stack = [producer[o.name] for o in g.output if o.name in producer]
    while stack:
        name = stack.pop()
        if name in significant or name in tail:
            continue
        tail.add(name)
        stack += [producer[i] for i in nodes[name].input if i in producer]
    low = {n.name for n in g.node if n.name not in tail and n.op_type != "Constant"}

    whole = set()  # produced by a bf16 node: every consumer sees the rounded value
    at_input = defaultdict(set)  # f32 tensor -> the bf16 nodes that read it rounded
    for n in g.node:
        if n.name not in low:
            continue
        if not stored:
            if n.op_type in SIGNIFICANT:
                for i in n.input:
                    if i in is_float and i not in consts:
                        at_input[i].add(n.name)
        else:
            whole.update(o for o in n.output if o in is_float and o not in unfused)
            for i in n.input:
                if i in is_float and i not in consts and i not in unfused and i not in whole:
                    at_input[i].add(n.name)
        if n.op_type in SIGNIFICANT:  # weights in bf16
            for i in n.input:
                if i in inits and inits[i].data_type == TensorProto.FLOAT:
                    rounded = round_bf16(numpy_helper.to_array(inits[i]))
                    inits[i].CopyFrom(numpy_helper.from_array(rounded, i))
    for t in whole:  # a bf16 node's output may be read before it is seen as another's input
        at_input.pop(t, None)

    def cast_pair(source: str, target: str) -> list[onnx.NodeProto]:
        return [
            helper.make_node("Cast", [source], [f"{target}__bf16"], to=TensorProto.BFLOAT16),
            helper.make_node("Cast", [f"{target}__bf16"], [target], to=TensorProto.FLOAT),
        ]

    new_nodes = []
    for t in sorted(at_input):  # f32 tensors (inputs, tail outputs) rounded for bf16 readers
        if t not in producer:
            new_nodes += cast_pair(t, f"{t}__r")
    for n in g.node:
        for k, i in enumerate(n.input):
            if n.name in at_input.get(i, ()):
                n.input[k] = f"{i}__r"
        renamed = []
        for k, o in enumerate(n.output):
            if o in whole:
                n.output[k] = f"{o}__f32"
                renamed.append(o)
        new_nodes.append(n)
        for o in renamed:
            new_nodes += cast_pair(f"{o}__f32", o)
        for o in n.output:
            if o in at_input:
                new_nodes += cast_pair(o, f"{o}__r")
    del g.node[:]
    g.node.extend(new_nodes)
    return model


def needed(actual: np.ndarray, gold: np.ndarray) -> float:
    """The smallest t with |actual - golden| <= t * (1 + |golden|) everywhere."""
    err = np.abs(actual.astype(np.float64) - gold.astype(np.float64))
    return float((err / (1 + np.abs(gold.astype(np.float64)))).max())


class Emulated:
    """ONNX Runtime CPU on the bf16-emulated model, without graph rewrites of its own."""

    def __init__(self, path: Path, stored: bool = True) -> None:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        model = emulate_bf16(onnx.load(str(path)), stored)
        self.session = ort.InferenceSession(
            model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        self.precision = "bf16 (emulated)" if stored else "bf16 matmul-only"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [output.name for output in self.session.get_outputs()]
        return dict(zip(names, self.session.run(None, feeds), strict=True))


def measure(golden_dir: Path, artifacts: Path) -> list[dict]:
    manifest = golden.read_golden_manifest(golden_dir)
    cfg = golden.manifest_config(manifest)
    rows = []
    for name in manifest["cases"]:
        case = registry.get_case(name)
        model = artifacts / name / "model.onnx"
        sets = golden.read_case(golden_dir, manifest, case, cfg)
        tol = tolerance_for("float32", case.tolerance)
        engines = {}
        for engine, runtime in (
            ("openvino f32", OpenVinoRuntime()),
            ("openvino bf16", OpenVinoRuntime(bf16=True)),
        ):
            started = time.perf_counter()
            session = runtime.open(model)
            engines[engine] = (session, time.perf_counter() - started, session.node_precisions)
        engines["ort-cpu"] = (OrtRuntime().open(model), None, None)
        engines["bf16 emulated"] = (Emulated(model), None, None)
        engines["bf16 mm-only"] = (Emulated(model, stored=False), None, None)
        for engine, (session, seconds, nodes) in engines.items():
            row = {
                "case": name,
                "class": case.tolerance,
                "engine": engine,
                "precision": getattr(session, "precision", "float32"),
                "compile_s": None if seconds is None else round(seconds, 3),
                "node_precisions": nodes,
                "max_abs_err": 0.0,
                "tolerance_used": 0.0,
                "needed": 0.0,
                "status": "pass",
                "per_output": {},
            }
            for input_set in sets:
                outputs = list(session.run(dict(input_set.inputs)).values())
                for out, (oname, gold) in zip(outputs, input_set.outputs.items(), strict=True):
                    c = compare_output(oname, np.asarray(out), gold, tol)
                    row["max_abs_err"] = max(row["max_abs_err"], c.max_abs_err or 0.0)
                    row["tolerance_used"] = max(row["tolerance_used"], c.tolerance_used or 0.0)
                    need = needed(np.asarray(out), gold)
                    row["needed"] = max(row["needed"], need)
                    key = f"{oname}"
                    was = row["per_output"].get(key, 0.0)
                    row["per_output"][key] = max(was, c.max_abs_err or 0.0)
                    if c.status != "pass":
                        row["status"] = "fail"
            rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'case':20} {'class':9} {'engine':14} {'prec':16} {'max|err|':>9} {'used':>8} "
          f"{'needed':>9} {'status':6} compile_s")  # fmt: skip
    for r in rows:
        compile_s = "" if r["compile_s"] is None else f"{r['compile_s']:.3f}"
        print(f"{r['case']:20} {r['class']:9} {r['engine']:14} {r['precision']:16} "
              f"{r['max_abs_err']:9.2e} {r['tolerance_used']:8.3f} {r['needed']:9.2e} "
              f"{r['status']:6} {compile_s}")  # fmt: skip
    print()
    by_class: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        by_class[(r["engine"], r["class"])].append(r["needed"])
    print("worst 'needed' per engine and tolerance class:")
    for (engine, cls), values in sorted(by_class.items()):
        print(f"  {engine:14} {cls:9} {max(values):9.2e}  (cases: {len(values)})")


def doc_checks(artifacts: Path) -> dict:
    """tconform doc's checks with OpenVINO f32 beside ONNX Runtime CPU and torch."""
    from tconform.doc import report as doc_report
    from tconform.doc.run import doc_runtimes
    from tconform.runtimes import label

    def with_openvino(eps: list[str], **options):
        runtimes = doc_runtimes(eps, **options)
        runtime = OpenVinoRuntime()
        return {**runtimes, label(runtime): runtime}

    doc_report.doc_runtimes = with_openvino
    checked = doc_report.run_document_checks(["cpu"], artifacts)
    summary: dict = {"cases": defaultdict(dict), "properties": []}
    for case_id, outcomes in checked.case_runtimes.items():
        for name, outcome in outcomes.items():
            summary["cases"][case_id][name] = [outcome.status, outcome.max_abs_err]
    for prop in checked.properties:
        summary["properties"].append(
            [prop.id, prop.runtime, prop.status, prop.violation, prop.limit, prop.message]
        )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--golden", type=Path, default=Path("golden"))
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--doc", action="store_true", help="also run the document checks")
    args = parser.parse_args()
    rows = measure(args.golden, args.artifacts)
    print_table(rows)
    out: dict = {"settings": OpenVinoRuntime().settings(), "rows": rows}
    out["settings_bf16"] = OpenVinoRuntime(bf16=True).settings()
    if args.doc:
        out["doc"] = doc_checks(args.artifacts)
        for case_id, outcomes in out["doc"]["cases"].items():
            print(case_id, outcomes)
        for prop in out["doc"]["properties"]:
            print(*prop[:5])
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
