"""The bench's engine registry: every graph variant (the int8 graph and OpenVINO's bf16 among
them) and the torch-int8 module runtime are engines, each export a variant runs is exported once
into a folder of its own, a reduced precision the CPU cannot compute is reported as not
available, never timed as if it ran, and neither is a shape the model's export fixed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tconform import registry
from tconform.bench.engines import (
    GRAPH_VARIANTS,
    EngineUnavailable,
    engine_names,
    engine_openers,
    open_engine,
    parse_engines,
)
from tconform.bench.measure import measure
from tconform.bench.run import bench_settings
from tconform.bench.workload import case_workload
from tconform.config import PRESETS
from tconform.execution import FixedDimension, Subject
from tconform.export import example_shape
from tconform.models import derived_file
from tconform.results import Status
from tconform.runtimes import RUNTIMES, make_runtime
from tconform.runtimes.openvino import OpenVinoRuntime

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]
CEILING = {"gemm_gflops": 100.0, "copy_bandwidth_gbs": 10.0}
TIMING = {"warmup": 0, "runs": 2, "seconds": 0.0}


def test_the_int8_and_bf16_variants_and_torch_int8_are_engines():
    names = engine_names()
    assert {"onnxruntime-int8", "openvino-bf16", "torch-int8"} <= set(names)
    assert GRAPH_VARIANTS["onnxruntime-int8"].export == ("plain", "int8")
    assert GRAPH_VARIANTS["onnxruntime-fp16"].export == ("plain", "float16")
    assert GRAPH_VARIANTS["onnxruntime-bf16"].export == ("plain", "bfloat16")
    assert GRAPH_VARIANTS["openvino-bf16"].runtime == "openvino"
    assert "torch-int8" in RUNTIMES and make_runtime("torch-int8").precision == "int8"
    # canonical order whatever the order asked in
    asked = ("torch-int8", "onnxruntime-int8", "onnxruntime")
    assert parse_engines(asked) == tuple(n for n in names if n in asked)


def test_each_export_a_variant_runs_gets_its_own_folder(tmp_path):
    settings = bench_settings(
        "tiny", ("feed_forward",), (),
        ("onnxruntime-int8", "onnxruntime-sdpa-int8", "openvino", "torch-int8"), "cpu",
        1, {}, 0, 1, 0.1, tmp_path / "tiny",
    )  # fmt: skip
    # openvino runs the plain float32 export; torch-int8 runs the module, no export
    assert settings.exports == (("plain", "int8"), ("sdpa", "int8"), ("plain", "float32"))
    folders = {settings.artifacts_for(e) for e in settings.exports}
    assert folders == {tmp_path / "tiny-int8", tmp_path / "tiny-sdpa-int8", tmp_path / "tiny"}


def test_bf16_without_native_kernels_is_reported_unavailable_not_timed(monkeypatch):
    """OpenVINO compiles float32 where a bf16 request meets a CPU without AVX512-BF16 or AMX;
    the variant must then say so, and neither compile nor time the model."""
    monkeypatch.setattr(OpenVinoRuntime, "precision", property(lambda self: "float32"))

    def must_not_open(self, model_path: Path):
        raise AssertionError("a variant whose precision is not available was opened")

    monkeypatch.setattr(OpenVinoRuntime, "open", must_not_open)
    case = registry.get_case("feed_forward")
    shape = example_shape(TINY)
    workload = case_workload(case, TINY, {}, shape.batch, shape.src_seq, {})
    ((engine, ep, opener),) = engine_openers(("openvino-bf16",), ("cpu",), workload, make_runtime)
    row = measure(workload, engine, ep, opener, CEILING, TIMING)
    assert row["status"] == Status.SKIP
    assert row["reason"].startswith("not available") and "bfloat16" in row["reason"]
    assert "p50_ms" not in row and "runs" not in row


def test_a_runtime_reading_back_the_asked_precision_is_opened(monkeypatch):
    """The check that refuses bf16 on an AVX2 CPU lets it through where OpenVINO reads bf16
    back (the open is what fails here, so the check passed)."""
    monkeypatch.setattr(OpenVinoRuntime, "precision", property(lambda self: "bfloat16"))
    opened = []
    monkeypatch.setattr(OpenVinoRuntime, "open", lambda self, path: opened.append(path) or 1 / 0)
    runtime = make_runtime("openvino", "cpu", bf16=True)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        open_engine(runtime, Subject(_Model()), {}, precision="bfloat16")
    assert opened == [Path("model.onnx")]
    with pytest.raises(EngineUnavailable):
        open_engine(make_runtime("torch"), Subject(), {}, precision="int8")


class _Model:
    path = Path("model.onnx")
    precision = "float32"
    provenance = SimpleNamespace(sha256="0" * 64, origin="given")  # what a row names


def test_a_dimension_the_model_fixes_is_named_and_not_timed(tmp_path):
    """A model exported at one shape (a user's model at its example's) and timed at another:
    the row says which dimension the export fixed, and nothing is timed."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    path = tmp_path / "fixed.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path
    )
    feeds = {"x": np.zeros((1, 4), np.float32)}
    with pytest.raises(FixedDimension, match="fixes input 'x' axis 0 at 2"):
        open_engine(make_runtime("onnxruntime"), Subject(derived_file(path)), feeds)
