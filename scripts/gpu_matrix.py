"""Run tconform's cross-provider matrix and summarise it: strict float32, TF32 and float16.

Usage (scripts/gpu_check.sh sets up onnxruntime-gpu first, then calls this):

    python scripts/gpu_matrix.py --out gpu-run [--eps cpu,cuda] [--case NAME ...]
        [--golden DIR] [--allow-missing-ep] [--device-id N] [--tconform "CMD ..."]

Each run is one `tconform` command line in its own process. By default that process calls
`onnxruntime.preload_dlls()` before tconform starts, so the CUDA and cuDNN libraries that pip
installed beside PyTorch (the nvidia-* packages) are found. The output folder receives one JSON,
JUnit and markdown report per run, the log of every command, environment.json, and summary.md.
Exit status: the worst exit code of the tconform commands (0 all passed, 1 a conformance failure,
2 a usage or environment error, 3 a provider could not run).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# The tconform CLI in a fresh interpreter, after ONNX Runtime has loaded the CUDA libraries.
# torch is imported first so that its own cuDNN is the one in the process: preload_dlls() alone
# can load an older cuDNN that torch then refuses (seen on an H100 with torch 2.11: "PyTorch was
# compiled against (9, 19, 0) but found runtime version (9, 14, 0)").
PRELOAD = "import torch, onnxruntime; onnxruntime.preload_dlls(); "
PRELOADED_TCONFORM = [
    sys.executable,
    "-c",
    "import sys; " + PRELOAD + "from tconform.cli import main; main(sys.argv[1:])",
]


@dataclass
class Step:
    """One tconform command of the matrix; `report` names its JSON report (None: no report)."""

    name: str
    args: list[str]
    report: str | None = None
    exit_code: int | None = None
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # runtime -> status -> n
    placement: dict[str, dict[str, int]] = field(default_factory=dict)  # runtime -> ep -> nodes
    fallback_ops: dict[str, int] = field(default_factory=dict)


def plan(
    out: Path,
    eps: str,
    cases: list[str],
    golden: str | None,
    allow_missing_ep: bool,
    device_id: int,
    with_bench: bool = True,
) -> list[Step]:
    """The matrix as tconform command lines: float32 strict, TF32, and a float16 export+verify."""
    common = ["--ep", eps, "--device-id", str(device_id)]
    for case in cases:
        common += ["--case", case]
    if golden:
        common += ["--golden", golden]
    if allow_missing_ep:
        common.append("--allow-missing-ep")

    def reports(name: str) -> list[str]:
        return [
            *("--json", str(out / f"{name}.json")),
            *("--junit", str(out / f"{name}.xml")),
            *("--markdown", str(out / f"{name}.md")),
        ]

    fp16_artifacts = str(out / "artifacts-fp16")
    gpu_eps = [ep for ep in eps.split(",") if ep.strip() not in ("", "cpu")]
    export_cases = [arg for case in cases for arg in ("--case", case)]
    return [
        Step("fp32", ["verify", *common, *reports("fp32")], "fp32.json"),
        Step("tf32", ["verify", *common, "--tf32", *reports("tf32")], "tf32.json"),
        Step(
            "fp16-export", ["export", "--dtype", "float16", "--out", fp16_artifacts, *export_cases]
        ),
        Step(
            "fp16",
            ["verify", *common, "--artifacts", fp16_artifacts, *reports("fp16")],
            "fp16.json",
        ),
        *(
            # Issue 14's latency table: ORT with and without IO binding against torch eager on
            # the GPU, at the base preset, with the GPU's own GEMM ceiling.
            [
                Step(
                    "bench",
                    [
                        *("bench", "--ep", ",".join(gpu_eps)),
                        *("--case", "transformer", "--shape", "1x32", "--shape", "64x128"),
                        *("--engine", "onnxruntime", "--engine", "torch", "--profile"),
                        *("--artifacts", str(out / "artifacts-bench")),
                        *("--json", str(out / "bench.json"), "--markdown", str(out / "bench.md")),
                    ],
                )
            ]
            if with_bench and gpu_eps
            else []
        ),
    ]


def read_report(step: Step, out: Path) -> None:
    """Status counts, node placement and CPU fallbacks per runtime from a step's JSON report."""
    if step.report is None or not (out / step.report).exists():
        return
    data = json.loads((out / step.report).read_text())
    counted: set[tuple[str, str]] = set()  # placement is per session: count each case once
    for result in data.get("results", []):
        runtime = f"{result.get('runtime')}-{result.get('ep')} ({result.get('precision')})"
        by_status = step.counts.setdefault(runtime, {})
        by_status[result["status"]] = by_status.get(result["status"], 0) + 1
        nodes = step.placement.setdefault(runtime, {})
        if (runtime, result["case"]) in counted:
            continue
        counted.add((runtime, result["case"]))
        for ep, count in (result.get("placement") or {}).items():
            nodes[ep] = nodes.get(ep, 0) + count
        for op, count in (result.get("fallback_ops") or {}).items():
            step.fallback_ops[op] = step.fallback_ops.get(op, 0) + count


