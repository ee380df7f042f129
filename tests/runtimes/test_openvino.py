"""The OpenVINO runtime: a case passes on its goldens at f32, the precision OpenVINO reads back is
the one reported, feeds are checked against the compiled signature, and a bad file or device is
one line of the right error."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

try:
    import openvino  # noqa: F401
except ImportError:
    pytest.skip(
        "openvino is not installed (pip install 'tconform[openvino]')", allow_module_level=True
    )

from tconform import golden, registry
from tconform.compare import compare_output, tolerance_for
from tconform.errors import ProviderUnavailable, UsageError
from tconform.execution import Subject, open_subject
from tconform.models import derived_file
from tconform.runtimes import label, make_runtime
from tconform.runtimes.openvino import OpenVinoRuntime, _compute_precision, reason

pytestmark = pytest.mark.integration

GOLDEN = Path(__file__).resolve().parents[2] / "golden"  # the committed tiny goldens
CASE = registry.get_case("norm")  # the quickest to export (the first export warms torch up)


@pytest.fixture(scope="module")
def case_model(built) -> Path:
    """The session's tiny export of CASE (read, never written)."""
    return built["artifacts"] / CASE.name / "model.onnx"


@pytest.fixture(scope="module")
def ids_model(tmp_path_factory) -> Path:
    """embedding(ids) * keep: int64 ids and a bool mask, as the whole model takes them."""
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"]),
        helper.make_node("Cast", ["keep"], ["keep_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["keep_f", "axis"], ["keep_3d"]),
        helper.make_node("Mul", ["rows", "keep_3d"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ids",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("keep", TensorProto.BOOL, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", 2])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array([2]), "axis")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    path = tmp_path_factory.mktemp("ids") / "model.onnx"
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def matmul_model(tmp_path_factory) -> Path:
    """x @ W: a MatMul ends the graph, so a bf16 CPU runs it in bf16 (OpenVINO keeps the
    nodes after the last MatMul in f32, and a model without one wholly in f32)."""
    weight = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    path = tmp_path_factory.mktemp("matmul") / "model.onnx"
    onnx.save(model, path)
    return path


def test_a_case_passes_at_f32_on_its_goldens(case_model):
    runtime = make_runtime("openvino")
    session = runtime.open(case_model)
    assert session.precision == runtime.precision == "float32"
    assert label(runtime) == "openvino"
    manifest = golden.read_golden_manifest(GOLDEN)
    sets = golden.read_case(GOLDEN, manifest, CASE, golden.manifest_config(manifest))
    tol = tolerance_for(session.precision, CASE.tolerance)
    for input_set in sets:  # three shapes through one compiled model: dynamic axes
        outputs = session.run(dict(input_set.inputs))
        assert list(outputs) == list(input_set.outputs) == session.outputs
        for name, gold in input_set.outputs.items():
            out = outputs[name]
            result = compare_output(name, out, gold, tol)
            assert result.status == "pass", (input_set.name, result.message)
            assert out.dtype == np.float32 and np.abs(out).max() > 0.1  # normalised values
    assert [(s.name, s.dtype, s.rank) for s in session.inputs] == [("x", np.float32, 3)]
    assert session.providers == ["CPU"]
    assert set(session.placement) == {"cpu"} and session.placement["cpu"] > 0
    assert session.node_precisions.get("float32", 0) > 0
    assert "bfloat16" not in session.node_precisions
    assert session.compile_seconds > 0


def test_int64_ids_and_bool_masks_run_and_wrong_feeds_are_refused(ids_model):
    subject = Subject(derived_file(ids_model))
    with open_subject(OpenVinoRuntime(), subject) as opened:
        ids = np.array([[0, 5, 3]], dtype=np.int64)
        keep = np.array([[True, True, False]])
        (out,) = opened.run({"ids": ids, "keep": keep}).values()
        table = np.arange(12, dtype=np.float32).reshape(6, 2)
        np.testing.assert_array_equal(out, table[ids] * keep[..., None])
        # OpenVINO itself converts int32 ids silently and reuses the last tensor of a missing
        # feed: the execution layer refuses both before OpenVINO sees them.
        with pytest.raises(UsageError, match="input 'ids' is int64; it is given int32"):
            opened.run({"ids": ids.astype(np.int32), "keep": keep})
        with pytest.raises(UsageError, match="takes inputs ids, keep; it is given ids"):
            opened.run({"ids": ids})
        with pytest.raises(UsageError, match="input 'keep' has rank 2; it is given rank 3"):
            opened.run({"ids": ids, "keep": keep[None]})


def test_the_precision_is_the_one_openvino_reads_back(matmul_model):
    runtime = OpenVinoRuntime(bf16=True)
    settings = runtime.settings()
    assert settings["inference_precision_asked"] == "bf16"
    read_back = settings["inference_precision_read_back"]
    assert read_back in ("bf16", "f32")
    assert settings["compiled_properties"]["INFERENCE_PRECISION_HINT"] == read_back
    assert settings["openvino"] and settings["num_streams"] and settings["inference_num_threads"]
    # OpenVINO's CPU plugin names BF16 among its capabilities where the CPU computes it natively
    # (AVX512-BF16, AMX); elsewhere it compiles a bf16 request to f32.
    native = "BF16" in settings["optimization_capabilities"]
    expected = "bfloat16" if native else "float32"
    assert read_back == ("bf16" if native else "f32")
    session = runtime.open(matmul_model)
    assert runtime.precision == session.precision == expected
    assert label(runtime) == ("openvino (bfloat16)" if native else "openvino")
    assert sum(session.node_precisions.values()) > 0  # the executed graph was read
    assert ("bfloat16" in session.node_precisions) == native  # what really ran
    x = np.ones((2, 8), np.float32)
    exact = x @ np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    (y,) = session.run({"x": x}).values()
    assert np.abs(y - exact).max() < (1e-2 if native else 1e-6)


def test_node_precision_reads_fused_nodes_by_their_kernel():
    fc = {"runtimePrecision": "bf16", "outputPrecisions": "bf16", "primitiveType": "brgemm_bf16"}
    attention = {  # a fused attention block reports its mask's u8 as runtime precision
        "runtimePrecision": "u8",
        "outputPrecisions": "f32",
        "primitiveType": "jit_avx512_amx_bf16",
    }
    plain = {"runtimePrecision": "u8", "outputPrecisions": "f32", "primitiveType": "jit_avx2_f32"}
    mask = {"runtimePrecision": "u8", "outputPrecisions": "u8", "primitiveType": "jit_avx2_I8"}
    assert _compute_precision(fc) == "bfloat16"
    assert _compute_precision(attention) == "bfloat16"
    assert _compute_precision(plain) == "float32"
    assert _compute_precision(mask) is None


def test_a_corrupt_or_missing_file_is_one_usage_error_line(tmp_path):
    corrupt = tmp_path / "model.onnx"
    corrupt.write_bytes(b"this is not an ONNX model")
    for path in (corrupt, tmp_path / "missing.onnx"):
        with pytest.raises(UsageError) as caught:
            OpenVinoRuntime().open(path)
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"{path}: OpenVINO cannot read it: ")
        assert "Exception from" not in message and "Check '" not in message


