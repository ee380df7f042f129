"""The torch.onnx call: a case's module with its seeded weights, traced on example inputs whose
axes all differ, exported by the dynamo or the TorchScript exporter, then checked (onnx.checker,
full check) and loaded once in ONNX Runtime. `export_with_torch` is the one call of
torch.onnx.export, shared with `tconform check` (tconform.module_check.exporting).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch

from tconform import registry
from tconform.config import ModelConfig
from tconform.errors import UsageError
from tconform.export.quantize import QUANTIZERS
from tconform.export.settings import DTYPES, ExportSettings
from tconform.reference.attention import use_attention_kernel
from tconform.registry import Case, Shape
from tconform.weights import checkpoint_params, load_params, make_params

MAX_IR_VERSION = 10  # ONNX Runtime 1.30/1.31 refuse IR > 13; the exporters write <= 10


def example_shape(cfg: ModelConfig) -> Shape:
    # Distinct sizes per axis, none of them 0 or 1, so the exporter cannot specialise an axis
    # or assume that source and target lengths are equal.
    return Shape(2, min(7, cfg.max_seq_len), min(5, cfg.max_seq_len - 1))


def build_module(case: Case, settings: ExportSettings) -> tuple[torch.nn.Module, dict]:
    """The case's module in the export's dtype with its weights (seeded, or the checkpoint's),
    and those weights (float64 arrays of float32 values)."""
    module = use_attention_kernel(case.build(settings.cfg), settings.attention)
    if settings.checkpoint:
        params = checkpoint_params(module, settings.checkpoint, settings.cfg)
    else:
        params = make_params(module, settings.seed, case.weight_init)
    return load_params(module.to(DTYPES[settings.dtype]), params), params


def _example_args(case: Case, settings: ExportSettings) -> tuple[torch.Tensor, ...]:
    rng = np.random.default_rng(0)
    arrays = registry.make_inputs(case, settings.cfg, example_shape(settings.cfg), rng)
    args = []
    for spec in case.inputs(settings.cfg):
        t = torch.from_numpy(arrays[spec.name])
        args.append(t.to(DTYPES[settings.dtype]) if spec.kind == "float" else t)
    return tuple(args)


def dynamic_axes(case: Case, cfg: ModelConfig) -> dict[str, dict[int, str]]:
    """{tensor name: {axis index: axis name}} for every dynamic axis of inputs and outputs."""
    specs = (*case.inputs(cfg), *case.outputs(cfg))
    return {
        s.name: {i: a for i, a in enumerate(s.axes) if a in registry.DYNAMIC_AXES} for s in specs
    }


@contextlib.contextmanager
def _quiet():
    """The exporters print progress and warnings of their own; tconform reports instead."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def export_to(case: Case, settings: ExportSettings, path: Path) -> None:
    """The case's model at `settings` written to `path`: the module traced in its dtype, and
    for int8 and int4 that float32 export quantised (tconform.export.quantize)."""
    if settings.dtype in QUANTIZERS:
        traced = path.with_name(f"float32-{path.name}")
        _trace_to(case, settings, traced)
        QUANTIZERS[settings.dtype](traced, path)
        traced.unlink()
    else:
        _trace_to(case, settings, path)


def _trace_to(case: Case, settings: ExportSettings, path: Path) -> None:
    module, _ = build_module(case, settings)
    args = _example_args(case, settings)
    inputs = [s.name for s in case.inputs(settings.cfg)]
    outputs = [s.name for s in case.outputs(settings.cfg)]
    axes = dynamic_axes(case, settings.cfg)
    with _quiet():
        export_with_torch(
            module,
            args,
            path,
            settings.exporter,
            settings.opset,
            outputs,
            input_names=inputs,
            dynamic_shapes=tuple(axes[n] for n in inputs),  # positional: forward's names vary
            dynamic_axes={n: a for n, a in axes.items() if a},
        )


def export_with_torch(
    module: torch.nn.Module,
    args: tuple,
    path: Path,
    exporter: str,
    opset: int,
    output_names: list[str],
    *,
    input_names: list[str] | None = None,
    kwargs: dict | None = None,
    dynamic_shapes: tuple | dict | None = None,
    dynamic_axes: dict[str, dict[int, str]] | None = None,
) -> None:
    """torch.onnx.export as every tconform export calls it (the shipped cases and `tconform
    check`): the dynamo exporter takes `dynamic_shapes`, TorchScript `dynamic_axes`; weights
    stay inside the one file."""
    common = {
        "kwargs": kwargs,
        "input_names": input_names,
        "output_names": output_names,
        "opset_version": opset,
    }
    if exporter == "dynamo":
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            external_data=False,
            verbose=False,
            **common,
        )
    else:
        torch.onnx.export(
            module, args, str(path), dynamo=False, dynamic_axes=dynamic_axes, **common
        )


def exporter_error_line(exc: BaseException) -> str:
    """The line of an exporter error that says what went wrong (dynamo leads with a banner)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for n, ln in enumerate(lines):
        if ln.startswith("<class"):
            # "...ranges from model tracing:" introduces what it found: the next line says it
            return f"{ln} {lines[n + 1]}" if ln.endswith(":") and n + 1 < len(lines) else ln
    return lines[0] if lines else type(exc).__name__


# The dynamo exporter stores each node's Python stack trace, absolute paths of the exporting
# machine included; a model meant to be shipped should not carry them. The module scope
# (`namespace`), which localisation reads, is kept.
_STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


def _drop_stack_traces(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        kept = [p for p in node.metadata_props if p.key != _STACK_TRACE_KEY]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)


def checked_model(raw: Path) -> onnx.ModelProto:
    """Check the exported model and fix what ONNX Runtime needs (the IR version). It must load
    in ONNX Runtime, except for a kernel the CPU provider lacks (bfloat16 MatMul: such a model
    runs on OpenVINO and onnx.reference, and ONNX Runtime's rows say `skip`)."""
    model = onnx.load(str(raw))
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
    _drop_stack_traces(model)
    onnx.checker.check_model(model, full_check=True)
    try:  # the model must also load where it will run
        onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:
        if "Could not find an implementation for" not in str(exc):
            reason = exporter_error_line(exc)
            raise UsageError(f"exported model does not load in ONNX Runtime: {reason}") from None
    return model
