"""ONNX Runtime sessions on one execution provider, with the placement checked.

A session that ONNX Runtime silently moved to the CPU is refused (ProviderUnavailable, carrying
ONNX Runtime's logged reason, see tconform.runtimes.providers), so it can never be reported as
that provider's pass.

Every session records which provider each node of the optimised graph was assigned to
(ONNX Runtime >= 1.24: session config "session.record_ep_graph_assignment_info" = "1", read back
with `InferenceSession.get_provider_graph_assignment_info()`), so a CUDA result can say how many
nodes really ran on the GPU and which op types were left to the CPU.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto

from tconform.compare import BFLOAT16
from tconform.errors import (
    KernelMissing,
    ProviderUnavailable,
    RuntimeRejected,
    RuntimeTooOld,
    TconformError,
    UsageError,
    first_line,
)
from tconform.runtimes.base import Runtime, RuntimeOption, Session, TensorInfo, TimedCall
from tconform.runtimes.providers import (
    CUDA_DEFAULT_OPTIONS,
    DEVICE_TYPES,
    GRAPH_OPT_LEVELS,
    PROVIDERS,
    RECORD_ASSIGNMENT,
    captured_stderr,
    reason_from_log,
    short_name,
    unavailable_reason,
)

# Copy nodes the CUDA provider inserts between host and device; they belong to the provider.
_COPY_OPS = {"MemcpyToHost", "MemcpyFromHost"}
# Session config: "1" flushes subnormal floats to zero (see OrtRuntime.match_calling_thread).
DENORMAL_AS_ZERO = "session.set_denormal_as_zero"
# Session config: "1" lets the intra-op threads busy-wait between kernels.
SPINNING = "session.intra_op.allow_spinning"
# The graph transformer that fuses Add + LayerNormalization into SkipLayerNormalization.
SKIP_LAYER_NORM_FUSION = "SkipLayerNormFusion"


@dataclass
class OrtRuntime(Runtime):
    """Creates sessions on one provider with recorded settings."""

    name: ClassVar[str] = "onnxruntime"
    consumes: ClassVar[str] = "onnx"
    eps: ClassVar[tuple[str, ...]] = tuple(PROVIDERS)
    package: ClassVar[str] = "onnxruntime"  # on the package index (`--runtime onnxruntime==X`)
    options: ClassVar[tuple[RuntimeOption, ...]] = (
        RuntimeOption(
            "tf32", "--tf32", "Allow TF32 matrix products on CUDA (own tolerance).", eps=("cuda",)
        ),
        RuntimeOption("device_id", "--device-id", "CUDA device [0].", int, (0, 1023), ("cuda",)),
        RuntimeOption(
            "provider_options",
            "--provider-option",
            "Passed to the provider (repeatable), e.g. cudnn_conv_algo_search=DEFAULT; one it does "
            "not take is refused (the CPU provider takes none).",
            dict,
        ),
        RuntimeOption(
            "graph_opt",
            "--graph-opt",
            "ONNX Runtime graph-optimisation level [all] (`verify --matrix` takes several "
            "with --graph-opts).",
            tuple(GRAPH_OPT_LEVELS),
        ),
        RuntimeOption(
            "spinning",
            "--spinning",
            "Let ONNX Runtime's intra-op threads busy-wait between kernels "
            f"({SPINNING}) [ONNX Runtime's default: on, bench's too; --no-spinning on a shared "
            "machine].",
        ),
        RuntimeOption(
            "flush_denormals",
            "--flush-denormals",
            f"Let ONNX Runtime flush subnormal floats to zero ({DENORMAL_AS_ZERO}) [ONNX "
            "Runtime's default: off; bench: on, they slow its matrix products on some CPUs "
            "(docs/performance.md)].",
        ),
        RuntimeOption(
            "skip_layer_norm_fusion",
            "--skip-layer-norm-fusion",
            "Let ONNX Runtime fuse Add + LayerNormalization into SkipLayerNormalization [ONNX "
            "Runtime's default: on; bench on the CPU provider: off, its kernel measured slower "
            "than the two it replaces (docs/performance.md)].",
        ),
    )

    ep: str = "cpu"
    graph_opt: str = "all"
    threads: int = 0  # intra-op threads; 0: ONNX Runtime's default (one per physical core)
    provider_options: dict[str, str] = field(default_factory=dict)  # raw, from the CLI
    tf32: bool = False  # CUDA only: allow TF32 matrix products
    device_id: int = 0  # CUDA only
    # None: ONNX Runtime's own default (a command may choose its own: bench's)
    spinning: bool | None = None
    flush_denormals: bool | None = None
    skip_layer_norm_fusion: bool | None = None
    # Raw session config entries (SessionOptions.add_session_config_entry; they win) and
    # graph transformers not to run (InferenceSession's disabled_optimizers), for scripts
    session_config: dict[str, str] = field(default_factory=dict)
    disabled_optimizers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Provider options are checked where the runtime is made, before any export or run
        # (each command, the Python API and a worker alike); an unavailable provider's rows
        # say so instead, with nothing opened to ask.
        if self.provider_options and unavailable_reason(self.ep) is None:
            try:
                probe = self.gather_session("tensor(float)", 0)
            except Exception as exc:  # ORT raises its own exception types
                raise UsageError(
                    f"--provider-option: {self.provider} refuses "
                    f"{', '.join(f'{k}={v}' for k, v in self.provider_options.items())}: "
                    f"{first_line(exc)}"
                ) from None
            self.require_options_taken(probe)

    @property
    def provider(self) -> str:
        return PROVIDERS[self.ep]

    def final_provider_options(self) -> dict[str, str]:
        """The options handed to the provider: tconform's explicit defaults, then the raw
        options from the command line (which win)."""
        if self.ep != "cuda":
            return dict(self.provider_options)
        options = {
            "device_id": str(self.device_id),
            **CUDA_DEFAULT_OPTIONS,
            "use_tf32": "1" if self.tf32 else "0",
        }
        return {**options, **self.provider_options}

    @property
    def device_memory(self) -> bool:
        """Whether the provider keeps tensors in memory of its own (IO binding pays there)."""
        return self.ep in DEVICE_TYPES

    @property
    def precision(self) -> str:
        """'tf32' when the CUDA provider may use TF32 matrix products, else 'float32'."""
        uses_tf32 = self.ep == "cuda" and self.final_provider_options().get("use_tf32") == "1"
        return "tf32" if uses_tf32 else "float32"

    def settings(self) -> dict[str, object]:
        """Everything that decides how a session runs, for the run manifest."""
        return {
            "ep": self.ep,
            "provider": self.provider,
            "provider_options": self.final_provider_options(),
            "precision": self.precision,
            "graph_optimization": self.graph_opt,
            "intra_op_threads": self.threads,
            "session_config": self.config_entries(),
            "disabled_optimizers": list(self.disabled()),
            "onnxruntime": ort.__version__,
        }

    def config_entries(self) -> dict[str, str]:
        """The session config entries: the options' where they are given, then the raw ones."""
        entries = {}
        for key, given in ((SPINNING, self.spinning), (DENORMAL_AS_ZERO, self.flush_denormals)):
            if given is not None:
                entries[key] = "1" if given else "0"
        return {**entries, **self.session_config}

    def disabled(self) -> tuple[str, ...]:
        """The graph transformers not to run: the raw ones, and the fusion where it is off."""
        unfused = (SKIP_LAYER_NORM_FUSION,) if self.skip_layer_norm_fusion is False else ()
        return tuple(dict.fromkeys((*self.disabled_optimizers, *unfused)))

    def session_options(self, profile_prefix: str | None = None) -> ort.SessionOptions:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = GRAPH_OPT_LEVELS[self.graph_opt]
        opts.intra_op_num_threads = self.threads
        opts.log_severity_level = 3  # errors only; fallbacks are detected from get_providers()
        opts.add_session_config_entry(RECORD_ASSIGNMENT, "1")
        for key, value in self.config_entries().items():
            opts.add_session_config_entry(key, value)
        if profile_prefix is not None:
            opts.enable_profiling = True
            opts.profile_file_prefix = profile_prefix
        return opts

    def open(self, model_path: Path, profile_prefix: str | None = None) -> OrtSession:
        """A session on this runtime's provider, or ProviderUnavailable with ONNX Runtime's
        reason; KernelMissing when the provider lacks a kernel; UsageError for a bad file.
        `profile_prefix`: write ONNX Runtime's profile there (OrtSession.op_profile)."""
        known_reason = unavailable_reason(self.ep)  # probed once: no failed load per model
        if known_reason is not None:
            raise ProviderUnavailable(f"{self.ep}: {known_reason}")
        providers: list = [(self.provider, self.final_provider_options())]
        if self.provider != "CPUExecutionProvider":
            providers.append("CPUExecutionProvider")
        with captured_stderr() as log:
            try:
                session = ort.InferenceSession(
                    str(model_path),
                    self.session_options(profile_prefix),
                    providers=providers,
                    disabled_optimizers=list(self.disabled()),
                )
            except Exception as exc:  # ORT raises its own exception types
                session, error = None, exc
        if session is None:
            raise self._load_error(model_path, error)
        actual = session.get_providers()
        if self.provider not in actual:
            reason = reason_from_log(log[0]) or unavailable_reason(self.ep) or "no reason logged"
            raise ProviderUnavailable(
                f"{self.ep}: {reason} (ONNX Runtime ran the session on {', '.join(actual)} only)"
            )
        self.match_calling_thread()
        placement, fallback_ops = assignment(session, self.provider)
        device = (DEVICE_TYPES.get(self.ep, "cpu"), self.device_id)
        opened = OrtSession(
            session, self, model_path, actual, placement, fallback_ops, device, self.precision
        )
        if not hasattr(session, "get_provider_graph_assignment_info"):  # a release before 1.24
            opened.notes.append(
                f"ONNX Runtime {ort.__version__} records no node placement (1.24 and later do): "
                "nodes per provider and CPU fallbacks unknown"
            )
        return opened

    def require_options_taken(self, session: ort.InferenceSession) -> None:
        """A --provider-option the provider does not know is dropped by ONNX Runtime without
        a word (the CPU provider takes none); recorded as given, it would claim a setting that
        never applied: one line naming it instead."""
        taken = session.get_provider_options().get(self.provider, {})
        for key in self.provider_options:
            if key not in taken:
                raise UsageError(
                    f"--provider-option {key}: {self.provider} does not take it (it takes "
                    f"{', '.join(sorted(taken)) or 'no option'})"
                )

    def gather_session(self, data_type: str, axis: int) -> ort.InferenceSession:
        """A one-node Gather model (`taken = Gather(data, indices, axis)`) for tensors of ONNX
        Runtime type `data_type` (e.g. "tensor(float)"), on this runtime's provider."""
        elem = {v: k for k, v in _ORT_TYPES.items()}[data_type]
        node = onnx.helper.make_node("Gather", ["data", "indices"], ["taken"], axis=axis)
        graph = onnx.helper.make_graph(
            [node],
            "gather",
            [
                onnx.helper.make_tensor_value_info("data", elem, None),
                onnx.helper.make_tensor_value_info("indices", TensorProto.INT64, [None]),
            ],
            [onnx.helper.make_tensor_value_info("taken", elem, None)],
        )
        model = onnx.helper.make_model(
            graph, opset_imports=[onnx.helper.make_opsetid("", 13)], ir_version=8
        )
        providers: list = [(self.provider, self.final_provider_options())]
        return ort.InferenceSession(
            model.SerializeToString(), self.session_options(), providers=providers
        )

    def match_calling_thread(self) -> None:
        """Set this thread's subnormal flags as the session config asks, where it names them.

        ONNX Runtime sets its worker threads for every session, but the calling thread, which
        runs a share of every kernel, only for the first session of a process: without this a
        session's speed and bits would depend on which session came first."""
        entries = self.config_entries()
        if DENORMAL_AS_ZERO in entries:
            try:
                import torch  # its set_flush_denormal sets the same two flags (FTZ and DAZ)
            except ImportError:  # a worker's environment (tconform.runtimes.remote): a fresh
                return  # process, whose first session ONNX Runtime sets the thread for
            torch.set_flush_denormal(entries[DENORMAL_AS_ZERO] == "1")

    def _load_error(self, model_path: Path, exc: Exception) -> TconformError:
        text = str(exc).strip()
        missing = re.search(r"Could not find an implementation for (\w+)\(", text)
        if missing:
            provider = f"ONNX Runtime's {self.ep.upper()} provider"
            return KernelMissing(provider, missing.group(1), model_dtype(model_path))
        too_new = re.search(
            r"Unsupported model IR version: (\d+), max supported IR version: (\d+)", text
        )
        if too_new:
            return RuntimeTooOld(
                f"ONNX Runtime {ort.__version__} reads IR version {too_new.group(2)} at most; "
                f"{model_path.name} is IR version {too_new.group(1)} (a newer release reads it)"
            )
        first = without_location(text.splitlines()[0]) if text else type(exc).__name__
        if type(exc).__name__ in NOT_A_MODEL:  # the file is not one: the user's to fix
            return UsageError(f"{model_path}: ONNX Runtime cannot load it: {first}")
        # a model ONNX reads that this release rejects (its graph checks, an op it lacks)
        return RuntimeRejected(f"ONNX Runtime {ort.__version__} cannot load it: {first}")


