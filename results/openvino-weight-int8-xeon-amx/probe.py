"""OpenVINO with int8 weights only (DequantizeLinear on each weight matrix, per output column)
and its dynamic activation quantisation, against ONNX Runtime's dynamic int8 graph and
OpenVINO bf16 on the float32 export; run in a folder holding the base exports:
  tconform export --preset base --case transformer --out f32   (and --dtype int4 --out i4,
  --dtype int8 --out i8), then python probe.py. Output: output.txt beside it."""

import time

import numpy as np
import onnx
import onnxruntime as ort
import openvino as ov
from onnx import helper, numpy_helper


def weight_only_int8(src, dst):
    m = onnx.load(src)
    inits = {i.name: i for i in m.graph.initializer}
    new_nodes = []
    for n in m.graph.node:
        if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2:
            w = numpy_helper.to_array(inits[n.input[1]])
            s = np.abs(w).max(axis=0) / 127.0
            s[s == 0] = 1
            q = np.clip(np.round(w / s), -127, 127).astype(np.int8)
            nm = n.input[1]
            m.graph.initializer.remove(inits[nm])
            m.graph.initializer.extend(
                [
                    numpy_helper.from_array(q, nm + "_q"),
                    numpy_helper.from_array(s.astype(np.float32), nm + "_s"),
                ]
            )
            new_nodes.append(
                helper.make_node("DequantizeLinear", [nm + "_q", nm + "_s"], [nm], axis=1)
            )
        new_nodes.append(n)
    del m.graph.node[:]
    m.graph.node.extend(new_nodes)
    onnx.save(m, dst)


def feeds(path, b, s):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    f = {}
    for i in sess.get_inputs():
        if "ids" in i.name:
            f[i.name] = rng.integers(1, 30000, (b, s)).astype(np.int64)
        else:
            f[i.name] = np.ones((b, s), dtype=bool if i.type == "tensor(bool)" else np.int64)
    return f


def timeit(fn, secs=3):
    fn()
    fn()
    ts = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs or len(ts) < 5:
        a = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - a)
    return np.median(ts) * 1e3


core = ov.Core()


def ovrun(path, cfg, f):
    c = core.compile_model(
        path, "CPU", {"INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY", **cfg}
    )
    r = c.create_infer_request()
    return timeit(lambda: r.infer(f)), r


def ortrun(path, f):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return timeit(lambda: s.run(None, f)), s


if __name__ == "__main__":
    weight_only_int8("f32/transformer/model.onnx", "w8.onnx")
    for shape in [(1, 32), (8, 128)]:
        f = feeds("f32/transformer/model.onnx", *shape)
        ref = ort.InferenceSession(
            "f32/transformer/model.onnx", providers=["CPUExecutionProvider"]
        ).run(None, f)[0]

        def err(o, ref=ref):
            o = np.asarray(o)
            return 10 * np.log10((ref**2).sum() / ((o - ref) ** 2).sum())

        t, s = ortrun("i8/transformer/model.onnx", f)
        print(shape, "ort int8", round(t, 2), "sqnr", round(err(s.run(None, f)[0]), 1), flush=True)
        for name, path, cfg in [
            ("ov bf16 f32", "f32/transformer/model.onnx", {"INFERENCE_PRECISION_HINT": "bf16"}),
            ("ov w8 bf16", "w8.onnx", {"INFERENCE_PRECISION_HINT": "bf16"}),
            (
                "ov w8 bf16 dq32",
                "w8.onnx",
                {"INFERENCE_PRECISION_HINT": "bf16", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 32},
            ),
            (
                "ov w8 bf16 dqmax",
                "w8.onnx",
                {"INFERENCE_PRECISION_HINT": "bf16", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 4294967295},
            ),
            (
                "ov w8 f32 dq32",
                "w8.onnx",
                {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 32},
            ),
            ("ov i4 bf16", "i4/transformer/model.onnx", {"INFERENCE_PRECISION_HINT": "bf16"}),
            (
                "ov i4 bf16 dq32",
                "i4/transformer/model.onnx",
                {"INFERENCE_PRECISION_HINT": "bf16", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 32},
            ),
        ]:
            try:
                t, r = ovrun(path, cfg, f)
                print(
                    shape,
                    name,
                    round(t, 2),
                    "sqnr",
                    round(err(r.get_output_tensor(0).data), 1),
                    flush=True,
                )
            except Exception as e:
                print(shape, name, "ERR", str(e)[:200], flush=True)