def test_a_sound_model_openvino_cannot_convert_is_its_failure_with_the_cause(tmp_path):
    """A well-formed model OpenVINO reads but cannot convert is RuntimeRejected (an error row
    of OpenVINO; the other runtimes go on), in one line that keeps the cause below the
    heading: the op it has no rule for."""
    from tconform.errors import RuntimeRejected

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    node = helper.make_node("Foo", ["x"], ["y"], domain="com.example")
    imports = [helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)]
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=imports)
    model.ir_version = 10
    onnx.checker.check_model(model)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    with pytest.raises(RuntimeRejected) as caught:
        OpenVinoRuntime().open(path)
    assert str(caught.value) == (
        "OpenVINO cannot convert or compile it: Model wasn't fully converted. "
        "No conversion rule found for operations: com.example.Foo"
    )


def test_a_translation_error_says_its_node_and_cause_in_one_line():
    """OpenVINO 2024.0's error on tconform's mha_causal export: the cause is five lines below
    the heading, past C++ checks and shape dumps."""
    message = (
        "Check 'error_message.empty()' failed at src/frontends/onnx/frontend/src/frontend.cpp:122:"
        "\nFrontEnd API failed with GeneralFailure:\nErrors during ONNX translation: \n"
        "While validating ONNX node '<Node(Transpose): node_transpose_2>':\n"
        "Check 'input_order_shape[0].compatible(...)' failed at src/core/transpose.hpp:70:\n"
        "While validating node 'opset1::Transpose Transpose_36 (...)' with friendly_name 'T':\n"
        "Shape inference input shapes {[?,?,?,?,16,4,4],[4]}\n"
        "Input order must have shape [n], where n is the rank of arg.\n"
    )
    assert reason(RuntimeError(message)) == (
        "Errors during ONNX translation: While validating ONNX node "
        "'<Node(Transpose): node_transpose_2>': Input order must have shape [n], where n is "
        "the rank of arg."
    )


