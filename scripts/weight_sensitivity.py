"""What one weight matrix 1 % off does under each precision row (docs/sensitivity.md, "One weight
matrix 1 % off").

    python scripts/weight_sensitivity.py [--model NAME ...] [--dtype float32 ...]
                                         [--json results/weight-sensitivity.json]

For every model of the zoo (tests/zoo/models.py) and a few more built from transformers configs
(Segformer, also with logits of about 1e-6, GPT-NeoX, Qwen3, Phi-3), the float64 copy of the
unmodified module is the reference, as `tconform check` makes it. One weight matrix of the
module (a Linear or a convolution) is scaled by 1.01 in PyTorch, and the module is exported
(dynamo, TorchScript where the zoo says so) clean and scaled, then made into each dtype:

- float32: the export as it is, on ONNX Runtime's CPU provider;
- float16: onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True), on
  ONNX Runtime's CPU provider;
- int8: quantised as `tconform export --dtype int8` does (quantize_dynamic, 7-bit per-channel
  weights), on ONNX Runtime's CPU provider;
- bfloat16: the module in bfloat16, exported so, on OpenVINO (ONNX Runtime's CPU provider has
  no bfloat16 kernels).

Each model is judged by the row its graph earns (tconform.models.ModelUnderTest.precision),
"model" class, exactly as check judges it, under the rule of tconform.compare (the atol scaled
to each output's RMS) and, for comparison, under the same row with the atol taken as given
(the rule before it). It prints a markdown table: the worst share of the tolerance used by the
clean model and by the scaled one, whether the scaled one is caught, and the output's RMS.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import torch
from tconform.sensitivity import format_used
from torch import nn

from tconform.compare import Tolerance, compare_output, judge_outputs, tolerance_for
from tconform.execution import Subject, execute
from tconform.export.quantize import quantize_int8
from tconform.golden import InputSet
from tconform.models import given_file
from tconform.module_check.exporting import DEFAULT_OPSET, export_module
from tconform.module_check.float64_copy import build_float64_copy
from tconform.module_check.inputs import as_inputs
from tconform.results import Result
from tconform.runtimes import make_runtime
from tconform.runtimes.torch import flatten_outputs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.zoo, from the checkout
from tests.zoo import models as zoo

DTYPES = ("float32", "float16", "int8", "bfloat16")
SCALE = 1.01
BFLOAT16_OPSET = 23
RUNTIME = {"float32": "onnxruntime", "float16": "onnxruntime", "int8": "onnxruntime",
           "bfloat16": "openvino"}  # fmt: skip


# --- models beyond the zoo, from transformers configs (the zoo's sizes and seed) --------------


def _segformer(initializer_range: float) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    config = SegformerConfig(
        num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
        hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
        mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=5,
        initializer_range=initializer_range,
    )  # fmt: skip
    with zoo._seeded():
        model = SegformerForSemanticSegmentation(config).eval()
        pixel_values = torch.randn(zoo.BATCH, 3, 32, 32)
    return zoo.ImageLogits(model).eval(), (pixel_values,)


def segformer():
    """Segformer with the zoo's nudged weights: logits of RMS about 1e-2."""
    module, inputs = _segformer(0.02)
    zoo._nudge(module)
    return module, inputs


def segformer_tiny_logits():
    """Segformer fresh from a config of initializer range 0.002: logits of RMS about 1e-6,
    ten times below the float32 model row's atol of 1e-5."""
    return _segformer(0.002)


def _causal(config_class: str, model_class: str, **extra):
    def factory():
        import transformers

        config = getattr(transformers, config_class)(
            vocab_size=zoo.VOCAB, hidden_size=zoo.HIDDEN, intermediate_size=zoo.FFN,
            num_hidden_layers=zoo.LAYERS, num_attention_heads=zoo.HEADS,
            max_position_embeddings=64, attn_implementation="eager", **extra,
        )  # fmt: skip
        with zoo._seeded():
            model = zoo._nudge(getattr(transformers, model_class)(config))
            input_ids = zoo._tokens()
        return zoo.CausalLMLogits(model).eval(), (input_ids,)

    return factory


MORE: dict[str, Callable] = {
    "segformer": segformer,
    "segformer_tiny_logits": segformer_tiny_logits,
    "gpt_neox": _causal("GPTNeoXConfig", "GPTNeoXForCausalLM", use_parallel_residual=True),
    "qwen3": _causal("Qwen3Config", "Qwen3ForCausalLM", num_key_value_heads=2, head_dim=8),
    "phi3": _causal("Phi3Config", "Phi3ForCausalLM", num_key_value_heads=2, pad_token_id=0),
}
# The weight matrix scaled in each model beyond the zoo (the zoo's: its TARGETS' first).
MORE_TARGETS = {
    "segformer": "model.segformer.stages.1.blocks.0.mlp.fc1",
    # the head: in the tiny-initialised encoder a 1 % weight error moves the logits by about
    # 1e-8 relative (float32's own rounding); the head's moves them by 1 %
    "segformer_tiny_logits": "model.decode_head.classifier",
    "gpt_neox": "model.gpt_neox.layers.1.mlp.dense_4h_to_h",
    "qwen3": "model.model.layers.1.mlp.up_proj",
    "phi3": "model.model.layers.1.mlp.down_proj",
}


