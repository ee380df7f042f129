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


def test_plan_covers_every_precision_sdpa_generation_check_tests_and_the_benches(tmp_path):
    matrix = _load_matrix()
    steps = matrix.plan(tmp_path, "cpu,cuda", ["norm"], "golden", True, 1)
    by_name = {s.name: s for s in steps}
    verifies = ["fp32", "tf32", "reduced", "sdpa", "generation"]
    checks = [f"check-{m}" for m in matrix.ZOO]
    assert list(by_name) == [*verifies, *checks, "worker", "pytest-gpu", "bench", "bench-generate"]
    assert f"onnxruntime@{sys.executable}" in by_name["worker"].args  # a runtime out of process
    args = {name: step.args for name, step in by_name.items()}
    assert by_name["tf32"].chain == by_name["fp32"].chain  # TF32 reuses the float32 exports
    assert "--tf32" in args["tf32"] and "--tf32" not in args["fp32"]
    assert args["reduced"][args["reduced"].index("--dtype") + 1] == "float16,bfloat16,int8"
    assert args["sdpa"][args["sdpa"].index("--attention") + 1] == "sdpa"
    assert "--generation" in args["generation"] and "--case" not in args["generation"]
    assert args["fp32"][args["fp32"].index("--case") + 1] == "norm"
    for name in verifies:
        assert args[name][args[name].index("--ep") + 1] == "cpu,cuda"
        assert args[name][args[name].index("--device-id") + 1] == "1"
        assert args[name][args[name].index("--json") + 1] == str(tmp_path / f"{name}.json")
        assert "--allow-missing-ep" in args[name]
    assert args["check-bert"][:2] == ["check", "tests.zoo.models:bert"]
    assert by_name["pytest-gpu"].program and "gpu" in args["pytest-gpu"]
    for name in ("bench", "bench-generate"):  # timed: alone, after every other chain
        assert by_name[name].chain == matrix.TIMED
        assert args[name][args[name].index("--ep") + 1] == "cuda"  # the CPU has its own table
    assert args["bench"].count("--shape") == 3 and "64x128" in args["bench"]
    assert "onnxruntime-fp16" in args["bench"] and "--profile" in args["bench"]
    short = matrix.BenchPlan(("1x32",), ("onnxruntime-fp16", "torch"), 0.5, 16, only=True)
    rerun = {
        s.name: s.args for s in matrix.plan(tmp_path, "cpu,cuda", [], None, False, 0, bench=short)
    }
    assert list(rerun) == ["bench", "bench-generate"] and "--profile" not in rerun["bench"]
    assert rerun["bench"].count("--shape") == 1 and "0.5" in rerun["bench"]
    engines = [a for i, a in enumerate(rerun["bench"]) if rerun["bench"][i - 1] == "--engine"]
    assert engines == ["onnxruntime-fp16", "torch"]
    assert rerun["bench-generate"][rerun["bench-generate"].index("--generate") + 1] == "16"
    cpu_only = [s.name for s in matrix.plan(tmp_path, "cpu", ["norm"], "golden", True, 1)]
    assert cpu_only == verifies  # no GPU: no check, gpu tests or bench steps


def _elf_with_fatbin(entries: list[tuple[int, bytes]]) -> bytearray:
    """A minimal ELF64 file whose only named section is `.nv_fatbin`, holding one fat binary
    with an entry (architecture, payload) per item, laid out as the CUDA toolchain writes it."""
    import struct

    fatbin = b""
    for arch, payload in entries:
        header = bytearray(64)
        struct.pack_into("<HHIQ", header, 0, 2, 0, 64, len(payload))
        struct.pack_into("<I", header, 28, arch)
        fatbin += bytes(header) + payload
    fatbin = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(fatbin)) + fatbin
    names = b"\0.shstrtab\0.nv_fatbin\0"
    data = bytearray(64) + names + fatbin
    shoff = len(data)
    sections = [
        (0, 0, 0, 0, 0, 0),
        (1, 3, 0, 0, 64, len(names)),  # .shstrtab
        (11, 1, 0, 0, 64 + len(names), len(fatbin)),  # .nv_fatbin
    ]
    for name, kind, flags, addr, offset, size in sections:
        data += struct.pack("<IIQQQQ", name, kind, flags, addr, offset, size) + bytes(24)
    struct.pack_into("<Q", data, 0x28, shoff)
    struct.pack_into("<HHH", data, 0x3A, 64, len(sections), 1)
    return data


def test_pack_zeroes_other_architectures_and_keeps_every_header():
    spec = importlib.util.spec_from_file_location("pack_ort_gpu", SCRIPTS / "pack_ort_gpu.py")
    pack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pack)
    sm80, sm90 = b"\x11" * 40, b"\x22" * 24
    data = _elf_with_fatbin([(80, sm80), (90, sm90), (120, sm80)])
    before = bytes(data)
    assert pack.zero_other_architectures(data, 90) == 2 * len(sm80)
    assert len(data) == len(before)
    assert data.count(sm90) == 1 and sm80 not in data  # only sm_90's payload is left
    changed = [i for i in range(len(data)) if data[i] != before[i]]
    assert all(before[i] == 0x11 for i in changed)  # headers, names and sm_90 untouched


