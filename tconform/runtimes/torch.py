"""PyTorch as a runtime: a module run eagerly (or through torch.compile) in a chosen dtype on
the CPU or a CUDA device.

It is one more implementation under test: the reference module's float32 error against the
float64 golden is reported next to the ONNX runtimes', and a user's own module (tconform check) is
run the same way, in its own dtype.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from tconform.compare import BFLOAT16
from tconform.errors import ProviderUnavailable
from tconform.provenance import module_provenance
from tconform.runtimes.base import ModuleTarget, Runtime, Session, TensorInfo, TimedCall, select

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


def as_array(tensor: torch.Tensor) -> np.ndarray:
    """A tensor as a NumPy array on the host; bfloat16, which NumPy lacks, as ml_dtypes'
    bfloat16 (the type ONNX tools use), bit for bit."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(BFLOAT16)
    return tensor.numpy()


def as_tensor(array: np.ndarray, device: str | torch.device = "cpu") -> torch.Tensor:
    """A NumPy array as a new tensor on `device` (a copy: golden arrays are read-only views of
    their files); ml_dtypes' bfloat16 as torch.bfloat16, bit for bit."""
    array = np.asarray(array)
    if array.dtype == BFLOAT16:
        return torch.tensor(array.view(np.int16), device=device).view(torch.bfloat16)
    return torch.tensor(array, device=device)


def flatten_outputs(out: object, prefix: str = "output") -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor in a module's output, in the order the exporters flatten
    it: a tensor is `output`, a tuple gives output_0, output_1, ..., a dict (a transformers
    ModelOutput among them) its keys; anything that is not a tensor (None, numbers) is left
    out, as the exporters leave it out."""
    if isinstance(out, torch.Tensor):
        return [(prefix, out)]
    if isinstance(out, dict):
        items = [(str(k) if prefix == "output" else f"{prefix}.{k}", v) for k, v in out.items()]
    elif isinstance(out, (tuple, list)):
        items = [(f"{prefix}_{i}", v) for i, v in enumerate(out)]
    else:
        return []
    return [pair for name, value in items for pair in flatten_outputs(value, name)]


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """The module in eval mode for the duration, each submodule's own mode restored after."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, training in modes:
            m.training = training


@contextlib.contextmanager
def plain_composition() -> Iterator[None]:
    """PyTorch's fused Transformer fast path off (it skips the submodules' forward)."""
    mha = torch.backends.mha
    previous = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(previous)


@dataclass
class TorchRuntime(Runtime):
    """PyTorch eager. Its variants (the classes below) are what a PyTorch user reaches for to go
    faster: torch.compile (`compiled`), autocast to a lower precision (`autocast`: matrix
    products in bfloat16, the rest float32) and dynamic int8 Linear layers (`quantized`)."""

    name: ClassVar[str] = "torch"
    consumes: ClassVar[str] = "module"
    eps: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    compiled: ClassVar[bool] = False
    autocast: ClassVar[str | None] = None  # torch.autocast's dtype, by name
    quantized: ClassVar[bool] = False

    ep: str = "cpu"
    dtype: str = "float32"
    device_id: int = 0

    @property
    def precision(self) -> str:
        """What its matrix products compute in: int8 (quantised Linear layers), the autocast
        dtype, else the module's own dtype."""
        return "int8" if self.quantized else self.autocast or self.dtype

    @property
    def device(self) -> str:
        return "cpu" if self.ep == "cpu" else f"cuda:{self.device_id}"

    @property
    def device_type(self) -> str:
        return "cpu" if self.ep == "cpu" else "cuda"

    def settings(self) -> dict[str, object]:
        settings: dict[str, object] = {
            "device": self.device,
            "dtype": self.dtype,
            "compiled": self.compiled,
            "torch": torch.__version__,
        }
        if self.autocast:
            settings["autocast"] = {"device_type": self.device_type, "dtype": self.autocast}
        if self.quantized:
            settings["quantization"] = QUANTIZATION
        return settings

    def open(self, target: ModuleTarget) -> TorchSession:
        if self.ep == "cuda" and not torch.cuda.is_available():
            raise ProviderUnavailable(f"cuda: this torch ({torch.__version__}) sees no CUDA device")
        module = target.build().to(DTYPES[self.dtype]).to(self.device)
        return TorchSession(self.prepared(module), target, self)

    def prepared(self, module: nn.Module) -> nn.Module:
        """The module as this runtime runs it: as built, or with its Linear layers dynamically
        quantised to int8 as a PyTorch user gets an int8 model."""
        if not self.quantized:
            return module
        import warnings

        from torch.ao.quantization import quantize_dynamic

        # A copy, quantised in eval mode: the user's module keeps its own modes.
        with warnings.catch_warnings(), eval_mode(module):
            warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
            return quantize_dynamic(module, {nn.Linear}, dtype=torch.qint8, inplace=False)

    def precision_context(self) -> contextlib.AbstractContextManager:
        """What a forward pass runs under: torch.autocast where the runtime asks for it."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=DTYPES[self.autocast])


@dataclass
class CompiledTorchRuntime(TorchRuntime):
    """torch.compile of the module; the first run compiles, and its time is kept."""

    name: ClassVar[str] = "torch-compile"
    compiled: ClassVar[bool] = True


@dataclass
class QuantizedTorchRuntime(TorchRuntime):
    """The module with its Linear layers dynamically quantised to int8, as a PyTorch user gets
    an int8 model: `torch.ao.quantization.quantize_dynamic(module, {nn.Linear}, qint8)` (int8
    weights, one scale per tensor; activations quantised to uint8 on each call, the output
    float32). It computes in int8, so it is judged by the int8 tolerance rows, the same rows as
    ONNX Runtime's int8 graph. The quantised kernels (fbgemm/onednn) run on the CPU only."""

    name: ClassVar[str] = "torch-int8"
    eps: ClassVar[tuple[str, ...]] = ("cpu",)
    quantized: ClassVar[bool] = True