# ONNX Runtime's exceptions for a file that is no model at all; any other error loading a file
# onnx's checker accepted is the release rejecting a model (tconform.errors.RuntimeRejected).
NOT_A_MODEL = frozenset({"InvalidProtobuf", "NoSuchFile", "NoModel"})
# "/onnxruntime_src/.../model.cc:256 onnxruntime::Model::Model(...) ": where in its source
SOURCE_LOCATION = re.compile(r"\S+\.(?:cc|cpp|h):\d+ .*?\) (?=[A-Z])")


def without_location(line: str) -> str:
    """ONNX Runtime's error line without the source file and function it was raised in."""
    return SOURCE_LOCATION.sub("", line, count=1).strip()


def model_dtype(model_path: Path) -> str:
    """The element type of the model's first floating-point input or output ('float16', ...)."""
    names = {
        TensorProto.FLOAT: "float32",
        TensorProto.FLOAT16: "float16",
        TensorProto.BFLOAT16: "bfloat16",
        TensorProto.DOUBLE: "float64",
    }
    try:
        graph = onnx.load(str(model_path), load_external_data=False).graph
    except Exception:
        return "this element type's"
    for value in (*graph.input, *graph.output):
        elem_type = value.type.tensor_type.elem_type
        if elem_type in names:
            return names[elem_type]
    return "this element type's"


