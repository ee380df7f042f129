"""The precision row a model earns: only what reaches its outputs counts (issue 28, item 4)."""

from itertools import pairwise

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tconform.provenance import compute_type, live_part, quantized_share

pytestmark = pytest.mark.unit

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def _model(nodes, initializers, inputs=("x",), outputs=("y",), elem=F32):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, elem, [4]) for n in inputs],
        [helper.make_tensor_value_info(n, elem, [4]) for n in outputs],
        initializer=initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _int8(name, shape):
    return numpy_helper.from_array(np.ones(shape, np.int8), name)


def test_dead_nodes_and_their_weights_are_not_live_and_a_branchs_outer_reads_are():
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["x", "w_then"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", F32, [4])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", F32, [4])],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Cast", ["s"], ["c"], to=TensorProto.BOOL),
        helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("DequantizeLinear", ["dead_q", "dead_scale"], ["nowhere"]),
    ]
    weights = [
        numpy_helper.from_array(np.ones(4, np.float32), "w_then"),
        _int8("dead_q", (100, 10)),
        numpy_helper.from_array(np.array(0.1, np.float32), "dead_scale"),
    ]
    model = _model(nodes, weights)
    live = live_part(model.graph)
    assert sorted(n.op_type for n in live.nodes) == ["Add", "Cast", "Identity", "If", "ReduceSum"]
    assert [t.name for t in live.initializers] == ["w_then"]
    assert quantized_share(model) == 0.0
    model.graph.output.append(helper.make_tensor_value_info("nowhere", F32, [100, 10]))
    assert quantized_share(model) == 1.0  # the same weight, once it reaches an output