def models() -> dict[str, tuple[Callable, str]]:
    """name -> (factory, the module whose weight is scaled)."""
    found = {
        name: (factory, zoo.TARGETS[name][0])
        for name, factory in zoo.ZOO.items()
        if name != "llama_left_padded"  # its reference is NaN at padded rows (the zoo's R7)
    }
    return {**found, **{name: (MORE[name], MORE_TARGETS[name]) for name in MORE}}


# --- one measurement ---------------------------------------------------------------------------


@dataclass
class Row:
    model: str
    dtype: str
    target: str
    status: str  # measured | n.a. (with the reason)
    effect: float  # RMS of the change in the exact (float64) outputs over their RMS
    precision: str = ""
    output_rms: float | None = None
    atol_used: float | None = None
    clean_used: float | None = None  # worst share of the tolerance, the rule of compare.py
    scaled_used: float | None = None
    clean_used_unscaled: float | None = None  # the same row, its atol taken as given
    scaled_used_unscaled: float | None = None
    clean_passes: bool | None = None
    caught: bool | None = None
    caught_unscaled: bool | None = None
    reason: str = ""


def _quiet(function, *args, **kwargs):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return function(*args, **kwargs)


def _scaled(module: nn.Module, target: str) -> nn.Module:
    """A deep copy of `module` with `target`'s weight times SCALE."""
    faulty = copy.deepcopy(module)
    with torch.no_grad():
        faulty.get_submodule(target).weight.mul_(SCALE)
    return faulty


def _model_file(module, inputs, names, dtype, exporter, folder: Path) -> Path:
    """`module` exported and made into `dtype` (module docstring) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    if dtype == "bfloat16":
        module = copy.deepcopy(module).to(torch.bfloat16)
        inputs = inputs.converted(torch.bfloat16, None)
    exported = folder / "export" / "model.onnx"
    # ONNX's Conv and others take bfloat16 from opset 22
    opset = BFLOAT16_OPSET if dtype == "bfloat16" else DEFAULT_OPSET
    _quiet(export_module, module, inputs, names, exported, exporter, opset)
    if dtype in ("float32", "bfloat16"):
        return exported
    target = folder / f"{dtype}.onnx"
    if dtype == "int8":
        # The quantiser re-runs shape inference, which the exporter's own value_info (shapes
        # of tensors an in-place op rewrote) can contradict: it is left out, as it can be.
        model = onnx.load(str(exported))
        del model.graph.value_info[:]
        plain = folder / "plain.onnx"
        onnx.save(model, str(plain))
        _quiet(quantize_int8, plain, target)
    else:
        from onnxruntime.transformers.float16 import convert_float_to_float16
        from onnxruntime.transformers.onnx_model import OnnxModel

        model = _quiet(convert_float_to_float16, onnx.load(str(exported)), keep_io_types=True)
        converted = OnnxModel(model)
        converted.topological_sort()  # the converter appends the Casts it puts at the outputs
        onnx.save(converted.model, str(target))
    return target


def _judged(path: Path, dtype: str, expected: InputSet, name: str):
    """The worst share used under the rule and under the row with its atol as given, whether
    each passes, and the first output's comparison (its RMS and atol)."""
    unscaled: list = []

    def row_for(precision: str, _output: str) -> Tolerance:
        return tolerance_for(precision, "model")

    judge = judge_outputs(row_for)

    def both(outputs, input_set, precision):
        found = judge(outputs, input_set, precision)
        row = replace(row_for(precision, ""), atol_rms=None)
        unscaled[:] = [
            compare_output(c.name, outputs.get(c.name, list(outputs.values())[k]),
                           input_set.outputs[c.name], row)
            for k, c in enumerate(found)
        ]  # fmt: skip
        return found

    model = given_file(path)
    (result,) = execute(make_runtime(RUNTIME[dtype]), Subject(model), [expected], both,
                        Result.about(name, name))  # fmt: skip
    if result.status not in ("pass", "fail"):
        return result, None
    return result, unscaled


def _reason(message: str) -> str:
    """Why a row is n.a., in a line fit for the table: without the export log's path."""
    return message.split(" (full log:")[0][:200]


def _relative_rms(moved, clean) -> float:
    finite = np.isfinite(clean) & np.isfinite(moved)
    change = np.sqrt(np.mean((moved[finite] - clean[finite]) ** 2))
    return float(change / np.sqrt(np.mean(clean[finite] ** 2)))


def _worst(comparisons) -> float:
    used = [c.tolerance_used for c in comparisons]
    return float("inf") if any(u is None for u in used) else max(used)


