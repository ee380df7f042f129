"""PyTorch eager as a runtime: the reference module itself, run in a chosen dtype.

It is one more implementation under test: its float32 error against the float64 golden is
reported next to ONNX Runtime's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tconform.config import ModelConfig
from tconform.registry import Case
from tconform.weights import load_params


@dataclass
class TorchRuntime:
    dtype: torch.dtype = torch.float32
    device: str = "cpu"

    @property
    def name(self) -> str:
        return "torch"

    def open(self, case: Case, cfg: ModelConfig, params: dict[str, np.ndarray]) -> TorchSession:
        module = load_params(case.build(cfg).to(self.dtype), params).to(self.device)
        return TorchSession(module, case, cfg, self)


@dataclass
class TorchSession:
    module: torch.nn.Module
    case: Case
    cfg: ModelConfig
    runtime: TorchRuntime

    @property
    def providers(self) -> list[str]:
        return [f"torch-{self.runtime.device}"]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        args = []
        for spec in self.case.inputs(self.cfg):
            # torch.tensor copies: golden arrays are read-only views of the .pb files.
            t = torch.tensor(feeds[spec.name], device=self.runtime.device)
            args.append(t.to(self.runtime.dtype) if spec.kind == "float" else t)
        with torch.inference_mode():
            out = self.module(*args)
        out = out if isinstance(out, tuple) else (out,)
        return [o.detach().cpu().numpy() for o in out]