def _dequantized_matmuls(int8_elements: int, float_elements: int):
    """y = x @ dequantize(q) + x @ w (each reaching the output), weights of the given sizes."""
    rows = 4
    nodes = [
        helper.make_node("DequantizeLinear", ["q", "scale"], ["wq"]),
        helper.make_node("MatMul", ["x", "wq"], ["a"]),
        helper.make_node("MatMul", ["x", "w"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    weights = [
        numpy_helper.from_array(np.ones((rows, int8_elements // rows), np.int8), "q"),
        numpy_helper.from_array(np.array(0.1, np.float32), "scale"),
        numpy_helper.from_array(np.ones((rows, float_elements // rows), np.float32), "w"),
    ]
    return _model(nodes, weights)


def test_int8_weights_earn_the_int8_row_only_where_they_are_most_of_what_computes():
    assert compute_type(_dequantized_matmuls(4000, 4)) == ("int8", "")
    # a quantiser that left a quarter float (nn.MultiheadAttention's sliced projections)
    assert compute_type(_dequantized_matmuls(3000, 1000)) == ("int8", "")
    mixed = _dequantized_matmuls(2000, 2000)
    assert quantized_share(mixed) == pytest.approx(0.5)
    precision, why = compute_type(mixed)
    assert precision == "float32"
    assert "int8 50% of its weights" in why and "stricter float32 row" in why
    assert compute_type(_dequantized_matmuls(400, 3600))[0] == "float32"  # int8 not live enough


def test_a_float_table_only_looked_up_computes_nothing_and_one_multiplied_does():
    """An int4 export keeps its embedding table float32: gathered rows enter the compute
    exactly, so the quantised products alone decide the row; the same table in a product
    (a tied output head left float) computes in float32."""
    rows = 4

    def model(tied_head: bool):
        head = (
            helper.make_node("MatMul", ["a", "table"], ["y"])
            if tied_head
            else helper.make_node("Identity", ["a"], ["y"])
        )
        nodes = [
            helper.make_node("Gather", ["table", "ids"], ["e"]),
            helper.make_node("DequantizeLinear", ["q", "scale"], ["wq"]),
            helper.make_node("MatMul", ["e", "wq"], ["a"]),
            head,
        ]
        weights = [
            numpy_helper.from_array(np.ones((rows, 100), np.float32), "table"),
            numpy_helper.from_array(np.ones((rows, 10), np.int8), "q"),
            numpy_helper.from_array(np.array(0.1, np.float32), "scale"),
            numpy_helper.from_array(np.zeros((1,), np.int64), "ids"),
        ]
        return _model(nodes, weights)

    assert quantized_share(model(False)) == 1.0
    assert compute_type(model(False)) == ("int8", "")
    assert quantized_share(model(True)) == pytest.approx(40 / 440)
    assert compute_type(model(True))[0] == "float32"


def test_float16_and_float32_compute_mixed_take_the_stricter_row():
    def chain(count, start):
        names = [start, *(f"{start}{k}" for k in range(count))]
        return [helper.make_node("Relu", [a], [b]) for a, b in pairwise(names)], names[-1]

    half, end16 = chain(6, "h")
    full, end32 = chain(6, "f")
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], to=F16),
        *half,
        helper.make_node("Cast", [end16], ["f"], to=F32),
        *full,
        helper.make_node("Identity", [end32], ["y"]),
    ]
    precision, why = compute_type(_model(nodes, []))
    assert precision == "float32" and "float16" in why and "stricter float32 row" in why
    only_half = [helper.make_node("Cast", ["x"], ["h"], to=F16), *half]
    only_half.append(helper.make_node("Cast", [end16], ["y"], to=F32))
    assert compute_type(_model(only_half, [])) == ("float16", "")


def _dense(dtype, seed=0):
    """A 4x4 weight every output of which sums four inputs."""
    return np.random.default_rng(seed).uniform(0.5, 1.5, (4, 4)).astype(dtype)


def test_matrix_products_decide_the_float_type_where_any_reaches_the_outputs():
    """A float16 conversion that keeps a clamp's Min and Max (and their float32 bounds) around
    its float16 MatMuls computes in float16: it was judged mixed by the float32 row, and its
    float16 rounding failed it. MatMuls in both types are mixed, and take the stricter row."""
    weights = [numpy_helper.from_array(_dense(np.float16), f"w{k}") for k in range(2)]
    bounds = [
        numpy_helper.from_array(np.full(4, v, np.float32), n) for n, v in (("lo", -1), ("hi", 1))
    ]
    products = [
        helper.make_node("Cast", ["x"], ["h"], to=F16),
        helper.make_node("MatMul", ["h", "w0"], ["h1"]),
        helper.make_node("MatMul", ["h1", "w1"], ["h2"]),
        helper.make_node("Cast", ["h2"], ["f"], to=F32),
    ]
    clamp = [
        helper.make_node("Max", ["f", "lo"], ["f1"]),
        helper.make_node("Min", ["f1", "hi"], ["f2"]),
        helper.make_node("Max", ["f2", "lo"], ["f3"]),
        helper.make_node("Min", ["f3", "hi"], ["y"]),
    ]
    assert compute_type(_model(products + clamp, weights + bounds)) == ("float16", "")
    full = numpy_helper.from_array(_dense(np.float32), "w2")
    mixed = [*products[:-1], helper.make_node("Cast", ["h2"], ["f"], to=F32)]
    mixed.append(helper.make_node("MatMul", ["f", "w2"], ["y"]))
    precision, why = compute_type(_model(mixed, [*weights, full]))
    assert precision == "float32" and "matrix products' inputs" in why, why


def _narrow_tail(count, make):
    """Nodes that take float32 `t` to the output `y` through `count` float16 nodes made by
    make(k, input, output), between a Cast pair."""
    names = ["h", *(f"h{k}" for k in range(count))]
    nodes = [helper.make_node("Cast", ["t"], ["h"], to=F16)]
    nodes += [make(k, a, b) for k, (a, b) in enumerate(pairwise(names))]
    return [*nodes, helper.make_node("Cast", [names[-1]], ["y"], to=F32)]


def test_no_op_float16_nodes_do_not_buy_a_float32_model_the_float16_row():
    """Outsider's spoof: a float32 model with no-op float16 nodes appended (identity or
    permutation products, Identity chains, x * 1, x + 0) outnumbered its own nodes, and was
    judged (and passed) by the float16 row. Only arithmetic that sums counts."""
    head = [helper.make_node("MatMul", ["x", "w"], ["t"])]
    weight = [numpy_helper.from_array(_dense(np.float32), "w")]
    eye = numpy_helper.from_array(np.eye(4, dtype=np.float16), "eye")
    permutation = numpy_helper.from_array(np.eye(4, dtype=np.float16)[::-1] * 2, "perm")
    one = numpy_helper.from_array(np.ones(4, np.float16), "one")
    zero = numpy_helper.from_array(np.zeros(4, np.float16), "zero")
    spoofs = {
        "identity products": (lambda k, a, b: helper.make_node("MatMul", [a, "eye"], [b]), [eye]),
        "permutation Gemms": (
            lambda k, a, b: helper.make_node("Gemm", [a, "perm"], [b], transB=1),
            [permutation],
        ),
        "Identity chain": (lambda k, a, b: helper.make_node("Identity", [a], [b]), []),
        "x * 1 and x + 0": (
            lambda k, a, b: helper.make_node(
                ("Mul", "Add")[k % 2], [a, ("one", "zero")[k % 2]], [b]
            ),
            [one, zero],
        ),
    }
    rng = np.random.default_rng(2)
    q = np.linalg.qr(rng.normal(size=(4, 4)))[0]
    rotations = [
        numpy_helper.from_array(w.astype(np.float16), n) for n, w in (("q", q), ("qt", q.T))
    ]
    near = np.eye(4) + rng.uniform(-1e-3, 1e-3, (4, 4))
    spoofs["near-identity products"] = (
        lambda k, a, b: helper.make_node("MatMul", [a, "near"], [b]),
        [numpy_helper.from_array(near.astype(np.float16), "near")],
    )
    spoofs["a rotation and its transpose"] = (
        lambda k, a, b: helper.make_node("MatMul", [a, ("q", "qt")[k % 2]], [b]),
        rotations,
    )
    for what, (make, extra) in spoofs.items():
        nodes = head + _narrow_tail(20, make)
        assert compute_type(_model(nodes, weight + extra)) == ("float32", ""), what
    gain = [numpy_helper.from_array(_dense(np.float32)[0], "w")]  # no product: a scaled input
    scaled = [helper.make_node("Mul", ["x", "w"], ["t"])]
    make, extra = spoofs["identity products"]
    assert compute_type(_model(scaled + _narrow_tail(8, make), gain + extra))[0] == "float32"


def test_a_float32_product_keeps_the_float32_row_however_many_float16_ones_sit_beside():
    dense16 = numpy_helper.from_array(_dense(np.float16, 1), "d")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"])]
    nodes += _narrow_tail(20, lambda k, a, b: helper.make_node("MatMul", [a, "d"], [b]))
    precision, why = compute_type(
        _model(nodes, [numpy_helper.from_array(_dense(np.float32), "w"), dense16])
    )
    assert precision == "float32" and "float16 95%" in why and "float32 5%" in why, why


def test_a_float32_outer_product_in_a_float16_model_computes_nothing_a_row_is_earned_by():
    """Rotary embeddings multiply their frequencies by the positions in float32 inside a
    float16 model: an inner size of 1 sums nothing, and the model stays float16."""
    freq = numpy_helper.from_array(np.ones((1, 1, 4), np.float32), "freq")
    positions = helper.make_tensor_value_info("pos", F32, [1, 4, 1])
    nodes = [
        helper.make_node("MatMul", ["pos", "freq"], ["angles"]),
        helper.make_node("Cos", ["angles"], ["cos"]),
        helper.make_node("Cast", ["cos"], ["c16"], to=F16),
        helper.make_node("Cast", ["x"], ["h"], to=F16),
        helper.make_node("MatMul", ["h", "d"], ["p"]),
        helper.make_node("Mul", ["p", "c16"], ["q"]),
        helper.make_node("Cast", ["q"], ["y"], to=F32),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F32, [1, 4, 4]), positions],
        [helper.make_tensor_value_info("y", F32, [1, 4, 4])],
        initializer=[freq, numpy_helper.from_array(_dense(np.float16), "d")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert compute_type(model) == ("float16", "")


def test_no_op_weights_the_graph_was_read_without_are_read_from_the_file(tmp_path):
    """A given model is read without its large weights (tconform.models.read_graph): a 64x64
    float16 identity (8 KB) is left out of the graph, and read from the file to be seen."""
    from tconform.models import WEIGHT_BYTES, read_graph
    from tconform.provenance import onnx_provenance

    size = 64
    eye = numpy_helper.from_array(np.eye(size, dtype=np.float16), "eye")
    assert len(eye.raw_data) > WEIGHT_BYTES
    dense = np.random.default_rng(0).uniform(0.5, 1.5, (size, size)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"])]
    nodes += _narrow_tail(8, lambda k, a, b: helper.make_node("MatMul", [a, "eye"], [b]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F32, [2, size])],
        [helper.make_tensor_value_info("y", F32, [2, size])],
        initializer=[numpy_helper.from_array(dense, "w"), eye],
    )
    path = tmp_path / "spoof.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    read = read_graph(path)
    assert not next(t for t in read.graph.initializer if t.name == "eye").raw_data
    assert onnx_provenance(path, "given", "0" * 64, read).precision == "float32"


def test_a_float32_weight_read_by_arithmetic_keeps_the_float32_row():
    """Outsider's second pass: a float32 model's own compute hidden from the product count (a
    norm's gain; ONNX Runtime's com.microsoft FusedMatMul) beside float16 nodes that do compute
    but cancel (x + c - c, a rotation and its transpose in Einsums) was judged float16."""
    gain = numpy_helper.from_array(_dense(np.float32)[0], "g")
    c = numpy_helper.from_array(np.full(4, 0.5, np.float16), "c")
    q = np.linalg.qr(np.random.default_rng(3).normal(size=(4, 4)))[0]
    rotations = [
        numpy_helper.from_array(w.astype(np.float16), n) for n, w in (("q", q), ("t", q.T))
    ]
    tails = {
        "x + c - c": (lambda k, a, b: helper.make_node(("Add", "Sub")[k % 2], [a, "c"], [b]), [c]),
        "rotation, transpose": (
            lambda k, a, b: helper.make_node(
                "Einsum", [a, ("q", "t")[k % 2]], [b], equation="i,ij->j"
            ),
            rotations,
        ),
    }
    heads = {
        "a norm's gain": ([helper.make_node("Mul", ["x", "g"], ["t"])], [gain]),
        "FusedMatMul": (
            [helper.make_node("FusedMatMul", ["x", "w"], ["t"], domain="com.microsoft", alpha=1.0)],
            [numpy_helper.from_array(_dense(np.float32), "w")],
        ),
    }
    for head, (first, weights) in heads.items():
        for tail, (make, extra) in tails.items():
            model = _model(first + _narrow_tail(24, make), weights + extra)
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
            precision, why = compute_type(model)
            assert precision == "float32", (head, tail, why)
            assert not why or "float32 weights read by" in why, why


def test_int8_weights_that_sum_nothing_buy_no_model_the_int8_row():
    """An int8 identity (or permutation) dequantised into MatMuls after a wrong float32 model
    held most of its live weights, and bought it the int8 row's looser tolerance."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"])]
    names = ["t", *(f"t{k}" for k in range(3))]
    weights = [numpy_helper.from_array(_dense(np.float32), "w")]
    for k, (a, b) in enumerate(pairwise(names)):
        nodes += [
            helper.make_node("DequantizeLinear", [f"q{k}", "scale", "zero"], [f"d{k}"]),
            helper.make_node("MatMul", [a, f"d{k}"], [b]),
        ]
        weights.append(numpy_helper.from_array(np.eye(4, dtype=np.int8)[::-1] + 3, f"q{k}"))
    nodes.append(helper.make_node("Identity", [names[-1]], ["y"]))
    weights += [
        numpy_helper.from_array(np.array(0.5, np.float32), "scale"),
        numpy_helper.from_array(np.array(3, np.int8), "zero"),  # (q - 3) is a permutation
    ]
    assert quantized_share(_model(nodes, weights)) == 0.0
    assert compute_type(_model(nodes, weights)) == ("float32", "")


def test_weights_moved_or_dequantised_are_still_seen_for_what_they_are():
    """Outsider's third pass: a float32 gain routed through Reshape hid from the float32-weight
    rule (float16 x + c - c then outvoted it); an int8 Hadamard and its transpose (each sums,
    together nothing) bought a wrong float32 model the int8 row."""
    from onnx import numpy_helper as nh

    shape = nh.from_array(np.array([4], np.int64), "shape")
    gain = nh.from_array(_dense(np.float32)[0], "g")
    c = nh.from_array(np.full(4, 0.5, np.float16), "c")
    nodes = [
        helper.make_node("Reshape", ["g", "shape"], ["g_moved"]),
        helper.make_node("Mul", ["x", "g_moved"], ["t"]),
    ]
    nodes += _narrow_tail(
        24, lambda k, a, b: helper.make_node(("Add", "Sub")[k % 2], [a, "c"], [b])
    )
    assert compute_type(_model(nodes, [gain, shape, c]))[0] == "float32"

    hadamard = np.array([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]], np.int8)
    nodes = [  # a step of another kind (x * 2) between the model and the chain
        helper.make_node("MatMul", ["x", "w"], ["u"]),
        helper.make_node("Mul", ["u", "two"], ["t"]),
    ]
    weights = [nh.from_array(_dense(np.float32), "w"), nh.from_array(np.float32(2), "two")]
    names = ["t", *(f"t{k}" for k in range(4))]
    for k, (a, b) in enumerate(pairwise(names)):  # H, H^T, H, H^T: more int8 than float
        nodes += [
            helper.make_node("DequantizeLinear", [f"h{k}", "s", "z"], [f"d{k}"]),
            helper.make_node("MatMul", [a, f"d{k}"], [b]),
        ]
        weights.append(nh.from_array(hadamard if k % 2 == 0 else hadamard.T.copy(), f"h{k}"))
    nodes.append(helper.make_node("Identity", [names[-1]], ["y"]))
    weights += [
        nh.from_array(np.array(0.5, np.float32), "s"),
        nh.from_array(np.array(0, np.int8), "z"),
    ]
    assert compute_type(_model(nodes, weights)) == ("float32", "")


def test_weights_computed_from_constants_and_decoys_multiplied_by_zero_are_seen_through():
    """Outsider's fourth pass: a float32 gain passed through Add(w, 0) (or Max, Clip, Where)
    hid from the float32-weight rule beside a float16 product of zeros (x - x); an int8 weight
    whose sum was multiplied by 0 and added to the output bought the int8 row."""
    from onnx import numpy_helper as nh

    gain, zero32 = nh.from_array(_dense(np.float32)[0], "g"), nh.from_array(np.float32(0), "z")
    dense16 = nh.from_array(_dense(np.float16, 1), "d")
    nodes = [
        helper.make_node("Add", ["g", "z"], ["g_hidden"]),
        helper.make_node("Mul", ["x", "g_hidden"], ["t"]),
        helper.make_node("Cast", ["x"], ["h"], to=F16),
        helper.make_node("Sub", ["h", "h"], ["h0"]),
        helper.make_node("MatMul", ["h0", "d"], ["p"]),
        helper.make_node("Cast", ["p"], ["p32"], to=F32),
        helper.make_node("Add", ["t", "p32"], ["y"]),
    ]
    assert compute_type(_model(nodes, [gain, zero32, dense16]))[0] == "float32"

    nodes = [
        helper.make_node("Mul", ["x", "g"], ["t"]),
        helper.make_node("DequantizeLinear", ["q", "s"], ["w"]),
        helper.make_node("ReduceSum", ["w"], ["r"], keepdims=0),
        helper.make_node("Mul", ["r", "z"], ["r0"]),
        helper.make_node("Add", ["t", "r0"], ["y"]),
    ]
    decoy = [
        nh.from_array(np.array([[1, 2], [3, -4]], np.int8), "q"),
        nh.from_array(np.float32(0.5), "s"),
    ]
    model = _model(nodes, [gain, zero32, *decoy])
    assert quantized_share(model) == 0.0 and compute_type(model)[0] == "float32"


def test_an_lstm_the_dynamic_quantiser_made_int8_earns_the_int8_row(tmp_path):
    """quantize_dynamic turns an LSTM into DynamicQuantizeLSTM with int8 weights: counted as
    float weights, they made a mostly quantised recurrent model a float32 one, which then
    failed the float32 row."""
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(0)
    weights = {
        "W": rng.standard_normal((1, 128, 16)).astype(np.float32),
        "R": rng.standard_normal((1, 128, 32)).astype(np.float32),
    }
    graph = helper.make_graph(
        [helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=32)],
        "g",
        [helper.make_tensor_value_info("x", F32, [5, 2, 16])],
        [helper.make_tensor_value_info("y", F32, None)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, tmp_path / "f.onnx")
    quantize_dynamic(tmp_path / "f.onnx", tmp_path / "q.onnx")
    quantized = onnx.load(tmp_path / "q.onnx")
    assert "DynamicQuantizeLSTM" in {n.op_type for n in quantized.graph.node}
    assert compute_type(quantized) == ("int8", "")