@dataclass
class CompiledQuantizedTorchRuntime(QuantizedTorchRuntime):
    """torch.compile of the dynamically quantised module (the int8 Linear kernels are called as
    they are; Inductor compiles what lies between them)."""

    name: ClassVar[str] = "torch-compile-int8"
    compiled: ClassVar[bool] = True


@dataclass
class BFloat16TorchRuntime(TorchRuntime):
    """The float32 module under `torch.autocast("cpu", dtype=torch.bfloat16)`, as a PyTorch user
    runs it in bfloat16 on a CPU: matrix products (Linear, matmul, bmm) in bfloat16 (oneDNN's
    AMX or AVX512-BF16 kernels where the CPU has them), the rest float32. Judged by the
    bfloat16 rows, like OpenVINO's bf16 inference; its outputs come back as float32."""

    name: ClassVar[str] = "torch-bf16"
    eps: ClassVar[tuple[str, ...]] = ("cpu",)
    autocast: ClassVar[str | None] = "bfloat16"


@dataclass
class CompiledBFloat16TorchRuntime(BFloat16TorchRuntime):
    """torch.compile of the module under bfloat16 autocast (Inductor's CPU code)."""

    name: ClassVar[str] = "torch-compile-bf16"
    compiled: ClassVar[bool] = True


# What QuantizedTorchRuntime asks of torch.ao.quantization.quantize_dynamic (recorded).
QUANTIZATION = {
    "tool": "torch.ao.quantization.quantize_dynamic",
    "modules": ["Linear"],
    "dtype": "qint8",
}


def _host_array(tensor: torch.Tensor, autocast: str | None) -> np.ndarray:
    """An output as NumPy. Under autocast an output of the float32 module can come out in the
    autocast dtype (bfloat16, which NumPy lacks): it is returned as float32, the module's own
    type, which holds every bfloat16 value exactly."""
    if autocast is not None and tensor.dtype == DTYPES[autocast]:
        tensor = tensor.float()
    return as_array(tensor)  # a bfloat16 module's outputs stay bfloat16


class TorchSession(Session):
    def __init__(self, module: nn.Module, target: ModuleTarget, runtime: TorchRuntime) -> None:
        self.module = module
        self.target = target
        self.runtime = runtime
        self.forward = torch.compile(module) if runtime.compiled else module
        self.compile_seconds: float | None = None
        self.providers = [f"torch-{runtime.device}"]
        self.placement: dict[str, int] = {}
        self.fallback_ops: dict[str, int] = {}
        self.precision = runtime.precision
        self.inputs = [TensorInfo(name) for name in (*target.args, *target.kwargs)]
        self.outputs = list(target.outputs)
        self.provenance = module_provenance(module, runtime.dtype)
        self.notes: list[str] = []

    def _tensor(self, name: str, value: np.ndarray) -> torch.Tensor:
        tensor = as_tensor(value, self.runtime.device)
        return tensor.to(DTYPES[self.runtime.dtype]) if name in self.target.floats else tensor

    def arguments(self, feeds: Mapping[str, np.ndarray]) -> tuple[list, dict]:
        """The feeds as forward's arguments on the device, floats in the runtime's dtype."""
        args = [self._tensor(n, feeds[n]) for n in self.target.args]
        return args, {n: self._tensor(n, feeds[n]) for n in self.target.kwargs}

    def call(self, args: list, kwargs: dict) -> object:
        """One forward pass (eval mode, submodules' own modes restored), finished on the
        device; the first call of a compiled module records how long it took."""
        started = time.perf_counter()
        with (
            torch.inference_mode(),
            eval_mode(self.module),
            plain_composition(),
            self.runtime.precision_context(),
        ):
            out = self.forward(*args, **kwargs)
        if self.runtime.ep == "cuda":
            torch.cuda.synchronize()
        if self.runtime.compiled and self.compile_seconds is None:
            self.compile_seconds = round(time.perf_counter() - started, 1)
        return out

    def run(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        out = self.call(*self.arguments(feeds))
        values = [_host_array(t, self.runtime.autocast) for _, t in flatten_outputs(out)]
        return select(self.outputs, values, outputs)

    def timed_call(self, feeds: Mapping[str, np.ndarray], io_binding: bool = False) -> TimedCall:
        """Inputs prepared on the device once; a compiled module is compiled first (timed)."""
        torch.set_flush_denormal(False)  # PyTorch's default, whatever another runtime set
        args, kwargs = self.arguments(feeds)
        details: dict[str, object] = {"device": self.runtime.device}
        if self.runtime.compiled:
            self.call(args, kwargs)
            details["compile_s"] = self.compile_seconds
        on_cuda = self.runtime.ep == "cuda"
        if on_cuda:
            torch.cuda.reset_peak_memory_stats()

        def device_memory_mb() -> float | None:
            return torch.cuda.max_memory_allocated() / 2**20 if on_cuda else None

        return TimedCall(lambda: self.call(args, kwargs), self.close, device_memory_mb, details)

    def close(self) -> None:
        if self.runtime.compiled:
            torch._dynamo.reset()