def environment() -> dict[str, object]:
    """GPU, driver and CUDA from nvidia-smi; library versions from the packages themselves."""
    env: dict[str, object] = {"python": sys.version.split()[0]}
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        env["gpus"] = subprocess.run(
            query, capture_output=True, text=True, check=True
        ).stdout.strip()
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout
        env["cuda_driver_api"] = next(
            (
                ln.split("CUDA Version:")[1].strip(" |")
                for ln in header.splitlines()
                if "CUDA Version" in ln
            ),
            "unknown",
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        env["gpus"] = f"none found ({exc})"
    probe = (
        "import json; " + PRELOAD + "o = onnxruntime; "
        "from tconform.runtimes.providers import unavailable_reason as r; "
        "print(json.dumps({'onnxruntime': o.__version__, 'onnxruntime_file': o.__file__, "
        "'ort_providers': o.get_available_providers(), 'cuda_unavailable_reason': r('cuda'), "
        "'torch': torch.__version__, 'torch_cuda': torch.version.cuda, "
        "'torch_cudnn': torch.backends.cudnn.version()}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if done.returncode == 0 and done.stdout.strip():
        env.update(json.loads(done.stdout.strip().splitlines()[-1]))
    else:
        env["probe_error"] = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return env


def summary(env: dict[str, object], steps: list[Step]) -> str:
    lines = ["# tconform GPU matrix", "", "| item | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in env.items()]
    lines += [
        "",
        "| run | exit | runtime | statuses | nodes per provider |",
        "|---|---|---|---|---|",
    ]
    for step in steps:
        if not step.counts:
            lines.append(f"| {step.name} | {step.exit_code} | | | |")
        for runtime, by_status in sorted(step.counts.items()):
            statuses = ", ".join(f"{s} {n}" for s, n in sorted(by_status.items()))
            nodes = ", ".join(f"{ep} {n}" for ep, n in sorted(step.placement[runtime].items()))
            lines.append(f"| {step.name} | {step.exit_code} | {runtime} | {statuses} | {nodes} |")
    fallbacks = {op: n for step in steps for op, n in step.fallback_ops.items()}
    lines += [
        "",
        "Ops left on the CPU in CUDA sessions: " + (", ".join(sorted(fallbacks)) or "none"),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for reports and logs")
    parser.add_argument("--eps", default="cpu,cuda", help="providers to run (tconform --ep)")
    parser.add_argument("--case", action="append", default=[], help="limit to a case (repeat)")
    parser.add_argument("--golden", help="golden folder (tconform's default if omitted)")
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument("--allow-missing-ep", action="store_true")
    parser.add_argument("--no-bench", action="store_true", help="leave out the GPU bench step")
    parser.add_argument(
        "--tconform", help="command that runs tconform (default: preload CUDA DLLs, then tconform)"
    )
    options = parser.parse_args(argv)

    out: Path = options.out
    out.mkdir(parents=True, exist_ok=True)
    tconform = shlex.split(options.tconform) if options.tconform else PRELOADED_TCONFORM
    env = environment()
    (out / "environment.json").write_text(json.dumps(env, indent=2) + "\n")

    steps = plan(
        out,
        options.eps,
        options.case,
        options.golden,
        options.allow_missing_ep,
        options.device_id,
        with_bench=not options.no_bench,
    )
    for step in steps:
        print(f"== {step.name}: tconform {' '.join(step.args)}", flush=True)
        with open(out / f"{step.name}.log", "w") as log:
            step.exit_code = subprocess.run(
                [*tconform, *step.args], stdout=log, stderr=subprocess.STDOUT
            ).returncode
        read_report(step, out)
        print(f"   exit {step.exit_code}; log in {out / (step.name + '.log')}", flush=True)
    (out / "summary.md").write_text(summary(env, steps))
    print((out / "summary.md").read_text())
    return max(step.exit_code or 0 for step in steps)


if __name__ == "__main__":
    sys.exit(main())
