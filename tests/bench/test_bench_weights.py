"""Each row's memory floor comes from the weight bytes of what the engine really runs: the
initializers of its own ONNX file (one byte per int8 weight), the tensors of its own module (a
quantised Linear's packed int8 weight), with a gathered table read one row per token."""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tconform import registry
from tconform.bench.ceiling import memory_floor_ms
from tconform.bench.engines import open_engine
from tconform.bench.measure import measure
from tconform.bench.weights import module_weight_bytes, onnx_weight_bytes
from tconform.bench.workload import case_workload
from tconform.config import PRESETS
from tconform.execution import Subject
from tconform.export import ExportJob, ExportSettings, build_module, example_shape, export_jobs
from tconform.models import model_from_record
from tconform.runtimes import make_runtime

TINY = PRESETS["tiny"]
CEILING = {"gemm_gflops": 100.0, "copy_bandwidth_gbs": 10.0}
TIMING = {"warmup": 0, "runs": 2, "seconds": 0.0}


def _graph(tmp_path, weight: np.ndarray, table: np.ndarray):
    """ids -> Gather(table) -> MatMul(weight): a table gathered from and a weight read whole."""
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"]),
        helper.make_node("Cast", ["weight"], ["weight_f"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["rows", "weight_f"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", weight.shape[1]])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(weight, "weight")],
    )  # fmt: skip
    path = tmp_path / f"{weight.dtype}.onnx"
    onnx.save(helper.make_model(graph), path)
    return path


@pytest.mark.unit
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_an_onnx_files_bytes_are_its_initializers_and_the_gathered_rows(tmp_path, dtype):
    weight = np.ones((6, 5), dtype)
    table = np.zeros((40, 6), np.float32)
    path = _graph(tmp_path, weight, table)
    row_bytes = table.nbytes // table.shape[0]
    assert onnx_weight_bytes(path, tokens=3) == weight.nbytes + 3 * row_bytes
    # never more rows than the table has
    assert onnx_weight_bytes(path, tokens=1000) == weight.nbytes + table.nbytes
    # a runtime that holds the float32 weights in bfloat16 reads half their bytes
    held = weight.nbytes // (2 if dtype == np.float32 else 1) + 3 * row_bytes // 2
    assert onnx_weight_bytes(path, tokens=3, float_itemsize=2) == held


@pytest.mark.unit
def test_a_quantised_modules_bytes_are_its_int8_weights():
    linear = torch.nn.Sequential(torch.nn.Linear(64, 32))
    quantised = torch.ao.quantization.quantize_dynamic(linear, {torch.nn.Linear}, torch.qint8)
    float_bytes = module_weight_bytes(linear, tokens=1)
    assert float_bytes == sum(p.numel() * 4 for p in linear.parameters())
    weight, bias = 64 * 32, 32
    # the int8 weight (one byte each) and the float32 bias, and the few bytes of the module's
    # scalar scale and zero point
    assert module_weight_bytes(quantised, tokens=1) == pytest.approx(weight + 4 * bias, abs=16)


@pytest.mark.integration
def test_an_int8_runs_floor_is_its_own_weight_bytes(tmp_path):
    """The int8 graph's row counts its own file's bytes (about a quarter of the float32
    graph's), not the config's float32 parameters."""
    case = registry.get_case("feed_forward")
    jobs = [
        ExportJob(case, ExportSettings(TINY, dtype=dtype), tmp_path / dtype)
        for dtype in ("float32", "int8")
    ]
    records = export_jobs(jobs)
    shape = example_shape(TINY)
    _, params = build_module(case, ExportSettings(TINY))
    workload = case_workload(case, TINY, params, 1, shape.src_seq, {})
    rows = {}
    for job, record in zip(jobs, records, strict=True):
        model = model_from_record(case, record)
        runtime = make_runtime("onnxruntime")
        opener = partial(open_engine, runtime, Subject(model), workload.feeds)
        engine = f"onnxruntime-{job.settings.dtype}"
        rows[job.settings.dtype] = measure(workload, engine, "cpu", opener, CEILING, TIMING)
        assert rows[job.settings.dtype]["weight_bytes"] == onnx_weight_bytes(
            record.location, shape.src_seq
        )
    int8, float32 = rows["int8"], rows["float32"]
    assert int8["weight_bytes_from"] == "engine"
    assert int8["memory_floor_ms"] == memory_floor_ms(int8["weight_bytes"], CEILING)
    assert int8["weight_bytes"] < 0.5 * float32["weight_bytes"]
