"""The ceilings per precision: each probe runs the kernels of the engines of its precision, a
precision's ceiling is its fastest probe, a probe that cannot run here says why, and a row's
share is of its own precision's ceiling (a note where it has none or exceeds it)."""

from __future__ import annotations

import pytest

from tconform.bench import ceiling
from tconform.bench.ceiling import measure_ceiling, remeasure_ceiling, share_of_ceiling
from tconform.bench.run import bench_settings
from tconform.runtimes.openvino import OpenVinoRuntime

pytestmark = pytest.mark.unit


@pytest.fixture
def small(monkeypatch, tmp_path):
    monkeypatch.setattr(ceiling, "GEMM_SIZE", 64)
    monkeypatch.setattr(ceiling, "COPY_BYTES", 2**20)
    monkeypatch.setattr(ceiling, "PROBE_RUNS", 3)
    settings = bench_settings(
        "tiny", ("feed_forward",), (), ("onnxruntime",), "cpu", 1, {}, 0, 1, 0.1, tmp_path
    )
    return settings.runtime


def test_every_precision_has_its_probes_and_the_fastest_is_its_ceiling(small, monkeypatch):
    # as on a CPU without AVX512-BF16 or AMX, whatever this one has
    monkeypatch.setattr(OpenVinoRuntime, "precision", property(lambda self: "float32"))
    block = measure_ceiling(small, "cpu", ("int8", "int4", "bfloat16"))
    precisions = block["precisions"]
    assert set(precisions) == {"float32", "int8", "int4", "bfloat16"}
    assert set(precisions["float32"]["probes"]) == {"onnxruntime", "torch"}
    assert set(precisions["int8"]["probes"]) == {"onnxruntime", "torch"}
    assert set(precisions["int4"]["probes"]) == {"onnxruntime"}
    assert set(precisions["bfloat16"]["probes"]) == {"torch"}
    assert "not bfloat16" in precisions["bfloat16"]["unavailable"]["openvino"]
    for entry in precisions.values():
        assert entry["gflops"] == max(p["gflops"] for p in entry["probes"].values()) > 0
    assert block["gemm_gflops"] == precisions["float32"]["gflops"]
    assert block["copy_bandwidth_gbs"] > 0

    rows = [{"ep": "cpu", "gflops": 1e9, "precision": "int8", "peak_fraction": 1e9}]
    remeasure_ceiling(small, "cpu", block, rows)  # the higher of the two of each probe
    for entry in block["precisions"].values():
        for probe in entry["probes"].values():
            assert probe["gflops"] == max(probe["gflops_runs"]) and len(probe["gflops_runs"]) == 2
    assert (
        rows[0]["peak_fraction"] > 1 and "above the int8 ceiling" in rows[0]["peak_fraction_note"]
    )


def test_a_rows_share_is_of_its_own_precisions_ceiling():
    block = {
        "gemm_gflops": 100.0,
        "precisions": {
            "float32": {"gflops": 100.0, "probes": {}, "unavailable": {}},
            "int8": {"gflops": 200.0, "probes": {}, "unavailable": {}},
            "bfloat16": {"gflops": None, "probes": {}, "unavailable": {"openvino": "no AMX"}},
        },
    }
    assert share_of_ceiling(150.0, "int8", block) == (0.75, "")
    share, note = share_of_ceiling(150.0, "float32", block)
    assert share == 1.5 and "above the float32 ceiling" in note
    assert share_of_ceiling(10.0, "bfloat16", block) == (
        None, "no bfloat16 ceiling measured (openvino: no AMX)",
    )  # fmt: skip
    assert share_of_ceiling(10.0, "int4", block)[0] is None
    # a block without precisions (an older report): float32's is gemm_gflops
    assert share_of_ceiling(50.0, "float32", {"gemm_gflops": 100.0}) == (0.5, "")


def test_a_gpu_probe_times_a_larger_product_than_a_cpu_probe(monkeypatch):
    """A 2048^3 product is over in ~0.06 ms on a GPU, too short to fill it (docs/cuda.md)."""
    sizes = {}

    def gemm(runtime, size, dtype):
        sizes[runtime] = size
        return 1.0

    monkeypatch.setattr(ceiling, "onnx_gemm_gflops", gemm)
    probe = next(p for p in ceiling.PROBES if p.runtime == "onnxruntime" and "cuda" in p.eps)
    for ep in ("cpu", "cuda"):
        assert probe.measure(lambda name, ep: ep, ep) == (1.0, sizes[ep])
    assert sizes == {"cpu": ceiling.GEMM_SIZE, "cuda": ceiling.GEMM_SIZE_ON_DEVICE}
    assert ceiling.GEMM_SIZE_ON_DEVICE > ceiling.GEMM_SIZE


def test_a_devices_copy_bandwidth_is_none_where_it_cannot_be_measured(monkeypatch):
    """A GPU row's floor is at its own memory's bandwidth; where torch sees no such device, or
    the copy cannot be made (no such device id, out of its memory), the rows go without a
    floor and the run goes on."""
    assert ceiling.device_copy_bandwidth_gbs("cpu") is None  # the host's is copy_bandwidth_gbs
    freed = []

    class Device:  # a torch backend whose device is there but refuses the copy
        is_available = staticmethod(lambda: True)
        empty_cache = staticmethod(lambda: freed.append(1))

    def refuse(backend, device):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(ceiling.torch, "cuda", Device, raising=False)
    monkeypatch.setattr(ceiling, "_copy_rate", refuse)
    assert ceiling.device_copy_bandwidth_gbs("cuda", 7) is None and freed == [1]
    monkeypatch.setattr(ceiling, "_copy_rate", lambda backend, device: 4150.0)
    assert ceiling.device_copy_bandwidth_gbs("cuda") == 4150.0
