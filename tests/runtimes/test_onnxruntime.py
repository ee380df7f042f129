"""The ONNX Runtime layer: provider availability with ORT's reason, placement, options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tconform import registry
from tconform.compare import BFLOAT16
from tconform.config import PRESETS
from tconform.errors import KernelMissing, ProviderUnavailable, TconformError, UsageError
from tconform.export import example_shape
from tconform.runtimes import label
from tconform.runtimes import onnxruntime as onnxruntime_runtime
from tconform.runtimes.onnxruntime import OrtRuntime
from tconform.runtimes.providers import parse_provider_options, reason_from_log, unavailable_reason

pytestmark = pytest.mark.integration

CUDA_MISSING = unavailable_reason("cuda")


def needs_cuda(test):
    """A test that needs a usable CUDA provider: marked `gpu` (`pytest -m gpu` selects it),
    skipped elsewhere with ONNX Runtime's reason."""
    skip = pytest.mark.skipif(CUDA_MISSING is not None, reason=f"CUDA EP: {CUDA_MISSING}")
    return pytest.mark.gpu(skip(test))


TINY = PRESETS["tiny"]
FIRST_CASES = registry.CASES[:3]


@pytest.fixture(scope="module")
def artifacts(built) -> Path:
    """The session's tiny exports (read, never written)."""
    return built["artifacts"]


def _feeds(case: registry.Case) -> dict[str, np.ndarray]:
    arrays = registry.make_inputs(case, TINY, example_shape(TINY), np.random.default_rng(1))
    return {
        spec.name: arrays[spec.name].astype(np.float32)
        if spec.kind == "float"
        else arrays[spec.name]
        for spec in case.inputs(TINY)
    }


