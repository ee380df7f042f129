"""Library versions and machine facts, recorded in every manifest and report."""

from __future__ import annotations

import platform
import sys
from importlib import metadata


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def tool_version() -> str:
    return package_version("tconform") or "0+unknown"


def library_versions() -> dict[str, str | None]:
    import numpy
    import onnx
    import onnxruntime

    # torch's own where it is loaded; its package's otherwise (the same string), so that a
    # report written by a process that never needed torch does not load it for its version.
    torch = sys.modules.get("torch")
    return {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "torch": str(torch.__version__) if torch is not None else package_version("torch"),
        "onnx": onnx.__version__,
        "onnxscript": package_version("onnxscript"),
        "onnxruntime": onnxruntime.__version__,
        "tconform": tool_version(),
    }


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
