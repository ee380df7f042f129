"""An opt-in variant of the exported model for `--engine onnxruntime-fused`: the graph rewritten
by onnxruntime.transformers' optimizer (model_type "bert": LayerNorm, SkipLayerNorm, bias+GELU
and attention fusions where its patterns match), saved beside the model and reused while newer
than it. It answers whether those fusions close a gap that ORT's own session-time
optimisations leave."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tconform.config import ModelConfig
from tconform.errors import UsageError


def fused_model(model_path: Path, cfg: ModelConfig) -> Path:
    """model.fused.onnx beside `model_path`, made once (written atomically)."""
    fused = model_path.with_name("model.fused.onnx")
    if fused.is_symlink() or (fused.exists() and not fused.is_file()):
        raise UsageError(
            f"{fused}: not a regular file; tconform reads and writes no link it did not make "
            "(remove it)"
        )
    if fused.exists() and fused.stat().st_mtime >= model_path.stat().st_mtime:
        return fused
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(
        str(model_path),
        model_type="bert",
        num_heads=cfg.n_heads,
        hidden_size=cfg.d_model,
        opt_level=0,  # the optimizer's Python fusions only; ORT's own passes run at session load
    )
    handle, tmp = tempfile.mkstemp(dir=fused.parent, suffix=".onnx.tmp")
    os.close(handle)
    optimized.save_model_to_file(tmp)
    os.replace(tmp, fused)
    return fused


def fused_op_counts(fused: Path) -> dict[str, int]:
    """Node count per op type of the fused graph, to show which fusions applied."""
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(fused), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