def test_gpu_check_unpacks_packed_parts(tmp_path):
    import io
    import lzma
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        content = b"x = 1\n"
        info = tarfile.TarInfo("onnxruntime/__init__.py")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    packed = lzma.compress(buffer.getvalue(), format=lzma.FORMAT_XZ)
    parts_dir = tmp_path / "parts"
    parts_dir.mkdir()
    name = "onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.sm90.tar.xz"
    half = len(packed) // 2
    (parts_dir / f"{name}.part-ab").write_bytes(packed[half:])
    (parts_dir / f"{name}.part-aa").write_bytes(packed[:half])
    done = _gpu_check(str(parts_dir), str(tmp_path / "out"))
    assert (tmp_path / "out" / "site" / "onnxruntime" / "__init__.py").read_bytes() == content
    assert "unpacked 2 part(s)" in done.stdout
    if sys.version_info[:2] != (3, 12):
        assert done.returncode == 2 and "needs 3.12" in done.stderr


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
            *("--out", str(out), "--case", "norm", "--eps", "cpu,cuda", "--no-bench", "--no-tests"),
            *("--tconform", f"{sys.executable} {fake}"),
        ]
    )
    assert code == 1  # the worst exit code (tf32's fake failure)
    summary = (out / "summary.md").read_text()
    assert "| fp32 | 0 | onnxruntime-cpu (float32) | pass 2 | cpu 5 |" in summary  # counted once
    assert "| tf32 | 1 | onnxruntime-cuda (tf32) | skip 1 | cpu 1, cuda 4 |" in summary
    assert "Ops left on the CPU in CUDA sessions: Shape" in summary
    assert json.loads((out / "environment.json").read_text())["python"]
    assert (out / "reduced.log").exists() and (out / "check-bert.log").exists()


SLOW_TCONFORM = """
import signal, sys, time
def stop(*_):
    print("terminated, reports written")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
time.sleep(60)
"""


def test_a_sigterm_is_passed_on_and_the_summary_still_written(tmp_path):
    """The GPU lease's time limit ends the matrix with SIGTERM: every running step gets it (so
    tconform writes its reports), no step starts after it, and summary.md is written."""
    import os
    import signal
    import time

    fake = tmp_path / "slow_tconform.py"
    fake.write_text(SLOW_TCONFORM)
    out = tmp_path / "run"
    matrix = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "gpu_matrix.py"), "--out", str(out), "--eps", "cpu",
         "--tconform", f"{sys.executable} {fake}"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (out / "fp32.log").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # the steps' interpreters are up and waiting
    os.kill(matrix.pid, signal.SIGTERM)
    stdout, _ = matrix.communicate(timeout=30)
    assert matrix.returncode == 143, stdout
    assert (out / "summary.md").exists()
    assert "terminated, reports written" in (out / "fp32.log").read_text()
    assert not (out / "tf32.log").exists()  # tf32 follows fp32 in its chain: never started


def test_only_the_named_steps_run_and_a_limit_stops_one_that_outruns_it(tmp_path, capsys):
    """A short lease runs a few steps (--only), each within its own seconds (--limit): past
    them the step gets SIGTERM, writes its reports, and the matrix goes on to its summary."""
    import time

    fake = tmp_path / "slow_tconform.py"
    fake.write_text(SLOW_TCONFORM)
    out = tmp_path / "run"
    args = ["--out", str(out), "--eps", "cpu", "--tconform", f"{sys.executable} {fake}"]
    started = time.monotonic()
    code = _load_matrix().main([*args, "--only", "fp32", "--limit", "fp32=1"])
    assert code == 143 and time.monotonic() - started < 30  # not the fake's 60 s
    assert "terminated, reports written" in (out / "fp32.log").read_text()
    assert not (out / "tf32.log").exists() and not (out / "sdpa.log").exists()
    assert "| fp32 | 143 |" in (out / "summary.md").read_text()
    refused = {
        "no step named bench": ["--only", "bench"],  # no GPU: no bench step
        "expected STEP=SECONDS": ["--limit", "fp32=soon"],
        "a positive number": ["--limit", "fp32=-5"],
        "tf32 is not a step of this run": ["--only", "fp32", "--limit", "tf32=5"],
    }
    for message, extra in refused.items():
        with pytest.raises(SystemExit) as stopped:  # checked before anything runs
            _load_matrix().main([*args, *extra])
        assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_a_step_ended_by_a_signal_counts_as_the_shell_says_and_its_group_goes_too(tmp_path):
    """pytest has no SIGTERM handler: a step so ended returns -15, which must not read as a
    pass; and its own children (xdist's workers) end with it."""
    import os
    import time

    matrix = _load_matrix()
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    while not pid_file.exists() or not pid_file.read_text():
        time.sleep(0.1)
    assert matrix._wait(process, limit_s=0.5) == 128 + 15
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the step's child outlived it")
