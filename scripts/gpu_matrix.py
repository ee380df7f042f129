"""Run tconform's GPU matrix and summarise it: every case in strict float32, TF32 and the reduced
precisions, the sdpa graphs, the document checks, generation with the cache on the device,
`tconform check` on zoo models, the `gpu`-marked tests, then the benches.

Usage (scripts/gpu_check.sh sets up onnxruntime-gpu first, then calls this):

    python scripts/gpu_matrix.py --out gpu-run [--eps cpu,cuda] [--case NAME ...]
        [--golden DIR] [--allow-missing-ep] [--device-id N] [--no-bench] [--no-tests]
        [--bench-only] [--bench-shape BxS ...] [--bench-engine NAME ...] [--bench-seconds S]
        [--generate-tokens N] [--only STEP ...] [--limit STEP=SECONDS ...] [--timed-first]
        [--tconform "CMD ..."]

Each step is one command in its own process. By default a tconform process calls
`onnxruntime.preload_dlls()` before tconform starts, so the CUDA and cuDNN libraries that pip
installed beside PyTorch (the nvidia-* packages) are found. The steps of one chain run in order;
the chains run side by side (a GPU machine has the cores, and none of them is timed); the bench
steps, which are timed, run alone: last, or first with --timed-first (on a short lease the timed
targets come before the rest). `--only` keeps the named steps; `--limit STEP=SECONDS` ends a step
that outruns its seconds as the lease's limit would (SIGTERM: it writes its reports). The output
folder receives one JSON report per step
(JUnit and markdown for verify), the log of every step, environment.json, and summary.md.
Exit status: the worst exit code of the steps (0 all passed, 1 a conformance failure, 2 a usage
or environment error, 3 a provider could not run).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
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
# pytest likewise: the gpu-marked tests open CUDA sessions in its processes (torch imported
# first there too, by the tests' own imports, under xdist).
PRELOADED_PYTEST = [
    sys.executable,
    "-c",
    "import sys; " + PRELOAD + "import pytest; sys.exit(pytest.main(sys.argv[1:]))",
]
# The gpu-marked tests side by side where pytest-xdist is installed (their fixtures export and
# check a model each; one after another they outlast a short lease).
PYTEST_WORKERS = ["-n", "4"] if importlib.util.find_spec("xdist") else []
# Zoo models (tests/zoo/models.py) that `tconform check` runs on the GPU: an encoder with
# keyword inputs, two decoders, a vision transformer and a CNN (cuDNN's convolutions).
ZOO = ("bert", "gpt2", "llama", "vit", "resnet")
# The reduced precisions of the verify matrix (strict float32 and TF32 have steps of their own).
REDUCED = "float16,bfloat16,int8"
BENCH_SHAPES = ("1x32", "8x128", "64x128")
# The bench's engines: ONNX Runtime's plain, sdpa and float16 graphs (each with an IO-binding
# row beside it on the GPU) against torch eager on the GPU.
BENCH_ENGINES = ("onnxruntime", "onnxruntime-sdpa", "onnxruntime-fp16", "torch")
TIMED = "timed"  # the chain of the benches: run alone, before or after every other chain
STOP_GRACE_S = 15  # after a step's limit: seconds between SIGTERM (reports written) and SIGKILL


@dataclass
class Step:
    """One command of the matrix. `args` are tconform's arguments, or the whole command where
    `program` says so; `report` names its JSON report (None: no report); the steps of one
    `chain` run in order, after the steps before them in it."""

    name: str
    args: list[str]
    report: str | None = None
    chain: str = ""
    program: bool = False  # `args` is a command of its own, not tconform's arguments
    limit_s: float | None = None  # ended (SIGTERM) after this many seconds
    exit_code: int | None = None
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # runtime -> status -> n
    placement: dict[str, dict[str, int]] = field(default_factory=dict)  # runtime -> ep -> nodes
    fallback_ops: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchPlan:
    """What the bench steps time: the shapes and seconds per row of the forward bench, and the
    tokens of the generation bench. `only`: the benches alone (a re-run on a short lease)."""

    shapes: tuple[str, ...] = BENCH_SHAPES
    engines: tuple[str, ...] = BENCH_ENGINES
    seconds: float = 1.0
    tokens: int = 64
    only: bool = False


FULL_BENCH = BenchPlan()


def plan(
    out: Path,
    eps: str,
    cases: list[str],
    golden: str | None,
    allow_missing_ep: bool,
    device_id: int,
    with_bench: bool = True,
    with_tests: bool = True,
    bench: BenchPlan = FULL_BENCH,
) -> list[Step]:
    """The matrix as command lines, in chains (see Step); the benches last."""
    common = ["--ep", eps, "--device-id", str(device_id)]
    if allow_missing_ep:
        common.append("--allow-missing-ep")
    components = [arg for case in cases for arg in ("--case", case)]  # the component goldens'
    if golden:
        components += ["--golden", golden]

    def reports(name: str, formats: tuple[str, ...] = ("json", "junit", "markdown")) -> list[str]:
        suffix = {"json": "json", "junit": "xml", "markdown": "md"}
        return [arg for f in formats for arg in (f"--{f}", str(out / f"{name}.{suffix[f]}"))]

    def verify(name: str, *args: str) -> Step:
        selected = [] if "--generation" in args else components
        return Step(
            name, ["verify", *common, *selected, *args, *reports(name)], f"{name}.json", name
        )

    gpu_eps = [ep for ep in eps.split(",") if ep.strip() not in ("", "cpu")]
    steps = [
        verify("fp32"),
        verify("tf32", "--tf32"),
        verify("reduced", "--matrix", "--dtype", REDUCED, "--no-doc",
               "--artifacts", str(out / "artifacts-reduced")),
        verify("sdpa", "--attention", "sdpa", "--no-doc",
               "--artifacts", str(out / "artifacts-sdpa")),
        verify("generation", "--generation"),
    ]  # fmt: skip
    steps[1].chain = "fp32"  # TF32 reuses the float32 exports
    if gpu_eps:
        steps += [
            Step(
                f"check-{model}",
                [
                    *("check", f"tests.zoo.models:{model}", "--ep", eps, "--no-torch"),
                    *("--out", str(out / f"check-{model}"), *reports(f"check-{model}", ("json",))),
                ],
                f"check-{model}.json",
                "check",
            )
            for model in ZOO
        ]
    if gpu_eps:
        # A runtime out of process (`--runtime NAME@PYTHON`, docs/versions.md): its worker
        # imports no torch, so it loads the CUDA libraries itself (providers.load_device_libraries).
        steps.append(verify("worker", "--runtime", f"onnxruntime@{sys.executable}", "--no-doc"))
    if with_tests and gpu_eps:
        steps.append(
            Step(
                "pytest-gpu",
                [*PRELOADED_PYTEST, "-q", *PYTEST_WORKERS, "-m", "gpu", "tests"],
                chain="pytest",
                program=True,
            )
        )
    if bench.only:
        steps = []
    if with_bench and gpu_eps:
        # Issue 14 and 32's latency tables (BENCH_ENGINES) at the base preset, with the GPU's own
        # GEMM ceilings; then decoding per token with the cache on the device.
        timed = [*("bench", "--ep", ",".join(gpu_eps), "--case", "transformer")]
        for shape in bench.shapes:
            timed += ["--shape", shape]
        for engine in bench.engines:
            timed += ["--engine", engine]
        timed += ["--seconds", f"{bench.seconds:g}", "--artifacts", str(out / "artifacts-bench")]
        if not bench.only:
            timed.append("--profile")
        steps.append(Step("bench", [*timed, *reports("bench", ("json", "markdown"))], chain=TIMED))
        generate = ["bench", "--generate", str(bench.tokens), "--ep", ",".join(gpu_eps)]
        generate += ["--artifacts", str(out / "artifacts-generate")]
        steps.append(
            Step(
                "bench-generate",
                [*generate, *reports("bench-generate", ("json", "markdown"))],
                chain=TIMED,
            )
        )
    return steps


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


# The steps running now: a SIGTERM (the GPU lease's time limit) is passed on to them, so that
# each writes its reports as tconform does when terminated, and the summary still gets written.
RUNNING: set[subprocess.Popen] = set()
STOPPED = threading.Event()


def run_chain(steps: list[Step], tconform: list[str], out: Path) -> None:
    """Run `steps` in order, each with its log in `out`; read each one's report. After a
    SIGTERM no further step starts."""
    for step in steps:
        if STOPPED.is_set():
            return
        command = step.args if step.program else [*tconform, *step.args]
        print(f"== {step.name}: {shlex.join(command)}", flush=True)
        with open(out / f"{step.name}.log", "w") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            RUNNING.add(process)
            step.exit_code = _wait(process, step.limit_s)
            RUNNING.discard(process)
        read_report(step, out)
        print(f"   {step.name}: exit {step.exit_code}", flush=True)


def _signal(process: subprocess.Popen, signum: int) -> None:
    """To the step's whole process group: pytest's xdist workers, tconform's export workers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def _wait(process: subprocess.Popen, limit_s: float | None) -> int:
    """The step's exit code (128 + N for one ended by signal N, as a shell says); past
    `limit_s`, SIGTERM (its reports are written), then SIGKILL."""
    try:
        code = process.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        print(f"   limit of {limit_s:g} s reached: stopped", flush=True)
        _signal(process, signal.SIGTERM)
        try:
            code = process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal(process, signal.SIGKILL)
            code = process.wait()
    return 128 - code if code < 0 else code