def test_an_unknown_device_is_unavailable_with_openvinos_reason(ids_model):
    runtime = OpenVinoRuntime(ep="nosuchdevice")
    with pytest.raises(ProviderUnavailable) as caught:
        runtime.open(ids_model)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("nosuchdevice: ")
    assert "NOSUCHDEVICE" in message and "not registered" in message
    assert runtime.precision == "float32"  # nothing ran: the precision asked for
    assert runtime.settings()["unavailable"] == message


def test_without_openvino_a_session_is_unavailable(ids_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino raises ImportError
    runtime = OpenVinoRuntime(threads=1)  # a configuration not probed yet in this process
    with pytest.raises(ProviderUnavailable, match=r"pip install 'tconform\[openvino\]'"):
        runtime.open(ids_model)


def test_a_pin_the_release_does_not_know_is_left_out_not_a_failure(monkeypatch):
    """OpenVINO 2023 has no DYNAMIC_QUANTIZATION_GROUP_SIZE: tconform's pin of it (to turn it
    off) is left out of the compile there, so the release runs rather than being reported as
    an unavailable provider; everything else, what a user gives included, is passed as given."""
    from tconform.runtimes import openvino

    class OldCore:
        def get_property(self, device, key):
            assert (device, key) == ("CPU", "SUPPORTED_PROPERTIES")
            return ["INFERENCE_PRECISION_HINT", "PERFORMANCE_HINT", "CPU_DENORMALS_OPTIMIZATION"]

    monkeypatch.setattr(openvino, "_core", OldCore)
    config = OpenVinoRuntime(properties={"NUM_STREAMS": "1"}).config()
    assert "DYNAMIC_QUANTIZATION_GROUP_SIZE" in config
    kept = openvino._known("CPU", config)
    assert kept == {k: v for k, v in config.items() if k != "DYNAMIC_QUANTIZATION_GROUP_SIZE"}
    assert kept["NUM_STREAMS"] == "1"


def test_a_pin_the_user_gives_is_passed_even_where_the_release_does_not_know_it(monkeypatch):
    """A user who sets a pinned key themselves asked for it: it reaches the compile (where the
    release refuses it, loudly) rather than being dropped as tconform's own pin would be."""
    from tconform.runtimes import openvino

    class OldCore:
        def get_property(self, device, key):
            return ["INFERENCE_PRECISION_HINT", "PERFORMANCE_HINT"]

    monkeypatch.setattr(openvino, "_core", OldCore)
    runtime = OpenVinoRuntime(properties={"DYNAMIC_QUANTIZATION_GROUP_SIZE": "32"})
    kept = openvino._known("CPU", runtime.config(), runtime.properties)
    assert kept["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "32"
    assert "CPU_DENORMALS_OPTIMIZATION" not in kept  # tconform's own pin, unknown there
