"""Localisation on a GPT-2-small-sized model (12 layers, d_model 768, vocabulary 50257, random
weights from config): peak memory above the process's baseline and seconds, for a clean model
and for one with a corrupted weight (docs/check.md, "Large models").

    python scripts/localise_scale.py [--out DIR] [--seq 32] [--json FILE]

The model is exported once into DIR (default artifacts-scale/gpt2-small, reused while present).
Each measurement runs in a fresh process: build the module, read the baseline RSS, reset the
high-water mark, then `tconform.check(module, inputs, onnx_model=..., localise=True)`; the
peak is the high-water mark (VmHWM) above that baseline, in multiples of the model file's size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SIZES = {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}


def build(seq: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(**SIZES, attn_implementation="eager")
    model = GPT2LMHeadModel(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids).logits

    ids = torch.randint(3, SIZES["vocab_size"], (1, seq))
    return Logits().eval(), (ids,)


def export(folder: Path, seq: int) -> Path:
    import tconform

    path = folder / "export" / "model.onnx"
    if path.exists():
        return path
    module, inputs = build(seq)
    started = time.perf_counter()
    tconform.check(module, inputs, out_dir=path.parent, runtimes=("onnxruntime",))
    print(f"exported {path} in {time.perf_counter() - started:.0f} s", flush=True)
    return path


def corrupt(model: Path, folder: Path) -> Path:
    """The model with one weight of the 6th block's MLP output projection scaled."""
    import onnx
    from onnx import numpy_helper

    target = folder / "corrupted" / "model.onnx"
    if target.exists():
        return target
    loaded = onnx.load(str(model))
    weight = next(t for t in loaded.graph.initializer if t.name.endswith("h.5.mlp.c_proj.weight"))
    array = numpy_helper.to_array(weight) * 1.5
    weight.CopyFrom(numpy_helper.from_array(array, weight.name))
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(loaded, str(target))
    return target


def measure(model: Path, seq: int) -> dict:
    """In this process: baseline after the module is built, then check + localise."""
    import tconform
    from tconform.bench.timing import current_rss_mb, peak_rss_mb, reset_peak_rss

    module, inputs = build(seq)
    baseline = current_rss_mb()
    reset_peak_rss()
    phases = []
    started = time.perf_counter()

    def progress(line: str) -> None:
        phases.append((round(time.perf_counter() - started, 1), line))

    report = tconform.check(
        module,
        inputs,
        onnx_model=model,
        localise=True,
        runtimes=("onnxruntime",),
        progress=progress,
    )
    seconds = time.perf_counter() - started
    loc = report.localisations[0]
    size_mb = model.stat().st_size / 2**20
    return {
        "model": str(model),
        "model_mb": round(size_mb, 1),
        "seq": seq,
        "baseline_rss_mb": round(baseline, 1),
        "peak_above_baseline_mb": round(peak_rss_mb() - baseline, 1),
        "peak_over_model_size": round((peak_rss_mb() - baseline) / size_mb, 2),
        "seconds": round(seconds, 1),
        "exit_code": report.exit_code,
        "first_divergence": loc.first.label if loc.first else None,
        "verdict": loc.verdict,
        "boundaries": len(loc.boundaries),
        "matched": len(loc.matched),
        "fetch_runs": loc.fetch_runs,
        "phases": phases,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("artifacts-scale/gpt2-small"))
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child's job
    args = parser.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.seq)))
        return
    model = export(args.out, args.seq)
    rows = []
    for what, path in (("clean", model), ("corrupted", corrupt(model, args.out))):
        child = subprocess.run(
            [sys.executable, __file__, "--measure", str(path), "--seq", str(args.seq)],
            capture_output=True,
            text=True,
            check=True,
        )
        row = {"what": what, **json.loads(child.stdout.strip().splitlines()[-1])}
        rows.append(row)
        print(
            f"{what}: model {row['model_mb']} MB; peak {row['peak_above_baseline_mb']} MB above "
            f"the baseline ({row['peak_over_model_size']}x the model); {row['seconds']} s; "
            f"exit {row['exit_code']}; first divergence {row['first_divergence']}; "
            f"{row['matched']}/{row['boundaries']} boundaries matched in {row['fetch_runs']} runs",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
