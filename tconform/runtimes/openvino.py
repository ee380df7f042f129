"""OpenVINO as a runtime: the exported ONNX files compiled by OpenVINO's CPU plugin.

Why: OpenVINO is a second vendor's compiler for the same files (its own ONNX frontend, graph
rewrites, oneDNN and JIT "snippets" kernels that fuse attention), so a model that passes on ONNX
Runtime but not here points at OpenVINO or at an export that only ONNX Runtime reads kindly.

Precision is the point to watch. The CPU plugin lowers float32 models to bfloat16 by default on
a CPU with AVX512-BF16 or AMX, without a word: the whole model's logits move by ~4e-2. So the
runtime always sets INFERENCE_PRECISION_HINT ("f32" unless `bf16=True` asks for "bf16") and
reports the precision OpenVINO says it will use, read back from the compiled model, never the
one asked for: on a CPU without native bfloat16 (AVX2 only, say) a bf16 request compiles to
float32 and is labelled float32. Each session also counts, from OpenVINO's executed graph
(`compiled.get_runtime_model()`, each node's rt_info), how many nodes computed in which float
precision: that is the evidence of what ran.

`openvino` is an optional dependency (`pip install 'tconform[openvino]'`), imported only when a
runtime is asked for its precision or settings or opens a model; without it every session is
ProviderUnavailable with the reason.
"""

from __future__ import annotations

import functools
import importlib
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tconform.compare import BFLOAT16
from tconform.errors import ProviderUnavailable, RuntimeRejected, UsageError
from tconform.runtimes.base import Runtime, RuntimeOption, Session, TensorInfo, TimedCall, select

# OpenVINO's element type names -> tconform's precision names.
PRECISIONS = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
HINTS = {"float32": "f32", "bfloat16": "bf16"}
# Nodes of the executed graph that compute nothing: constants, parameters and results.
_NOT_EXECUTED = {"Const", "Input", "Output"}
# Compiled-model properties recorded with the settings: those that decide the numbers (precision,
# threads and so the split of reductions, subnormals, dynamic quantization) or say what ran.
RECORDED = (
    "INFERENCE_PRECISION_HINT",
    "EXECUTION_MODE_HINT",
    "PERFORMANCE_HINT",
    "NUM_STREAMS",
    "INFERENCE_NUM_THREADS",
    "ENABLE_CPU_PINNING",
    "ENABLE_HYPER_THREADING",
    "SCHEDULING_CORE_TYPE",
    "CPU_DENORMALS_OPTIMIZATION",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE",
    "KV_CACHE_PRECISION",
    "EXECUTION_DEVICES",
    "RUNTIME_REQUIREMENTS",  # names the instruction set the kernels were built for
)


# The CPU plugin's properties tconform pins, where the release knows them (_known)
PINS = {
    "CPU_DENORMALS_OPTIMIZATION": "NO",  # subnormals kept, as IEEE float32 has them
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",  # no int8 activations (compressed weights)
}


def _openvino() -> Any:
    """The openvino module, or ProviderUnavailable saying how to get it."""
    try:
        import openvino

        if not hasattr(openvino, "Core"):  # 2023.0 keeps Core, Model and its version there
            import openvino.runtime as openvino
    except ImportError as exc:
        raise ProviderUnavailable(
            f"openvino is not installed (pip install 'tconform[openvino]'): {exc}"
        ) from None
    return openvino


@functools.cache
def _core() -> Any:
    """One OpenVINO Core per process; every property goes with each compile, none is set on it."""
    return _openvino().Core()


def reason(exc: BaseException) -> str:
    """OpenVINO's message in one line: its first line that is not a source location, then the
    first ONNX node it names and the first line below that is not a heading (a translation
    error's cause, or a conversion report's summary, lies lines below its first)."""
    noise = ("Exception from ", "Check '", "FrontEnd API failed with", "Shape inference input")
    lines = [line.strip().removeprefix("-- ") for line in str(exc).splitlines()]
    lines = [line for line in lines if line and not line.startswith(noise)]
    if not lines:
        return type(exc).__name__
    node = next((line for line in lines if line.startswith("While validating ONNX node")), "")
    cause = next((line for line in lines[1:] if not line.endswith(":")), "")
    return " ".join(part for part in (lines[0], node, cause) if part)


