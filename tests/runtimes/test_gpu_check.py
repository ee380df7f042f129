"""scripts/gpu_check.sh and scripts/gpu_matrix.py without a GPU: argument handling, wheel
reassembly, and the matrix driver run against a fake tconform that writes reports."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
GPU_CHECK = SCRIPTS / "gpu_check.sh"
WHEEL = "onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_27_x86_64.whl"


def _load_matrix():
    spec = importlib.util.spec_from_file_location("gpu_matrix", SCRIPTS / "gpu_matrix.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_matrix"] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


def _gpu_check(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHON": python}
    return subprocess.run(["bash", str(GPU_CHECK), *args], capture_output=True, text=True, env=env)


def test_gpu_check_without_arguments_prints_usage():
    done = _gpu_check()
    assert done.returncode == 2
    assert "usage:" in done.stderr


def test_gpu_check_empty_folder_names_the_missing_wheel(tmp_path):
    done = _gpu_check(str(tmp_path), str(tmp_path / "out"))
    assert done.returncode == 2
    assert "no onnxruntime_gpu-*cp312*.whl" in done.stderr


@pytest.mark.skipif(sys.version_info[:2] == (3, 12), reason="would go on to pip install")
def test_gpu_check_joins_parts_in_order(tmp_path):
    wheel = tmp_path / WHEEL
    with zipfile.ZipFile(wheel, "w") as archive:  # a stand-in wheel, large enough to split
        archive.writestr("onnxruntime/__init__.py", "x = 1\n" * 5000)
    data = wheel.read_bytes()
    parts_dir = tmp_path / "parts"
    parts_dir.mkdir()
    size = len(data) // 11 + 1
    for n in range(11):  # part10 must come after part9
        (parts_dir / f"{WHEEL}.part{n}").write_bytes(data[n * size : (n + 1) * size])
    # This Python is not 3.12, so the script stops after joining and checking the wheel.
    done = _gpu_check(str(parts_dir), str(tmp_path / "out"))
    joined = tmp_path / "out" / WHEEL
    assert joined.read_bytes() == data
    assert "joined 11 parts" in done.stdout
    assert done.returncode == 2
    assert "needs 3.12" in done.stderr  # the joined wheel passed the zip check


def test_gpu_check_rejects_incomplete_parts(tmp_path):
    parts_dir = tmp_path / "parts"
    parts_dir.mkdir()
    (parts_dir / f"{WHEEL}.part-aa").write_bytes(b"PK\x03\x04 truncated")
    done = _gpu_check(str(parts_dir), str(tmp_path / "out"))
    assert done.returncode == 2
    assert "not a valid wheel" in done.stderr


def test_plan_covers_fp32_tf32_fp16_and_the_gpu_bench(tmp_path):
    steps = _load_matrix().plan(tmp_path, "cpu,cuda", ["norm"], "golden", True, 1)
    by_name = {s.name: s.args for s in steps}
    assert list(by_name) == ["fp32", "tf32", "fp16-export", "fp16", "bench"]
    bench = by_name["bench"]
    assert bench[bench.index("--ep") + 1] == "cuda"  # the GPU only: the CPU has its own table
    assert bench.count("--shape") == 2 and "64x128" in bench
    cpu_only = _load_matrix().plan(tmp_path, "cpu", ["norm"], "golden", True, 1)
    assert "bench" not in [s.name for s in cpu_only]
    assert "--tf32" in by_name["tf32"] and "--tf32" not in by_name["fp32"]
    assert by_name["fp16-export"][:3] == ["export", "--dtype", "float16"]
    fp16_artifacts = by_name["fp16-export"][by_name["fp16-export"].index("--out") + 1]
    assert by_name["fp16"][by_name["fp16"].index("--artifacts") + 1] == fp16_artifacts
    for name in ("fp32", "tf32", "fp16"):
        args = by_name[name]
        assert args[args.index("--ep") + 1] == "cpu,cuda"
        assert args[args.index("--device-id") + 1] == "1"
        assert args[args.index("--json") + 1] == str(tmp_path / f"{name}.json")
        assert "--allow-missing-ep" in args


FAKE_TCONFORM = """
import json, sys
args = sys.argv[1:]
if args[0] == "export":
    sys.exit(0)
precision = "tf32" if "--tf32" in args else "float32"
results = [
    {"case": "norm", "runtime": "onnxruntime", "ep": "cpu", "precision": precision,
     "input_set": s, "status": "pass", "placement": {"cpu": 5}, "fallback_ops": {}}
    for s in ("a", "b")
] + [
    {"case": "norm", "runtime": "onnxruntime", "ep": "cuda", "precision": precision,
     "input_set": "*", "status": "skip", "placement": {"cuda": 4, "cpu": 1},
     "fallback_ops": {"Shape": 1}}
]
json.dump({"results": results}, open(args[args.index("--json") + 1], "w"))
sys.exit(1 if precision == "tf32" else 0)
"""


def test_matrix_driver_summarises_fake_runs(tmp_path):
    fake = tmp_path / "fake_tconform.py"
    fake.write_text(FAKE_TCONFORM)
    out = tmp_path / "run"
    code = _load_matrix().main(
        [
            *("--out", str(out), "--case", "norm", "--no-bench"),
            *("--tconform", f"{sys.executable} {fake}"),
        ]
    )
    assert code == 1  # the worst exit code (tf32's fake failure)
    summary = (out / "summary.md").read_text()
    assert "| fp32 | 0 | onnxruntime-cpu (float32) | pass 2 | cpu 5 |" in summary  # counted once
    assert "| tf32 | 1 | onnxruntime-cuda (tf32) | skip 1 | cpu 1, cuda 4 |" in summary
    assert "Ops left on the CPU in CUDA sessions: Shape" in summary
    assert json.loads((out / "environment.json").read_text())["python"]
    assert (out / "fp16-export.log").exists()
