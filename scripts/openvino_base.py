"""OpenVINO float32 against ONNX Runtime on the whole model at the base preset
(docs/versions.md, "OpenVINO float32 at the base preset").

    python scripts/openvino_base.py --out results/versions/openvino-base.json
    python scripts/openvino_base.py --runtime openvino==2024.6.0 --runtime onnxruntime ...

1. What OpenVINO computed in: the compiled model's INFERENCE_PRECISION_HINT read back, and every
   executed node's runtime precision (compiled.get_runtime_model(), rt_info "runtimePrecision",
   by layer type), for each runtime given (bench's rows carry the same for every release).
2. Where its error comes from: `tconform.check` runs the base Transformer (1x32, the bench's
   inputs) on each runtime against its float64 copy with localisation on every runtime, then
   names the first module call where OpenVINO and ONNX Runtime part
   (tconform.localise.versions.parting) and, per kind of module, the largest error of each.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

import tconform
from tconform import registry
from tconform.config import get_preset
from tconform.localise.versions import parting
from tconform.registry import Shape
from tconform.weights import DEFAULT_SEED, load_params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--shape", default="1x32")
    parser.add_argument("--runtime", action="append", default=None)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runtimes = args.runtime or ["onnxruntime", "openvino"]
    cfg = get_preset(args.preset)
    batch, seq = (int(n) for n in args.shape.split("x"))
    case = registry.get_case("transformer")
    module = load_params(case.build(cfg), case.make_params(cfg, DEFAULT_SEED))  # bench's weights
    feeds = registry.make_inputs(case, cfg, Shape(batch, seq, seq), np.random.default_rng(0))
    inputs = tuple(torch.from_numpy(np.asarray(feeds[s.name])) for s in case.inputs(cfg))
    report = tconform.check(
        module,
        inputs,
        runtimes=tuple(runtimes),
        localise=True,
        isolate="none",
        out_dir=Path("artifacts/check") / f"transformer-{args.preset}",
        name=f"transformer-{args.preset}",
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    found: dict[str, object] = {"preset": args.preset, "shape": args.shape, "runtimes": {}}
    for result in report.results:
        found["runtimes"][result.runtime] = {
            "status": result.status,
            "precision": result.precision,
            "outputs": {o.name: [o.max_abs_err, o.tolerance_used] for o in result.outputs},
            "notes": result.notes,
        }
    for label, settings in report.settings["runtimes"].items():
        found["runtimes"].setdefault(label, {})["settings"] = settings
    by_label = {loc.runtime: loc for loc in report.localisations}
    labels = list(by_label)
    found["partings"] = [
        parting(by_label[a], by_label[b]).to_dict()
        for i, a in enumerate(labels)
        for b in labels[i + 1 :]
    ]
    found["worst_by_class"] = {
        label: _worst_by_class(loc.boundaries) for label, loc in by_label.items()
    }
    print(json.dumps(found, indent=2, default=str))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(found, indent=2, default=str) + "\n")


def _worst_by_class(boundaries) -> dict[str, float]:
    """The largest max abs error of each kind of module (Linear, LayerNorm, ...), over its calls."""
    worst: dict[str, float] = {}
    for b in boundaries:
        errors = [o.max_abs_err for o in b.outputs if o.max_abs_err is not None]
        if errors:
            kind = b.cls.rsplit(".", 1)[-1]
            worst[kind] = max(worst.get(kind, 0.0), max(errors))
    return worst


if __name__ == "__main__":
    main()