def _text(value: object) -> object:
    """A compiled-model property as JSON can hold it (OpenVINO's types and enums as text)."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple | set):
        return [_text(v) for v in value]
    get_type_name = getattr(value, "get_type_name", None)  # openvino.Type
    return get_type_name() if callable(get_type_name) else str(value)


def _read_back(compiled: Any) -> dict[str, object]:
    supported = compiled.get_property("SUPPORTED_PROPERTIES")
    return {key: _text(compiled.get_property(key)) for key in RECORDED if key in supported}


def precision_name(hint: object) -> str:
    """tconform's name for an inference precision OpenVINO read back ("f32" -> "float32")."""
    return PRECISIONS.get(str(hint), str(hint))


def _opset() -> Any:
    """An opset module to build the probe with: openvino.opset13 from 2025 on, under
    openvino.runtime before (2023.0 has opset11 at most)."""
    for name in ("openvino.opset13", "openvino.runtime.opset13", "openvino.runtime.opset11"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ProviderUnavailable(f"openvino {_openvino().get_version()}: no opset to build a model")


def _known(device: str, config: dict[str, str], given: Iterable[str] = ()) -> dict[str, str]:
    """`config` without those of tconform's pins (PINS) that this release's device does not
    know: an older OpenVINO (2023) has no dynamic quantization to turn off, so that key is left
    out rather than failing every compile. Every other property, and every key the user `given`
    (a pin's key among them), is passed as given: what a user asks for is never dropped."""
    supported = set(_core().get_property(device, "SUPPORTED_PROPERTIES"))
    kept = set(given) | supported
    return {key: value for key, value in config.items() if key not in PINS or key in kept}


@functools.cache
def _probe(
    device: str, config: tuple[tuple[str, str], ...], given: tuple[str, ...] = ()
) -> dict[str, object]:
    """What OpenVINO makes of `config` on `device`, from a one-MatMul model compiled with it:
    the compiled properties, the device's name and capabilities. ProviderUnavailable when the
    device cannot compile anything."""
    ov = _openvino()
    ops = _opset()
    x = ops.parameter([1, 8], np.float32, name="x")
    y = ops.matmul(x, ops.constant(np.ones((8, 8), np.float32)), False, False)
    try:
        compiled = _core().compile_model(
            ov.Model([y], [x], "probe"), device, _known(device, dict(config), given)
        )
    except Exception as exc:  # OpenVINO raises RuntimeError for everything
        raise ProviderUnavailable(f"{device.lower()}: {reason(exc)}") from None
    core = _core()
    return {
        "openvino": ov.get_version(),
        "full_device_name": _text(core.get_property(device, "FULL_DEVICE_NAME")),
        "optimization_capabilities": _text(core.get_property(device, "OPTIMIZATION_CAPABILITIES")),
        "read_back": _read_back(compiled),
    }


@dataclass
class OpenVinoRuntime(Runtime):
    """Compiles ONNX files on one OpenVINO device with pinned, recorded properties."""

    name: ClassVar[str] = "openvino"
    consumes: ClassVar[str] = "onnx"
    eps: ClassVar[tuple[str, ...]] = ("cpu",)
    package: ClassVar[str] = "openvino"  # on the package index (`--runtime openvino==X`)
    options: ClassVar[tuple[RuntimeOption, ...]] = (
        RuntimeOption(
            "bf16",
            "--bf16",
            "Allow bfloat16 inference where a runtime has it (OpenVINO), own tolerance row.",
        ),
    )

    ep: str = "cpu"  # the OpenVINO device, lower case ("cpu" is OpenVINO's "CPU")
    bf16: bool = False  # ask for INFERENCE_PRECISION_HINT bf16 (what is used is read back)
    threads: int = 0  # INFERENCE_NUM_THREADS; 0: OpenVINO's default (one per physical core)
    properties: dict[str, str] = field(default_factory=dict)  # raw compile properties; they win

    @property
    def device(self) -> str:
        return self.ep.upper()

    @property
    def hint(self) -> str:
        """The INFERENCE_PRECISION_HINT asked for."""
        return "bf16" if self.bf16 else "f32"

    def config(self) -> dict[str, str]:
        """The properties every compile gets: tconform's pins, then the raw ones."""
        config = {
            "INFERENCE_PRECISION_HINT": self.hint,
            "PERFORMANCE_HINT": "LATENCY",  # one stream: one request uses every thread
            **PINS,
        }
        if self.device != "CPU":  # the pins are the CPU plugin's
            config = {"INFERENCE_PRECISION_HINT": self.hint, "PERFORMANCE_HINT": "LATENCY"}
        if self.threads:
            config["INFERENCE_NUM_THREADS"] = str(self.threads)
        return {**config, **self.properties}

    def probe(self) -> dict[str, object]:
        """OpenVINO's version, the device and the properties it compiles with (cached);
        ProviderUnavailable without OpenVINO or the device."""
        return _probe(
            self.device, tuple(sorted(self.config().items())), tuple(sorted(self.properties))
        )

    @property
    def precision(self) -> str:
        """The precision OpenVINO reads back for this configuration ("float32" where a bf16
        request meets a CPU without native bfloat16). Where OpenVINO cannot answer (not
        installed, no such device) nothing runs, and this is the precision asked for."""
        try:
            read_back = self.probe()["read_back"]
        except ProviderUnavailable:
            return "bfloat16" if self.bf16 else "float32"
        return precision_name(read_back.get("INFERENCE_PRECISION_HINT", self.hint))

    def settings(self) -> dict[str, object]:
        """Everything that decides how a session runs, for the run manifest."""
        settings: dict[str, object] = {
            "ep": self.ep,
            "device": self.device,
            "inference_precision_asked": self.hint,
            "config": self.config(),
        }
        try:
            probe = self.probe()
        except ProviderUnavailable as exc:
            return {**settings, "unavailable": str(exc)}
        read_back = dict(probe["read_back"])
        return {
            **settings,
            "inference_precision_read_back": read_back.get("INFERENCE_PRECISION_HINT"),
            "precision": self.precision,
            "openvino": probe["openvino"],
            "full_device_name": probe["full_device_name"],
            "optimization_capabilities": probe["optimization_capabilities"],
            "num_streams": read_back.get("NUM_STREAMS"),
            "inference_num_threads": read_back.get("INFERENCE_NUM_THREADS"),
            "compiled_properties": read_back,
        }

    def open(self, model_path: Path) -> OpenVinoSession:
        """The model compiled on this runtime's device: ProviderUnavailable without OpenVINO or
        the device, UsageError (one line) for a file OpenVINO cannot read as ONNX, and
        RuntimeRejected for a model it reads but cannot convert or compile (its failure)."""
        self.probe()  # the device works: a failure below is the model's
        from openvino.frontend import FrontEndManager

        started = time.perf_counter()
        frontend = FrontEndManager().load_by_framework("onnx")  # no guessing at the format
        try:
            loaded = frontend.load(str(model_path))
        except Exception as exc:
            raise UsageError(f"{model_path}: OpenVINO cannot read it: {reason(exc)}") from None
        try:
            model = frontend.convert(loaded)
            compiled = _core().compile_model(
                model, self.device, _known(self.device, self.config(), self.properties)
            )
        except Exception as exc:
            raise RuntimeRejected(f"OpenVINO cannot convert or compile it: {reason(exc)}") from None
        session = OpenVinoSession(compiled, round(time.perf_counter() - started, 3))
        if self.bf16 and session.precision != "bfloat16":
            session.notes.append(
                f"bf16 asked; OpenVINO compiled {session.precision} (no native bfloat16 on "
                "this CPU): judged by the float32 row"
            )
        return session


def _compute_precision(info: dict[str, str]) -> str | None:
    """The float precision an executed node computed in, or None for integer and bool nodes.

    runtimePrecision is OpenVINO's word, except for fused "Subgraph" nodes, which report the
    precision of one of their inputs (u8 for an attention block's mask); for a node whose
    outputs are floats the kernel's name (jit_avx2_f32, brgemm_avx512_amx_bf16...) says."""
    runtime = info.get("runtimePrecision", "")
    if runtime in PRECISIONS:
        return PRECISIONS[runtime]
    outputs = [p for p in info.get("outputPrecisions", "").split(",") if p in PRECISIONS]
    if not outputs:
        return None
    kernel = info.get("primitiveType", "")
    named = [p for p in PRECISIONS if kernel.endswith(f"_{p}") or f"_{p}_" in kernel]
    return PRECISIONS[named[0] if named else outputs[0]]


def executed_graph(compiled: Any) -> tuple[int, dict[str, int], dict[str, dict[str, int]]]:
    """(executed nodes, {precision: nodes}, {layer type: {precision: nodes}}) of OpenVINO's
    executed graph; constants, parameters and results are not executed nodes."""
    count = 0
    precisions: Counter[str] = Counter()
    by_layer: dict[str, Counter[str]] = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = {key: value.astype(str) for key, value in op.get_rt_info().items()}
        layer = info.get("layerType", op.get_type_name())
        if layer in _NOT_EXECUTED:
            continue
        count += 1
        precision = _compute_precision(info)
        if precision is not None:
            precisions[precision] += 1
            by_layer.setdefault(layer, Counter())[precision] += 1
    return count, dict(precisions), {k: dict(v) for k, v in sorted(by_layer.items())}


class OpenVinoSession(Session):
    """One compiled model and what OpenVINO says of it. Feeds come checked by the execution
    layer: every input present, of its declared type and rank (OpenVINO itself would convert a
    wrong type silently and, for a missing input, reuse the previous run's tensor)."""

    def __init__(self, compiled: Any, compile_seconds: float = 0.0) -> None:
        properties = _read_back(compiled)
        devices = [str(d) for d in properties.get("EXECUTION_DEVICES", [])]
        count, precisions, by_layer = executed_graph(compiled)
        self.compiled = compiled
        # Read back from the compiled model: float32 or bfloat16, whatever was asked.
        self.precision = precision_name(properties.get("INFERENCE_PRECISION_HINT"))
        self.providers = devices  # EXECUTION_DEVICES, as OpenVINO reports them
        self.inputs = [
            TensorInfo(
                port.get_any_name(),
                numpy_type(port.get_element_type()),
                port.get_partial_shape().rank.get_length()
                if port.get_partial_shape().rank.is_static
                else None,
            )
            for port in compiled.inputs
        ]
        self.outputs = [port.get_any_name() for port in compiled.outputs]
        self.placement = {device.lower(): count for device in devices[:1]}  # executed nodes
        self.fallback_ops: dict[str, int] = {}  # none: one device runs every node
        self.node_precisions = precisions  # float32/bfloat16 -> executed nodes
        self.layer_precisions = by_layer  # by layer type
        self.properties = properties  # read back, see RECORDED
        self.compile_seconds = compile_seconds  # ONNX frontend + compile
        self.notes: list[str] = []
        if set(precisions) - {"float32"}:  # the evidence of a reduced precision, where it ran
            counts = ", ".join(f"{p} {n}" for p, n in sorted(precisions.items()))
            self.notes.append(f"OpenVINO executed nodes by precision: {counts}")
        self._lock = threading.Lock()

    def timed_call(self, feeds: Mapping[str, np.ndarray], io_binding: bool = False) -> TimedCall:
        """A run on fixed feeds, for bench; its details say what ran: the precision read back
        and the executed nodes by the precision they computed in (a bench row's evidence)."""
        call = super().timed_call(feeds, io_binding)
        call.details.update(
            precision=self.precision,
            node_precisions=dict(self.node_precisions),
            layer_precisions={k: dict(v) for k, v in self.layer_precisions.items()},
        )
        return call

    def _infer(self, ordered: dict) -> Any:
        """One inference with outputs copied out of the request (its buffers are reused by the
        next run); OpenVINO 2023.0 has no share_outputs, and copies them always."""
        try:
            return self.compiled(ordered, share_outputs=False)
        except TypeError as exc:
            if "share_outputs" not in str(exc):
                raise
            return self.compiled(ordered)

    def run(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """The outputs in the model's order, or those named (copies: a later run leaves them
        alone). OpenVINO computes every output either way."""
        ordered = {info.name: _tensor(np.asarray(feeds[info.name])) for info in self.inputs}
        with self._lock:  # the compiled model's own infer request serves one run at a time
            try:
                result = self._infer(ordered)
            except Exception as exc:
                raise UsageError(f"OpenVINO cannot run it: {reason(exc)}") from None
            values = [
                _array(result[i], port.get_element_type())
                for i, port in enumerate(self.compiled.outputs)
            ]
        return select(self.outputs, values, outputs)


def numpy_type(element_type: Any) -> np.dtype:
    """The NumPy type of an OpenVINO element type. OpenVINO's own `to_dtype` gives float16 for
    bf16 (the same 2 bytes, other bits): bfloat16 is ml_dtypes' type, as ONNX's tools use."""
    if str(element_type.get_type_name()) == "bf16":
        return BFLOAT16
    return np.dtype(element_type.to_dtype())


def _tensor(value: np.ndarray) -> Any:
    """A feed as OpenVINO takes it: a bfloat16 array as a bf16 tensor of the same bits (OpenVINO
    knows no ml_dtypes type), anything else as it is."""
    if value.dtype != BFLOAT16:
        return value
    import openvino as ov

    tensor = ov.Tensor(ov.Type.bf16, list(value.shape))
    np.copyto(tensor.data.view(np.uint16), np.ascontiguousarray(value).view(np.uint16))
    return tensor


def _array(value: Any, element_type: Any) -> np.ndarray:
    """An output as NumPy: a bf16 output's bits read as bfloat16 (OpenVINO hands them over as
    float16 or uint16)."""
    array = np.asarray(value)
    if numpy_type(element_type) == BFLOAT16:
        return array.view(np.uint16).view(BFLOAT16)
    return array