def _optimised_node_count(model: Path, tmp_path: Path) -> int:
    """Nodes of the graph ONNX Runtime partitions between providers, saved by ORT itself.

    ORT records the assignment when it partitions the graph: after the basic (level 1)
    rewrites, before the provider-specific fusions of the extended and all levels."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    return len(onnx.load(str(tmp_path / "optimised.onnx")).graph.node)


# --- availability -----------------------------------------------------------------------------


def test_cpu_is_available_and_has_no_reason():
    assert unavailable_reason("cpu") is None


@pytest.mark.skipif(CUDA_MISSING is None, reason="the CUDA provider really runs here")
def test_cuda_unavailable_reason_is_onnxruntimes_own():
    assert CUDA_MISSING  # e.g. "libcublasLt.so.13: cannot open shared object file: ..."
    assert "\n" not in CUDA_MISSING
    assert "\x1b" not in CUDA_MISSING  # ORT's terminal colours are stripped


@pytest.mark.skipif(CUDA_MISSING is None, reason="the CUDA provider really runs here")
def test_requesting_cuda_here_raises_with_reason_and_never_returns_a_session(artifacts):
    model = artifacts / FIRST_CASES[0].name / "model.onnx"
    with pytest.raises(ProviderUnavailable) as raised:
        OrtRuntime(ep="cuda").open(model)
    message = str(raised.value)
    assert message.startswith("cuda: ")
    assert CUDA_MISSING in message
    assert raised.value.exit_code == 3


@pytest.mark.skipif(CUDA_MISSING is None, reason="the CUDA provider really runs here")
def test_silent_cpu_fallback_is_refused_with_the_logged_reason(artifacts, monkeypatch):
    # Pretend the probe passed (as for another device_id), so the session itself falls back.
    monkeypatch.setattr(onnxruntime_runtime, "unavailable_reason", lambda ep: None)
    with pytest.raises(ProviderUnavailable) as raised:
        OrtRuntime(ep="cuda").open(artifacts / FIRST_CASES[0].name / "model.onnx")
    assert CUDA_MISSING in str(raised.value)  # read from this session's own log
    assert "ran the session on CPUExecutionProvider only" in str(raised.value)


def test_reason_from_log_extracts_missing_library():
    log = (
        "\x1b[1;31m2026-01-01 00:00:00 [E:onnxruntime:Default, provider_bridge_ort.cc:2458 "
        "operator()] ... [ONNXRuntimeError] : 1 : FAIL : Failed to load library "
        "/x/libonnxruntime_providers_cuda.so with error: libcudnn.so.9: cannot open shared "
        "object file: No such file or directory\n\x1b[m"
    )
    assert reason_from_log(log) == (
        "libcudnn.so.9: cannot open shared object file: No such file or directory"
    )


def test_reason_from_log_extracts_missing_device():
    log = (
        "2026-01-01 [E:onnxruntime:Default, cuda_call.cc:123 CudaCall] CUDA failure 100: "
        "no CUDA-capable device is detected ; GPU=0 ; hostname=x ; file=y ; line=1"
    )
    assert reason_from_log(log) == "CUDA failure 100: no CUDA-capable device is detected"


def test_reason_from_log_empty_is_none():
    assert reason_from_log("") is None


# --- placement --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", FIRST_CASES, ids=lambda c: c.name)
def test_cpu_placement_counts_every_optimised_node(case, artifacts, tmp_path):
    model = artifacts / case.name / "model.onnx"
    session = OrtRuntime(ep="cpu").open(model)
    assert session.providers == ["CPUExecutionProvider"]
    assert session.placement == {"cpu": _optimised_node_count(model, tmp_path)}
    assert session.placement["cpu"] > 0
    assert session.fallback_ops == {}
    outputs = session.run(_feeds(case))
    assert list(outputs) == session.outputs == [spec.name for spec in case.outputs(TINY)]
    assert [o.shape[0] for o in outputs.values()] == [example_shape(TINY).batch] * len(outputs)


def test_corrupt_model_is_one_line_usage_error(tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a protobuf")
    with pytest.raises(UsageError) as raised:
        OrtRuntime().open(bad)
    assert str(bad) in str(raised.value)
    assert "\n" not in str(raised.value)


def test_missing_kernel_becomes_kernel_missing(tmp_path):
    # ORT 1.31's CPU provider has no bfloat16 Sqrt kernel (and inserts no Cast for bfloat16).
    x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])
    y = helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2])
    graph = helper.make_graph([helper.make_node("Sqrt", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    with pytest.raises(KernelMissing) as raised:
        OrtRuntime().open(path)
    assert str(raised.value) == "ONNX Runtime's CPU provider has no bfloat16 kernel for Sqrt"
    assert isinstance(raised.value, TconformError)
    assert raised.value.op_type == "Sqrt"


@pytest.mark.parametrize(
    ("node", "opset", "says"),
    [
        (("Relu", ""), 99, "ONNX Runtime only *guarantees* support"),  # an opset it lacks
        (("Foo", "com.example"), 1, "com.example:Foo(-1) is not a registered function/op"),
    ],
)
def test_a_sound_model_the_release_rejects_is_its_failure_not_a_usage_error(
    tmp_path, node, opset, says
):
    """A model onnx's checker accepts that ONNX Runtime will not load is that runtime's
    failure on it (RuntimeRejected: an error row, the other runtimes go on), never a usage
    error that ends the run; its one line leaves out the C++ source location."""
    from tconform.errors import RuntimeRejected

    op_type, domain = node
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [helper.make_node(op_type, ["x"], ["y"], domain=domain)]
    graph = helper.make_graph(nodes, "g", [x], [y])
    imports = [helper.make_opsetid("", 18 if domain else opset)]
    imports += [helper.make_opsetid(domain, opset)] if domain else []
    model = helper.make_model(graph, opset_imports=imports, ir_version=10)
    onnx.checker.check_model(model)  # well-formed ONNX
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    with pytest.raises(RuntimeRejected) as raised:
        OrtRuntime().open(path)
    message = str(raised.value)
    assert says in message and "\n" not in message and "onnxruntime_src" not in message
    assert not isinstance(raised.value, TconformError)


def test_bfloat16_outputs_of_integer_inputs_come_back_as_bfloat16(tmp_path):
    """A bfloat16 model fed only integers (an embedding's ids): session.run cannot hand NumPy
    its bfloat16 outputs ("No corresponding Numpy type", seen on CUDA), so they come back as
    ml_dtypes bfloat16 arrays of the same bits."""
    table = np.arange(12, dtype=np.float32).reshape(4, 3).astype(BFLOAT16)
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [None])
    rows = helper.make_tensor_value_info("rows", TensorProto.BFLOAT16, [None, 3])
    node = helper.make_node("Gather", ["table", "ids"], ["rows"])
    initializer = onnx.numpy_helper.from_array(table, "table")
    graph = helper.make_graph([node], "g", [ids], [rows], [initializer])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.save(model, str(tmp_path / "model.onnx"))
    (out,) = OrtRuntime().open(tmp_path / "model.onnx").run({"ids": np.array([2, 0])}).values()
    assert out.dtype == BFLOAT16
    np.testing.assert_array_equal(out, table[[2, 0]])


# --- settings, precision and provider options ------------------------------------------------


def test_cuda_is_strict_float32_by_default():
    runtime = OrtRuntime(ep="cuda")
    assert runtime.precision == "float32"
    options = runtime.settings()["provider_options"]
    assert options["use_tf32"] == "0"
    assert options["device_id"] == "0"
    assert options["cudnn_conv_algo_search"] == "EXHAUSTIVE"


def test_tf32_flag_sets_option_and_precision():
    runtime = OrtRuntime(ep="cuda", tf32=True, device_id=1)
    assert runtime.precision == "tf32"
    assert runtime.settings()["provider_options"]["use_tf32"] == "1"
    assert runtime.settings()["provider_options"]["device_id"] == "1"
    assert runtime.name == "onnxruntime" and label(runtime) == "ort-cuda (tf32)"


def test_raw_options_win_and_are_recorded():
    runtime = OrtRuntime(
        ep="cuda", provider_options={"use_tf32": "1", "cudnn_conv_algo_search": "HEURISTIC"}
    )
    settings = runtime.settings()
    assert settings["provider_options"]["cudnn_conv_algo_search"] == "HEURISTIC"
    assert settings["precision"] == "tf32"
    assert settings["provider"] == "CUDAExecutionProvider"


def test_cpu_never_reports_tf32():
    runtime = OrtRuntime(ep="cpu", tf32=True)
    assert runtime.precision == "float32"
    assert "use_tf32" not in runtime.settings()["provider_options"]


def test_a_provider_named_twice_is_asked_for_once():
    from tconform.runtimes.providers import parse_eps

    assert parse_eps("cpu, CPU,cuda,cpu") == ["cpu", "cuda"]


def test_parse_provider_options():
    parsed = parse_provider_options(["use_tf32=0", " device_id = 1 ", "a=b=c", "use_tf32=1"])
    assert parsed == {"use_tf32": "1", "device_id": "1", "a": "b=c"}


@pytest.mark.parametrize("bad", ["use_tf32", "=1", "key=", "two words=1"])
def test_parse_provider_options_rejects_malformed(bad):
    with pytest.raises(UsageError) as raised:
        parse_provider_options([bad])
    assert repr(bad) in str(raised.value)
    assert "\n" not in str(raised.value)


# --- GPU only ---------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("tf32", [False, True])
def test_cuda_session_places_nodes_on_cuda(artifacts, tf32):
    case = FIRST_CASES[-1]
    session = OrtRuntime(ep="cuda", tf32=tf32).open(artifacts / case.name / "model.onnx")
    assert session.providers[0] == "CUDAExecutionProvider"
    assert session.placement.get("cuda", 0) > 0
    reference = OrtRuntime(ep="cpu").open(artifacts / case.name / "model.onnx")
    feeds = _feeds(case)
    want = reference.run(feeds)
    for name, got in session.run(feeds).items():
        np.testing.assert_allclose(got, want[name], atol=5e-3 if tf32 else 1e-5, rtol=1e-3)


def test_a_kernel_error_is_raised_without_onnx_runtimes_own_log(tmp_path, capfd):
    """A runtime error comes back as the exception (verify reports it in one line); ONNX
    Runtime's C++ logger writes nothing of it to stderr."""
    from onnx import helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    shape = helper.make_tensor("s", TensorProto.INT64, [2], [3, 5])
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "g", [x], [y],
                              [shape])  # fmt: skip
    path = tmp_path / "reshape.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9),
              str(path))  # fmt: skip
    session = OrtRuntime("cpu").open(path)
    capfd.readouterr()
    with pytest.raises(Exception, match="cannot be reshaped"):
        session.run({"x": np.zeros(7, np.float32)})
    assert capfd.readouterr().err == ""


