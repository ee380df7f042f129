"""The torch runtime's session (tconform.runtimes.torch declares the runtime) and what it runs
on: NumPy arrays to tensors and back, a module's outputs flattened as the exporters flatten them,
eval mode, PyTorch's fused Transformer path off. tconform.module_check reuses them. Apart from
the declarations, so that reading those (every command line does) does not import torch.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from tconform.compare import BFLOAT16
from tconform.provenance import module_provenance
from tconform.runtimes.base import ModuleTarget, Session, TensorInfo, TimedCall, select

if TYPE_CHECKING:
    from tconform.runtimes.torch_session import TorchRuntime

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
    return [(name, leaf) for name, leaf in _leaves(out, prefix) if isinstance(leaf, torch.Tensor)]


def opaque_outputs(out: object) -> list[tuple[str, str]]:
    """(name, type name) for each part of a module's output that is neither a tensor, a
    tuple, list or dict of them, nor a constant the exporters drop (None, a number, a
    string): an object such as transformers' DynamicCache, which no exporter can return."""
    constants = (type(None), bool, int, float, complex, str)
    return [
        (name, type(leaf).__name__)
        for name, leaf in _leaves(out, "output")
        if not isinstance(leaf, (torch.Tensor, *constants))
    ]


def _leaves(out: object, prefix: str) -> list[tuple[str, object]]:
    """(name, part) for every part of `out` that is not a tuple, list or dict, named as
    flatten_outputs names them."""
    if isinstance(out, dict):
        items = [(str(k) if prefix == "output" else f"{prefix}.{k}", v) for k, v in out.items()]
    elif isinstance(out, (tuple, list)):
        items = [(f"{prefix}_{i}", v) for i, v in enumerate(out)]
    else:
        return [(prefix, out)]
    return [pair for name, value in items for pair in _leaves(value, name)]


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


def prepared(runtime: TorchRuntime, module: nn.Module) -> nn.Module:
    """The module as `runtime` runs it: as built, or with its Linear layers dynamically
    quantised to int8 as a PyTorch user gets an int8 model."""
    if not runtime.quantized:
        return module
    import warnings

    from torch.ao.quantization import quantize_dynamic

    # A copy, quantised in eval mode: the user's module keeps its own modes.
    with warnings.catch_warnings(), eval_mode(module):
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        return quantize_dynamic(module, {nn.Linear}, dtype=torch.qint8, inplace=False)


def precision_context(runtime: TorchRuntime) -> contextlib.AbstractContextManager:
    """What a forward pass runs under: torch.autocast where the runtime asks for it."""
    if runtime.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(runtime.device_type, dtype=DTYPES[runtime.autocast])


def _host_array(tensor: torch.Tensor, autocast: str | None) -> np.ndarray:
    """An output as NumPy. Under autocast an output of the float32 module can come out in the
    autocast dtype (bfloat16, which NumPy lacks): it is returned as float32, the module's own
    type, which holds every bfloat16 value exactly."""
    if autocast is not None and tensor.dtype == DTYPES[autocast]:
        tensor = tensor.float()
    return as_array(tensor)  # a bfloat16 module's outputs stay bfloat16


def own_compile_cache() -> None:
    """torch.compile keeps the code it generates in a cache folder, by default one it leaves
    in the temporary folder for good. Unless the user chose one (TORCHINDUCTOR_CACHE_DIR), it is
    a folder of this process's own, removed as the process ends: tconform leaves nothing behind
    that it did not write, and every run's compile time is a cold one. Inductor's precompiled
    headers ignore the variable (their folder is fixed from the temporary folder as the module is
    imported), so that import sees this folder as the temporary one."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return
    folder = tempfile.mkdtemp(prefix="tconform-inductor-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    temporary, tempfile.tempdir = tempfile.tempdir, folder
    try:
        import torch._inductor.codecache  # noqa: F401
    finally:
        tempfile.tempdir = temporary


class TorchSession(Session):
    def __init__(self, module: nn.Module, target: ModuleTarget, runtime: TorchRuntime) -> None:
        self.module = module
        self.target = target
        self.runtime = runtime
        if runtime.compiled:
            own_compile_cache()
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
            precision_context(self.runtime),
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
