"""Error distribution plot for a verify run: per case and runtime, the worst error against the
exact golden (log scale) and how much of the tolerance it used."""

from __future__ import annotations

import io
from pathlib import Path

from tconform.files import atomic_write_bytes
from tconform.results import Result
from tconform.runtimes.labels import runtime_label


def _label(r: Result) -> str:
    return runtime_label(r.runtime, r.ep, r.precision)


def write(path: Path, results: list[Result]) -> None:
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
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