def assignment(
    session: ort.InferenceSession, requested: str
) -> tuple[dict[str, int], dict[str, int]]:
    """(placement, fallback_ops) from ONNX Runtime's record of the optimised graph.

    placement: {provider short name: node count}. fallback_ops: {op type: count} of nodes that
    ran on the CPU although another provider was requested (empty for CPU sessions).
    """
    placement: Counter[str] = Counter()
    fallback_ops: Counter[str] = Counter()
    if not hasattr(session, "get_provider_graph_assignment_info"):  # before 1.24: no record
        return {}, {}
    for subgraph in session.get_provider_graph_assignment_info():
        nodes = subgraph.get_nodes()
        placement[short_name(subgraph.ep_name)] += len(nodes)
        if subgraph.ep_name == "CPUExecutionProvider" and requested != "CPUExecutionProvider":
            fallback_ops.update(n.op_type for n in nodes if n.op_type not in _COPY_OPS)
    return dict(placement), dict(fallback_ops)


def quiet_run() -> ort.RunOptions:
    """Run options that keep ONNX Runtime's own log of a failing kernel off stderr: the error
    comes back as the exception, which the result reports in one line."""
    options = ort.RunOptions()
    options.log_severity_level = 4  # fatal only
    return options


# ONNX Runtime's declared input types -> the NumPy types it takes.
_NUMPY_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(bfloat16)": BFLOAT16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