def _add_then_layer_norm(tmp_path: Path) -> Path:
    """Y = LayerNormalization(X + skip), which ONNX Runtime fuses to SkipLayerNormalization."""
    shape = [1, 4, 8]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "skip"], ["sum"]),
            helper.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["y"], axis=-1),
        ],
        "add_layer_norm",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("skip", TensorProto.FLOAT, shape),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [
            onnx.numpy_helper.from_array(np.ones(8, np.float32), "gamma"),
            onnx.numpy_helper.from_array(np.zeros(8, np.float32), "beta"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = tmp_path / "add_layer_norm.onnx"
    onnx.save(model, str(path))
    return path


@dataclass
class SavingOrtRuntime(OrtRuntime):
    """OrtRuntime that has ONNX Runtime save the graph it optimised (its fusions included)."""

    saved: str = "optimised.onnx"

    def session_options(self, profile_prefix: str | None = None) -> ort.SessionOptions:
        options = super().session_options(profile_prefix)
        options.optimized_model_filepath = self.saved
        return options


@pytest.mark.parametrize(
    "disabled, expected_ops",
    [((), {"SkipLayerNormalization"}), (("SkipLayerNormFusion",), {"Add", "LayerNormalization"})],
)
def test_disabled_optimizers_reach_the_session_and_the_settings(disabled, expected_ops, tmp_path):
    runtime = SavingOrtRuntime(disabled_optimizers=disabled, saved=str(tmp_path / "saved.onnx"))
    runtime.open(_add_then_layer_norm(tmp_path))
    assert {n.op_type for n in onnx.load(runtime.saved).graph.node} == expected_ops
    assert runtime.settings()["disabled_optimizers"] == list(disabled)


def _square(tmp_path: Path) -> Path:
    """Y = A * A on one float: 1e-20 squared is the subnormal 1e-40, or zero when flushed."""
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Mul", ["a", "a"], ["y"])],
        "square",
        [value("a", TensorProto.FLOAT, [1])],
        [value("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = tmp_path / "square.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("first, then", [("0", "1"), ("1", "0")])
def test_every_session_sets_the_calling_thread_as_its_config_asks(
    first, then, tmp_path, thread_flushes_subnormals
):
    # ONNX Runtime itself sets the calling thread for the first session of a process only.
    path = _square(tmp_path)
    OrtRuntime(session_config={onnxruntime_runtime.DENORMAL_AS_ZERO: first}).open(path)
    session = OrtRuntime(session_config={onnxruntime_runtime.DENORMAL_AS_ZERO: then}).open(path)
    assert thread_flushes_subnormals() == (then == "1")
    (squared,) = session.run({"a": np.array([1e-20], np.float32)}).values()
    assert (int(squared.view(np.uint32)[0]) == 0) == (then == "1")


def test_a_session_without_the_key_leaves_the_thread_as_it_was(tmp_path, thread_flushes_subnormals):
    import torch

    torch.set_flush_denormal(True)
    OrtRuntime().open(_square(tmp_path))
    assert thread_flushes_subnormals()


def test_a_provider_option_the_provider_does_not_take_is_refused_when_the_runtime_is_made(
    tmp_path,
):
    """ONNX Runtime drops an option its provider does not know without a word; a report that
    recorded it would claim a setting that never applied. It is refused as the runtime is made,
    before any command exports or runs a thing."""
    with pytest.raises(UsageError, match="--provider-option foo: CPUExecutionProvider does not"):
        OrtRuntime(provider_options={"foo": "bar"})
    OrtRuntime().open(_square(tmp_path))  # none given: nothing to refuse