def measure(name: str, factory: Callable, target: str, dtypes, work: Path) -> list[Row]:
    module, example = _quiet(factory)
    exporter = zoo.EXPORTERS.get(name, "dynamo")
    inputs = as_inputs(module, example, name)
    with torch.no_grad():
        names = [n for n, _ in flatten_outputs(module(*inputs.args, **inputs.kwargs))]
    reference = _quiet(build_float64_copy, module, inputs, name)
    expected = InputSet("example", inputs.feeds(), reference.outputs)
    faulty = _scaled(module, target)
    # What an exact comparison sees: the scaled module's float64 outputs against the clean's
    moved = _quiet(build_float64_copy, faulty, inputs, name).outputs
    effect = max(_relative_rms(moved[n], reference.outputs[n]) for n in reference.outputs)
    rows = []
    for dtype in dtypes:
        row = Row(name, dtype, target, "measured", effect=effect)
        try:
            judged = {}
            for kind, variant in (("clean", module), ("scaled", faulty)):
                path = _model_file(
                    variant, inputs, names, dtype, exporter, work / name / dtype / kind
                )
                judged[kind] = _judged(path, dtype, expected, name)
        except Exception as exc:  # an export or a conversion the tools refuse: n.a., with why
            reason = _reason(f"{type(exc).__name__}: {exc}")
            rows.append(replace(row, status="n.a.", reason=reason))
            print(f"{name} {dtype}: n.a. ({reason})", file=sys.stderr)
            continue
        (clean, clean_unscaled), (scaled, scaled_unscaled) = judged["clean"], judged["scaled"]
        if clean_unscaled is None or scaled_unscaled is None:
            reason = _reason((clean if clean_unscaled is None else scaled).message)
            rows.append(replace(row, status="n.a.", reason=reason))
            print(f"{name} {dtype}: n.a. ({reason})", file=sys.stderr)
            continue
        first = clean.outputs[0]
        rows.append(
            replace(
                row,
                precision=clean.precision,
                output_rms=first.golden_rms,
                atol_used=first.atol,
                clean_used=_worst(clean.outputs),
                scaled_used=_worst(scaled.outputs),
                clean_used_unscaled=_worst(clean_unscaled),
                scaled_used_unscaled=_worst(scaled_unscaled),
                clean_passes=clean.status == "pass",
                caught=scaled.status == "fail",
                caught_unscaled=any(c.status == "fail" for c in scaled_unscaled),
            )
        )
        print(f"{name} {dtype}: {rows[-1]}", file=sys.stderr)
    return rows


# --- the table ---------------------------------------------------------------------------------


def markdown(rows: list[Row]) -> str:
    lines = [
        "| model | dtype (row) | exact change | output RMS | atol used | clean | 1.01x | caught | "
        "atol as given: clean | 1.01x | caught |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        if r.status != "measured":
            lines.append(f"| {r.model} | {r.dtype} | {r.effect:.2g} | n.a.: {r.reason} ||||||| |")
            continue
        lines.append(
            f"| {r.model} | {r.dtype} ({r.precision}) | {r.effect:.2g} | {r.output_rms:.2g} | "
            f"{r.atol_used:.2g} | "
            f"{format_used(r.clean_used)} | {format_used(r.scaled_used)} | "
            f"{'yes' if r.caught else '**no**'}{'' if r.clean_passes else ' (clean FAILS)'} | "
            f"{format_used(r.clean_used_unscaled)} | {format_used(r.scaled_used_unscaled)} | "
            f"{'yes' if r.caught_unscaled else 'no'} |"
        )
    lines.append("")
    for dtype in DTYPES:
        measured = [r for r in rows if r.dtype == dtype and r.status == "measured"]
        if measured:
            caught = sum(bool(r.caught) for r in measured)
            before = sum(bool(r.caught_unscaled) for r in measured)
            false = sum(not r.clean_passes for r in measured)
            lines.append(
                f"- {dtype}: caught {caught} of {len(measured)} (atol as given: {before}); "
                f"clean models failing: {false}"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="only this model (repeatable)")
    parser.add_argument("--dtype", action="append", choices=DTYPES)
    parser.add_argument("--json", type=Path, help="also write every row here")
    args = parser.parse_args()
    known = models()
    unknown = sorted(set(args.model or ()) - set(known))
    if unknown:
        parser.error(f"unknown model {unknown[0]}; known: {', '.join(known)}")
    chosen = {n: known[n] for n in (args.model or known)}
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (factory, target) in chosen.items():
            rows += measure(name, factory, target, args.dtype or DTYPES, Path(tmp))
    table = markdown(rows)
    print(table, end="")
    if args.json:
        from tconform.versions import cpu_name, library_versions

        record = {
            "command": "python scripts/weight_sensitivity.py",
            "cpu": cpu_name(),
            "versions": library_versions(),
            "rows": [asdict(r) for r in rows],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
