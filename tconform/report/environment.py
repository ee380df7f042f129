"""The environment block, the same in every report (verify, doc, check and bench JSON, and JUnit
`<properties>`): where a result was obtained, precisely enough to compare with another machine."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from tconform.versions import cpu_name, library_versions, package_version

# The instruction sets that decide float32 GEMM speed and summation order on x86 and Arm.
_ISA_FLAGS = (
    "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_bf16", "asimd", "sve",
)  # fmt: skip


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def instruction_sets() -> list[str]:
    """The relevant CPU flags from /proc/cpuinfo (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    flags = set(line.split(":", 1)[1].split())
                    return [f for f in _ISA_FLAGS if f in flags]
    except OSError:
        pass
    return []


def git_commit() -> str | None:
    """The commit of the tconform source tree, when it is a git checkout."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def _temporaries_refused() -> str:
    """Why no provider may be probed here ('' where one may): a probe's log goes to a temporary
    file, and the temporary folder lies in one tconform keeps (the run's own error, in the
    report beside, names the variable)."""
    from tconform.errors import UsageError
    from tconform.folders import require_caches_apart

    try:
        require_caches_apart()
    except UsageError:
        return "not probed: the temporary folder is refused"
    return ""


def providers() -> dict[str, object]:
    """What ONNX Runtime offers, and which of tconform's providers really run here (with the
    reason for each that does not)."""
    import onnxruntime

    from tconform.runtimes.providers import PROVIDERS, unavailable_reason

    offered = onnxruntime.get_available_providers()
    refused = _temporaries_refused()
    reasons = {
        ep: refused or unavailable_reason(ep) for ep, name in PROVIDERS.items() if name in offered
    }
    return {
        "providers_available": offered,
        "providers_running": [ep for ep, reason in reasons.items() if reason is None],
        "providers_not_running": {ep: reason for ep, reason in reasons.items() if reason},
    }


def environment(started: str | None = None, threads: int | None = None) -> dict[str, object]:
    """The block every report carries. `started`: the command's UTC start time; `threads`: the
    intra-op threads its runtimes were given (None or 0: their defaults)."""
    import psutil

    versions = library_versions()
    return {
        "started_utc": started or utc_now(),
        "os": platform.platform(),
        "cpu": cpu_name(),
        "instruction_sets": instruction_sets(),
        "cores_physical": psutil.cpu_count(logical=False),
        "cores_logical": os.cpu_count(),
        "threads": threads or None,
        "python": versions["python"],
        "torch": versions["torch"],
        "onnx": versions["onnx"],
        "onnxscript": versions["onnxscript"],
        "onnxruntime": versions["onnxruntime"],
        "numpy": versions["numpy"],
        "click": package_version("click"),
        "matplotlib": package_version("matplotlib"),
        **providers(),
        "tconform": versions["tconform"],
        "tconform_commit": git_commit(),
    }
