"""Whether the bench's ONNX Runtime session settings change what the model computes.

    python scripts/settings_outputs.py BENCH.json [--json OUT.json]

For every CPU "best" entry of the bench report it runs the same model file on the same inputs
with ONNX Runtime's own defaults (subnormals kept, every fusion of the level), with each of the
bench's two settings alone (subnormals flushed: session.set_denormal_as_zero; Add +
LayerNormalization unfused: SkipLayerNormFusion disabled) and with both, and prints each
output's largest absolute difference from the defaults, and whether it is bit-identical
(docs/performance.md, "Threads and session settings"). --runs is not used.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from bench_report import best_cpu_rows, read_bench_report

from tconform import registry
from tconform.config import get_preset
from tconform.execution import Subject, open_subject
from tconform.models import given_file
from tconform.runtimes.onnxruntime import DENORMAL_AS_ZERO, SKIP_LAYER_NORM_FUSION, OrtRuntime

SETTINGS = {
    "subnormals flushed": ({DENORMAL_AS_ZERO: "1"}, ()),
    "Add + LayerNormalization unfused": ({DENORMAL_AS_ZERO: "0"}, (SKIP_LAYER_NORM_FUSION,)),
    "both (the bench's defaults)": ({DENORMAL_AS_ZERO: "1"}, (SKIP_LAYER_NORM_FUSION,)),
}


def run_once(runtime: OrtRuntime, model: str, feeds: dict) -> list[np.ndarray]:
    with open_subject(runtime, Subject(given_file(Path(model)))) as opened:
        return list(opened.run(feeds).values())


def main() -> None:
    args, report = read_bench_report(__doc__.splitlines()[0], runs=0)
    settings = report["settings"]
    cfg, threads = get_preset(settings["preset"]), settings["intra_op_threads"]
    rows = []
    for best, row in best_cpu_rows(report):
        case, model = registry.get_case(best["case"]), row["details"]["model"]
        shape = registry.Shape(best["batch"], best["seq"], best["seq"])
        feeds = registry.make_inputs(case, cfg, shape, np.random.default_rng(0))  # as bench
        # ONNX Runtime's default, named so that this thread is reset too (match_calling_thread).
        kept = OrtRuntime(threads=threads, session_config={DENORMAL_AS_ZERO: "0"})
        defaults = run_once(kept, model, feeds)
        what = f"{best['case']} {best['batch']}x{best['seq']} {best['best_engine']}"
        for name, (config, disabled) in SETTINGS.items():
            runtime = OrtRuntime(
                threads=threads, session_config=config, disabled_optimizers=disabled
            )
            changed_outputs = run_once(runtime, model, feeds)
            for index, (base, changed) in enumerate(zip(defaults, changed_outputs, strict=True)):
                diff = float(np.abs(changed.astype(np.float64) - base).max())
                same = bool(np.array_equal(changed.view(np.uint8), base.view(np.uint8)))
                print(
                    f"{what}: {name:34s} output {index}: max |diff| {diff:.3g} "
                    f"(max |value| {float(np.abs(base).max()):.3g}); bit-identical: {same}"
                )
                rows.append(
                    {"case": best["case"], "batch": best["batch"], "seq": best["seq"],
                     "model": model, "setting": name, "output": index,
                     "max_abs_diff": diff, "bit_identical": same}
                )  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"bench": str(args.bench), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
