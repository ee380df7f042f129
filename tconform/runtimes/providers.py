"""Execution providers: tconform's short names, what the command line accepts, and whether a
provider really runs here (with ONNX Runtime's own reason when it does not).

ONNX Runtime's GPU build falls back to the CPU silently when a provider cannot load: the session
is created, `get_providers()` simply lacks the requested provider, and the only trace of the
reason is a line that ONNX Runtime's C++ logger writes to stderr. `unavailable_reason` probes each
provider once per process and keeps that line.

These are ONNX Runtime's providers; `--ep` also names the device of the other runtimes (torch
on "cuda", OpenVINO on "cpu"). Adding an execution provider (TensorRT, say) is one entry in
PROVIDERS (plus a row of tolerances in tconform.compare if it brings a new precision); a
different engine altogether, as OpenVINO is, is a runtime of its own (tconform.runtimes).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
import tempfile
from collections.abc import Iterator

import onnxruntime as ort
from onnx import TensorProto, helper

from tconform.errors import UsageError

# tconform's short names for the providers it supports.
PROVIDERS: dict[str, str] = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
}

# Where a provider keeps its tensors, as OrtValue device types (IO binding); a provider not
# listed here is bound through host memory.
DEVICE_TYPES: dict[str, str] = {"cuda": "cuda"}

GRAPH_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}

# The session config entry that makes ONNX Runtime keep the node -> provider assignment.
RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"

# CUDA provider options tconform always sets, so the manifest records them explicitly.
# use_tf32 "0": strict float32 matrix products (the CUDA provider's own default is TF32).
# cudnn_conv_algo_search: ONNX Runtime's default, written down so that a run states it.
CUDA_DEFAULT_OPTIONS: dict[str, str] = {"use_tf32": "0", "cudnn_conv_algo_search": "EXHAUSTIVE"}


def available_eps() -> list[str]:
    """Short names of the supported providers this ONNX Runtime build offers (may still fail
    to load: see `unavailable_reason`)."""
    offered = set(ort.get_available_providers())
    return [short for short, full in PROVIDERS.items() if full in offered]


def parse_eps(spec: str) -> list[str]:
    """'cpu', 'cpu,cuda' or 'all' -> list of short names; unknown names are a usage error.
    'all' means every provider that really runs here: naming a provider is asking for it (and
    its absence is exit 3), 'all' is not."""
    if spec.strip() == "all":
        return [ep for ep in available_eps() if unavailable_reason(ep) is None]
    names = [n.strip().lower() for n in spec.split(",") if n.strip()]
    if not names:
        raise UsageError(f"--ep {spec!r} names no execution provider (e.g. cpu, cpu,cuda, all)")
    for n in names:
        if n == "all":
            raise UsageError(f"--ep {spec!r}: 'all' stands alone (every provider that runs here)")
        if n not in PROVIDERS:
            raise UsageError(
                f"unknown execution provider {n!r}; tconform supports {', '.join(PROVIDERS)} "
                f"(this ONNX Runtime offers {', '.join(available_eps()) or 'none'}) or 'all'"
            )
    return list(dict.fromkeys(names))  # `cpu,cpu` is cpu once, not every row twice


def parse_provider_options(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """['use_tf32=0', 'device_id=1'] -> {'use_tf32': '0', 'device_id': '1'}; a later key wins."""
    options: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value or any(c.isspace() for c in key):
            raise UsageError(f"provider option {item!r} is not KEY=VALUE (e.g. use_tf32=0)")
        options[key] = value
    return options


def short_name(provider: str) -> str:
    for short, full in PROVIDERS.items():
        if full == provider:
            return short
    return provider.removesuffix("ExecutionProvider").lower()


# ---------------------------------------------------------------------------------------------
# Why a provider did not load: ONNX Runtime only logs it, from C++, to file descriptor 2.

_ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Redirect file descriptor 2 (where ONNX Runtime's C++ logger writes) into a temp file;
    the yielded list receives the captured text when the block ends."""
    captured: list[str] = []
    sys.stderr.flush()
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.append(sink.read().decode(errors="replace"))


def reason_from_log(log: str) -> str | None:
    """The line of ONNX Runtime's log that says why a provider did not load, shortened to
    its cause (the missing library, 'no CUDA-capable device is detected', ...)."""
    lines = [_ANSI_COLOUR.sub("", ln).strip() for ln in log.splitlines()]
    lines = [ln for ln in lines if ln]
    for ln in lines:  # "Failed to load library .../libonnxruntime_providers_cuda.so with error: X"
        found = re.search(r"with error: (.+)$", ln)
        if found:
            return found.group(1).strip()
    for ln in lines:  # a CUDA runtime error, e.g. "CUDA failure 100: no CUDA-capable device ..."
        found = re.search(r"(CUDA failure \d+: [^;]+|no CUDA-capable device[^;]*)", ln)
        if found:
            return found.group(1).strip()
    for level in ("[E:", "[W:"):  # otherwise the first error, else warning, without its prefix
        for ln in lines:
            if level in ln:
                message = ln.split("] ", 1)[-1]
                return message.split(" : ")[-1].strip() if " : " in message else message
    return None


def _probe_model() -> bytes:
    """A one-node float model, small enough to build in memory for every probe."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model.SerializeToString()


def load_device_libraries() -> None:
    """In a runtime's worker (docs/versions.md), before its first session on a GPU: let ONNX
    Runtime find the CUDA and cuDNN libraries pip installed (the nvidia-* packages), which
    importing torch loads in tconform's own process. Never in a process that has or may later
    load torch: its own copies must come first, and a second cuDNN of another version breaks
    it (docs/cuda.md). What cannot be found is left to the provider's probe to report."""
    if "torch" not in sys.modules and hasattr(ort, "preload_dlls"):  # ONNX Runtime >= 1.21
        with contextlib.redirect_stdout(io.StringIO()):  # print()s, one per library not found
            ort.preload_dlls()


@functools.cache
def unavailable_reason(ep: str) -> str | None:
    """None when provider `ep` really runs here; otherwise ONNX Runtime's own reason.

    Probed once per process with a one-node model, since loading a provider library can take
    seconds and its outcome does not change while the process lives.
    """
    provider = PROVIDERS[ep]
    if provider not in ort.get_available_providers():
        return f"this ONNX Runtime build ({ort.get_device()}) has no {provider}"
    if provider == "CPUExecutionProvider":
        return None
    with captured_stderr() as log:
        session = ort.InferenceSession(_probe_model(), providers=[provider, "CPUExecutionProvider"])
    if provider in session.get_providers():
        return None
    return reason_from_log(log[0]) or "ONNX Runtime fell back to the CPU and logged no reason"
