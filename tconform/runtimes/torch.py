"""PyTorch as a runtime: a module run eagerly (or through torch.compile) in a chosen dtype on
the CPU or a CUDA device.

It is one more implementation under test: the reference module's float32 error against the
float64 golden is reported next to the ONNX runtimes', and a user's own module (tconform check) is
run the same way, in its own dtype. This module declares the runtimes (what the command line
reads) and imports torch only to open one: the session is tconform.runtimes.torch_session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tconform.errors import ProviderUnavailable
from tconform.runtimes.base import ModuleTarget, Runtime, Session


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
    def eager(self) -> bool:
        """The module run as it is, in its dtype: neither compiled, autocast nor quantised."""
        return not (self.compiled or self.autocast or self.quantized)

    @property
    def device_type(self) -> str:
        return "cpu" if self.ep == "cpu" else "cuda"

    def settings(self) -> dict[str, object]:
        import torch

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

    def open(self, target: ModuleTarget) -> Session:
        import torch

        from tconform.runtimes.torch_session import DTYPES, TorchSession, prepared

        if self.ep == "cuda" and not torch.cuda.is_available():
            raise ProviderUnavailable(f"cuda: this torch ({torch.__version__}) sees no CUDA device")
        module = target.build().to(DTYPES[self.dtype]).to(self.device)
        return TorchSession(prepared(self, module), target, self)


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