def step_limits(items: list[str], parser: argparse.ArgumentParser) -> dict[str, float]:
    """--limit STEP=SECONDS items as a dict; a malformed one is a usage error (exit 2)."""
    limits = {}
    for item in items:
        name, _, text = item.partition("=")
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if not name or not 0 < seconds < math.inf:
            parser.error(f"--limit {item!r}: expected STEP=SECONDS, SECONDS a positive number")
        limits[name] = seconds
    return limits


def pass_on_signal(signum, frame) -> None:
    STOPPED.set()
    for process in list(RUNNING):
        _signal(process, signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for reports and logs")
    parser.add_argument("--eps", default="cpu,cuda", help="providers to run (tconform --ep)")
    parser.add_argument("--case", action="append", default=[], help="limit to a case (repeat)")
    parser.add_argument("--golden", help="golden folder (tconform's default if omitted)")
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument("--allow-missing-ep", action="store_true")
    parser.add_argument("--no-bench", action="store_true", help="leave out the GPU bench steps")
    parser.add_argument("--no-tests", action="store_true", help="leave out the gpu-marked tests")
    parser.add_argument("--bench-only", action="store_true", help="the bench steps alone")
    parser.add_argument(
        "--bench-shape", action="append", help=f"bench shape (repeat) [{', '.join(BENCH_SHAPES)}]"
    )
    parser.add_argument(
        "--bench-engine", action="append", help=f"engine (repeat) [{', '.join(BENCH_ENGINES)}]"
    )
    parser.add_argument("--bench-seconds", type=float, default=1.0, help="seconds per row [1]")
    parser.add_argument("--generate-tokens", type=int, default=64, help="tokens decoded [64]")
    parser.add_argument("--only", action="append", help="run only this step (repeat)")
    parser.add_argument(
        "--limit", action="append", default=[], help="STEP=SECONDS: stop a step after (repeat)"
    )
    parser.add_argument(
        "--timed-first", action="store_true", help="the bench steps before the others"
    )
    parser.add_argument(
        "--tconform", help="command that runs tconform (default: preload CUDA DLLs, then tconform)"
    )
    options = parser.parse_args(argv)

    out: Path = options.out
    tconform = shlex.split(options.tconform) if options.tconform else PRELOADED_TCONFORM
    steps = plan(
        out,
        options.eps,
        options.case,
        options.golden,
        options.allow_missing_ep,
        options.device_id,
        with_bench=not options.no_bench,
        with_tests=not options.no_tests,
        bench=BenchPlan(
            tuple(options.bench_shape or BENCH_SHAPES),
            tuple(options.bench_engine or BENCH_ENGINES),
            options.bench_seconds,
            options.generate_tokens,
            options.bench_only,
        ),
    )
    known = [step.name for step in steps]
    only = options.only or known
    if unknown := [name for name in only if name not in known]:
        parser.error(f"--only: no step named {', '.join(unknown)} (steps: {', '.join(known)})")
    steps = [step for step in steps if step.name in only]
    limits = step_limits(options.limit, parser)
    if outside := [name for name in limits if name not in only]:
        parser.error(f"--limit: {', '.join(outside)} is not a step of this run ({', '.join(only)})")
    for step in steps:
        step.limit_s = limits.get(step.name)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    (out / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
    # Each step leads a process group of its own (so a limit reaches all of it): the lease's
    # SIGTERM and a Ctrl-C are passed on to every running one.
    signal.signal(signal.SIGTERM, pass_on_signal)
    signal.signal(signal.SIGINT, pass_on_signal)
    chains: dict[str, list[Step]] = defaultdict(list)
    for step in steps:
        chains[step.chain].append(step)
    timed = chains.pop(TIMED, [])
    if options.timed_first:
        run_chain(timed, tconform, out)
    with ThreadPoolExecutor(max_workers=len(chains) or 1) as pool:
        list(pool.map(lambda chain: run_chain(chain, tconform, out), chains.values()))
    if not options.timed_first:
        run_chain(timed, tconform, out)
    (out / "summary.md").write_text(summary(env, steps))
    print((out / "summary.md").read_text())
    return max(step.exit_code or 0 for step in steps)


if __name__ == "__main__":
    sys.exit(main())