# ONNX element types of the tensors a cache holds -> ONNX Runtime's names of them.
_ORT_TYPES = {
    TensorProto.FLOAT: "tensor(float)",
    TensorProto.FLOAT16: "tensor(float16)",
    TensorProto.BFLOAT16: "tensor(bfloat16)",
    TensorProto.DOUBLE: "tensor(double)",
}


def _declared(value) -> TensorInfo:
    numpy_type = _NUMPY_TYPES.get(value.type)
    shape = value.shape
    if not isinstance(shape, list):
        return TensorInfo(value.name, np.dtype(numpy_type) if numpy_type is not None else None)
    return TensorInfo(
        value.name,
        np.dtype(numpy_type) if numpy_type is not None else None,
        len(shape),
        tuple(dim if isinstance(dim, int) else None for dim in shape),
    )


class OrtSession(Session):
    """One InferenceSession and what ONNX Runtime says of it."""

    def __init__(
        self,
        session: ort.InferenceSession,
        runtime: OrtRuntime,
        model_path: Path,
        providers: list[str],
        placement: dict[str, int],
        fallback_ops: dict[str, int],
        device: tuple[str, int],
        precision: str,
    ) -> None:
        self.session = session
        self.runtime = runtime
        self.model_path = model_path
        self.providers = providers  # get_providers(): what ONNX Runtime really registered
        self.placement = placement  # provider short name -> nodes
        self.fallback_ops = fallback_ops  # op type -> nodes left on the CPU
        self.device = device  # OrtValue device type and id of the provider
        self.precision = precision
        self.inputs = [_declared(i) for i in session.get_inputs()]
        self.outputs = [o.name for o in session.get_outputs()]
        # Outputs NumPy cannot receive from session.run (a bfloat16 model fed integer ids)
        self._bfloat16_outputs = any(o.type == "tensor(bfloat16)" for o in session.get_outputs())
        self.notes: list[str] = []
        self._gathers: dict[tuple[str, int], ort.InferenceSession] = {}  # see `take`

    def run(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        wanted = list(outputs) if outputs else self.outputs
        if self._bfloat16_outputs or any(np.asarray(v).dtype == BFLOAT16 for v in feeds.values()):
            values = self._run_bfloat16(feeds, wanted)
        else:
            values = self.session.run(wanted, dict(feeds), quiet_run())
        return dict(zip(wanted, values, strict=True))

    def _run_bfloat16(self, feeds: Mapping[str, np.ndarray], wanted: list[str]) -> list[np.ndarray]:
        """ONNX Runtime's Python API takes no ml_dtypes array and returns no bfloat16 one:
        bfloat16 tensors go in and come out as OrtValues of the same bits."""
        values = {}
        for name, value in feeds.items():
            array = np.ascontiguousarray(value)
            if array.dtype == BFLOAT16:
                values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    array.view(np.uint16), TensorProto.BFLOAT16
                )
            else:
                values[name] = ort.OrtValue.ortvalue_from_numpy(array)
        results = self.session.run_with_ort_values(wanted, values, quiet_run())
        return [
            _bfloat16_array(r) if r.data_type() == "tensor(bfloat16)" else r.numpy()
            for r in results
        ]

    def run_bound(
        self, feeds: Mapping[str, np.ndarray | ort.OrtValue], keep: Collection[str]
    ) -> dict[str, np.ndarray | ort.OrtValue]:
        """One run with IO binding: OrtValue feeds are taken where they lie, the outputs named in
        `keep` stay on the provider's device as OrtValues (so a later run takes them without a
        host round trip), the others come back as NumPy arrays."""
        binding = self.session.io_binding()
        for name, value in feeds.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in self.outputs:
            binding.bind_output(name, *(self.device if name in keep else ("cpu", 0)))
        self.session.run_with_iobinding(binding, quiet_run())
        values = binding.get_outputs()
        return {
            name: value if name in keep else value.numpy()
            for name, value in zip(self.outputs, values, strict=True)
        }

    def to_device(self, array: np.ndarray) -> ort.OrtValue:
        """`array` copied to the provider's device, ready to be bound as an input."""
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), *self.device)

    def take(self, value: object, rows: np.ndarray, axis: int) -> object:
        """An OrtValue gathered where it lies, by a one-node Gather model on this session's
        provider (so a CUDA cache never crosses to the host); NumPy arrays as on the host."""
        if not isinstance(value, ort.OrtValue):
            return super().take(value, rows, axis)
        key = (value.data_type(), axis)
        if key not in self._gathers:
            self._gathers[key] = self.runtime.gather_session(value.data_type(), axis)
        gather = self._gathers[key]
        binding = gather.io_binding()
        binding.bind_ortvalue_input("data", value)
        binding.bind_cpu_input("indices", np.ascontiguousarray(rows, dtype=np.int64))
        binding.bind_output("taken", *self.device)
        gather.run_with_iobinding(binding, quiet_run())
        return binding.get_outputs()[0]

    def timed_call(self, feeds: Mapping[str, np.ndarray], io_binding: bool = False) -> TimedCall:
        """Without IO binding each run copies inputs in and outputs back as NumPy, as a plain
        session.run does; with it (a provider with device memory) the inputs are copied to the
        device once, the outputs stay there, and each run waits for the device."""
        details: dict[str, object] = {"placement": self.placement, "io_binding": io_binding}
        memory = _cuda_used_mb_probe(self.runtime.ep)
        if not io_binding:
            fixed = dict(feeds)
            return TimedCall(
                lambda: self.session.run(None, fixed), device_memory_mb=memory, details=details
            )
        binding = self.session.io_binding()
        for name, array in feeds.items():  # the binding holds its own reference to each
            binding.bind_ortvalue_input(name, self.to_device(array))
        for name in self.outputs:
            binding.bind_output(name, *self.device)
        binding.synchronize_inputs()

        def run() -> None:
            self.session.run_with_iobinding(binding)
            binding.synchronize_outputs()

        return TimedCall(run, binding.clear_binding_outputs, memory, details)

    def op_profile(self, feeds: Mapping[str, np.ndarray], runs: int = 3) -> dict[str, float]:
        """Kernel milliseconds per run, per op type, from ONNX Runtime's own profile of this
        model with this session's settings (a second, profiling session; one warm-up run left
        out of the totals)."""
        with tempfile.TemporaryDirectory() as tmp:
            profiling = self.runtime.open(self.model_path, profile_prefix=str(Path(tmp) / "p"))
            for _ in range(1 + runs):
                profiling.session.run(None, dict(feeds))
            events = json.loads(Path(profiling.session.end_profiling()).read_text())
        totals = kernel_time_by_op_type(events, skip_runs=1)
        return {op: us / runs / 1e3 for op, us in totals.items()}


