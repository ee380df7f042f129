"""What running a runtime in a worker process costs (docs/versions.md, "Overhead"): the same
installed ONNX Runtime in tconform's process (`onnxruntime`) and in a worker of the same
interpreter (`onnxruntime@<this python>`), measured in turns so that load on the machine falls
on both alike.

    python scripts/worker_overhead.py --preset tiny --shape 2x8 --out OUT.json
    python scripts/worker_overhead.py --preset base --shape 1x32 --out OUT.json

Per runtime: the first start (for the worker: the interpreter starting and importing ONNX
Runtime, numpy and onnx), each session open (median), and each run (median over --runs) of the
case's model on inputs of the shape, through the same `session.run` the execution layer calls
(tensors cross the pipe both ways); and bench's timed loop (TimedCall.times: inside the worker,
no pipe), whose median should match the in-process one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from tconform import registry
from tconform.config import get_preset
from tconform.export import ExportSettings, export_cases
from tconform.registry import Shape
from tconform.runtimes import make_runtime
from tconform.runtimes.remote import stop_workers


def _median_ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1e3, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--case", default="transformer")
    parser.add_argument("--shape", default="1x32", help="BATCHxSEQ")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--opens", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cfg = get_preset(args.preset)
    case = registry.get_case(args.case)
    batch, seq = (int(n) for n in args.shape.split("x"))
    (record,) = export_cases([case], ExportSettings(cfg), Path("artifacts/bench") / args.preset)
    model = Path(record.location)
    feeds = registry.make_inputs(case, cfg, Shape(batch, seq, seq), np.random.default_rng(0))
    specs = {"in process": "onnxruntime", "in a worker": f"onnxruntime@{sys.executable}"}
    found: dict[str, dict[str, object]] = {}
    for where, spec in specs.items():
        started = time.perf_counter()
        runtime = make_runtime(spec, "cpu", threads=args.threads)
        first = runtime.open(model)  # a worker starts here (the interpreter and its imports)
        found[where] = {"first start and open s": round(time.perf_counter() - started, 3)}
        first.close()
        opens = []
        for _ in range(args.opens):
            t0 = time.perf_counter()
            runtime.open(model).close()
            opens.append(time.perf_counter() - t0)
        found[where]["open ms"] = _median_ms(opens)
        found[where]["session"] = runtime.open(model)
    runs: dict[str, list[float]] = {where: [] for where in specs}
    for _ in range(args.runs):  # in turns: the machine's load falls on both alike
        for where in specs:
            session = found[where]["session"]
            t0 = time.perf_counter()
            session.run(feeds)
            runs[where].append(time.perf_counter() - t0)
    for where in specs:
        session = found[where].pop("session")
        found[where]["run ms"] = _median_ms(runs[where])
        call = session.timed_call(feeds)
        loop = call.times(2, args.runs, None) if call.times else None
        if loop is None:
            from tconform.runtimes.timing import timed_runs

            loop = timed_runs(call.run, 2, args.runs)
        found[where]["bench loop ms"] = _median_ms(loop)
        call.close()
        session.close()
    stop_workers()
    outputs = sum(np.asarray(v).nbytes for v in feeds.values())
    report = {
        "preset": args.preset,
        "case": args.case,
        "shape": args.shape,
        "threads": args.threads,
        "input_bytes": int(outputs),
        "runs": args.runs,
        "measured": found,
        "run overhead ms": round(found["in a worker"]["run ms"] - found["in process"]["run ms"], 4),
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
