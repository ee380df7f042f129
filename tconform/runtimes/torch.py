"""PyTorch as a runtime: a module run eagerly (or through torch.compile) in a chosen dtype on
the CPU or a CUDA device.

It is one more implementation under test: the reference module's float32 error against the
float64 golden is reported next to ONNX Runtime's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from tconform.errors import ProviderUnavailable
from tconform.runtimes import ModuleTarget

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "float64": torch.float64}


@dataclass
class TorchRuntime:
    name: ClassVar[str] = "torch"
    consumes: ClassVar[str] = "module"
    eps: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    compiled: ClassVar[bool] = False

    ep: str = "cpu"
    dtype: str = "float32"
    device_id: int = 0

    @property
    def precision(self) -> str:
        return self.dtype

    @property
    def device(self) -> str:
        return "cpu" if self.ep == "cpu" else f"cuda:{self.device_id}"

    def settings(self) -> dict[str, object]:
        return {"device": self.device, "dtype": self.dtype, "compiled": self.compiled}

    def open(self, target: ModuleTarget) -> TorchSession:
        if self.ep == "cuda" and not torch.cuda.is_available():
            raise ProviderUnavailable(f"cuda: this torch ({torch.__version__}) sees no CUDA device")
        module = target.build().to(_DTYPES[self.dtype]).to(self.device).eval()
        return TorchSession(module, target, self)


@dataclass
class CompiledTorchRuntime(TorchRuntime):
    """torch.compile of the module; the first run compiles, and its time is kept."""

    name: ClassVar[str] = "torch-compile"
    compiled: ClassVar[bool] = True


@dataclass
class TorchSession:
    module: torch.nn.Module
    target: ModuleTarget
    runtime: TorchRuntime
    placement: dict[str, int] = field(default_factory=dict)
    fallback_ops: dict[str, int] = field(default_factory=dict)
    compile_seconds: float | None = None

    def __post_init__(self) -> None:
        self.forward = torch.compile(self.module) if self.runtime.compiled else self.module

    @property
    def providers(self) -> list[str]:
        return [f"torch-{self.runtime.device}"]

    def arguments(self, feeds: dict[str, np.ndarray]) -> list[torch.Tensor]:
        """The feeds as forward's positional tensors on the device, floats in the dtype."""
        args = []
        for spec in self.target.inputs:
            # torch.tensor copies: golden arrays are read-only views of the .pb files.
            tensor = torch.tensor(feeds[spec.name], device=self.runtime.device)
            args.append(tensor.to(_DTYPES[self.runtime.dtype]) if spec.kind == "float" else tensor)
        return args

    def call(self, args: list[torch.Tensor]):
        """One forward pass on prepared arguments, finished on the device (for timing)."""
        started = time.perf_counter()
        with torch.inference_mode():
            out = self.forward(*args)
        if self.runtime.ep == "cuda":
            torch.cuda.synchronize()
        if self.runtime.compiled and self.compile_seconds is None:
            self.compile_seconds = round(time.perf_counter() - started, 1)
        return out

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        out = self.call(self.arguments(feeds))
        out = out if isinstance(out, tuple | list) else (out,)
        return [o.detach().cpu().numpy() for o in out]