def _bfloat16_array(value: ort.OrtValue) -> np.ndarray:
    """A host OrtValue of bfloat16 copied out as a NumPy bfloat16 array."""
    import ctypes

    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    buffer = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.ctypeslib.as_array(buffer).copy().view(BFLOAT16).reshape(shape)


def kernel_time_by_op_type(events: list[dict], skip_runs: int = 0) -> dict[str, float]:
    """Total kernel microseconds per op type from ONNX Runtime's profile events, leaving out
    the kernels of the first `skip_runs` runs (the warm-up, which allocates and is slower)."""
    starts = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    since = starts[skip_runs] if 0 < skip_runs < len(starts) else float("-inf")
    totals: Counter[str] = Counter()
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        if event.get("ts", 0) >= since:
            totals[event.get("args", {}).get("op_name", "?")] += float(event.get("dur", 0))
    return dict(totals)


def _cuda_used_mb_probe(ep: str):
    """Device memory in use (total - free, whole device) for CUDA runs, read after the runs.
    ONNX Runtime's arena is outside torch's allocator, so this is the only shared measure
    (none in a worker's environment without torch)."""
    if ep != "cuda":
        return lambda: None
    try:
        import torch
    except ImportError:
        return lambda: None
    if not torch.cuda.is_available():
        return lambda: None

    def used_mb() -> float:
        free, total = torch.cuda.mem_get_info()
        return (total - free) / 2**20

    return used_mb
