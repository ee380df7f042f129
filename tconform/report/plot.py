"""Error distribution plot for a verify run: per case and runtime, the worst error against the
exact golden (log scale) and how much of the tolerance it used.

Every PNG tconform writes (these, the matrix heat map, bench's plots) goes through `save`, which
marks it in the PNG's own metadata (`Software: tconform`), so that `is_own` can tell a plot
tconform wrote from a user's image; a run that stopped before it had anything to plot still
writes its plot, saying why (`write_message`).
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

from tconform.files import atomic_write_bytes
from tconform.results import Result
from tconform.runtimes.labels import runtime_label


def _label(r: Result) -> str:
    return runtime_label(r.runtime, r.ep, r.precision)


SOFTWARE = "tconform"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def save(fig, path: Path, **savefig) -> None:
    """`fig` as a PNG at `path` (atomically), marked as tconform's, and closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": SOFTWARE}, **savefig)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def write_message(path: Path, title: str, message: str) -> None:
    """A plot of nothing, saying why: the run stopped before it measured anything."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, textwrap.fill(message, 90), ha="center", va="center", wrap=True)
    save(fig, path, dpi=100)


def is_own(path: Path) -> bool:
    """Whether `path` holds a PNG tconform wrote (marked by `save`), so replacing it loses
    nothing."""
    try:
        with path.open("rb") as png:
            if png.read(8) != PNG_SIGNATURE:
                return False
            for _ in range(64):  # the text chunks come before the image data
                header = png.read(8)
                if len(header) < 8:
                    return False
                length, kind = struct.unpack(">I4s", header)
                if kind in (b"IDAT", b"IEND") or length > 2**16:
                    return False
                body = png.read(length)
                png.read(4)  # the chunk's CRC
                if kind == b"tEXt" and body == b"Software\0" + SOFTWARE.encode():
                    return True
    except OSError:
        return False
    return False


def write(path: Path, report) -> None:
    """The run report's plot: a matrix run's heat map of cases x cells, else the error
    distribution below; a run that stopped with nothing to plot says why."""
    if not any(r.outputs for r in report.results) and report.error is not None:
        write_message(
            path,
            f"tconform {report.command}: stopped early (exit {report.error['exit_code']})",
            str(report.error["message"]),
        )
    elif report.settings.get("matrix"):
        from tconform.report import pivot

        pivot.write_heatmap(path, report.results)
    else:
        write_errors(path, report.results)


def write_errors(path: Path, results: list[Result]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in results if r.outputs and not r.case.startswith("doc:")]
    cases = list(dict.fromkeys(r.case for r in measured))
    runtimes = list(dict.fromkeys(_label(r) for r in measured))
    worst: dict[tuple[str, str], tuple[float, float]] = {}
    for r in measured:
        err = max(o.max_abs_err or 0.0 for o in r.outputs)
        key = (r.case, _label(r))
        old = worst.get(key, (0.0, 0.0))
        worst[key] = (max(old[0], err), max(old[1], r.worst_used or 0.0))

    fig, (ax_err, ax_used) = plt.subplots(1, 2, figsize=(12, 0.4 * len(cases) + 2), sharey=True)
    height = 0.8 / max(1, len(runtimes))
    for i, runtime in enumerate(runtimes):
        ys = [c + i * height for c in range(len(cases))]
        errs = [max(worst.get((c, runtime), (0.0, 0.0))[0], 1e-12) for c in cases]
        used = [worst.get((c, runtime), (0.0, 0.0))[1] * 100 for c in cases]
        ax_err.barh(ys, errs, height, label=runtime)
        ax_used.barh(ys, used, height, label=runtime)
    ax_err.set_xscale("log")
    ax_err.set_xlabel("worst |actual - exact golden| over input sets (exact 0 drawn at 1e-12)")
    ax_used.set_xlabel("share of tolerance used (%)")
    ax_used.axvline(100, color="red", linestyle="--", linewidth=1)
    ax_err.set_yticks([c + 0.4 - height / 2 for c in range(len(cases))], cases)
    ax_err.invert_yaxis()
    ax_used.legend(loc="lower right", fontsize="small")
    fig.suptitle("tconform verify: error against the float64 oracle")
    fig.tight_layout()
    save(fig, path, dpi=110)
