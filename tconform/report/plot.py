"""Error distribution plot for a verify run: per case and runtime, the worst error against the
exact golden (log scale) and how much of the tolerance it used.

Every PNG tconform writes (these, the matrix heat map, bench's plots) goes through `save`, which
marks it in the PNG's own metadata (`Software: tconform`), so that `is_own` can tell a plot
tconform wrote from a user's image; a run that stopped before it had anything to plot still
writes its plot, saying why (`write_message`).
"""

from __future__ import annotations

from pathlib import Path

from tconform.report import pivot
from tconform.report.png import is_own, save, write_message
from tconform.results import Result
from tconform.runtimes.labels import runtime_label

# A writer of the formats registry (tconform.report.formats): write, and is_own for a usage
# error's report, which replaces only a plot tconform wrote.
__all__ = ["is_own", "write"]


def _label(r: Result) -> str:
    return runtime_label(r.runtime, r.ep, r.precision)


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
        pivot.write_heatmap(path, report.results)
    else:
        write_errors(path, report.results, f"tconform {report.command}")


def write_errors(path: Path, results: list[Result], title: str) -> None:
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
    fig.suptitle(f"{title}: error against the float64 oracle")
    fig.tight_layout()
    save(fig, path, dpi=110)
