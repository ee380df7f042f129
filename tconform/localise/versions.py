"""Where two versions of one runtime part: the first module call whose outputs the two runs
computed differently, and which of them is nearer the float64 reference there.

Both runs were localised against the same float64 reference (tconform.localise), so each module
call's outputs carry, per version, their error statistics against it (max and mean absolute
error, max relative error, SQNR). Two runs that computed a call's outputs bit for bit have the
same statistics; the first call in execution order whose statistics differ is where the versions
part (an equality of every statistic between different tensors would be a coincidence, which
can only make the parting named later, never earlier). Nearer the reference: the smaller mean
absolute error over the call's outputs. The localisation runs return every module boundary as
an output, which can keep a runtime from fusing across one: two releases that differ only in a
fusion part in the plain run and not in these.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tconform.files import atomic_write_text
from tconform.runtimes import Runtime, label
from tconform.runtimes.specs import base_name

JUDGED = ("pass", "fail")  # boundaries compared with the reference (not unmatched or fused)


@dataclass
class Parting:
    """Two localised runs of one model compared boundary by boundary."""

    runtimes: tuple[str, str]  # their labels, as given
    module: str | None  # the first call whose outputs differ (None: none differs)
    cls: str = ""
    errors: dict[str, dict[str, float | None]] = field(default_factory=dict)  # label -> figures
    nearer: str = ""  # the label nearer the reference there ('' where equally near)
    compared: int = 0  # module calls compared before (and at) the parting

    @property
    def verdict(self) -> str:
        a, b = self.runtimes
        if self.module is None:
            return (
                f"{a} and {b} computed every one of {self.compared} module calls the same in "
                "their localisation runs (equal error statistics against the float64 "
                "reference; those runs return every module boundary, which keeps a runtime "
                "from fusing across one, so the plain runs' outputs may still differ)"
            )
        figures = "; ".join(
            f"{label} max abs err {e['max_abs_err']:.3g}, mean {e['mean_abs_err']:.3g}"
            for label, e in self.errors.items()
        )
        nearer = (
            f"{self.nearer} is nearer the float64 reference there (by mean abs err{self._but()})"
            if self.nearer
            else "both are equally near the float64 reference there"
        )
        return (
            f"{a} and {b} part first at {self.module} ({self.cls}), module call "
            f"{self.compared} in execution order: {figures}; {nearer}"
        )

    def _but(self) -> str:
        """Where the nearer one on average has the larger worst element, that too."""
        worst = {label: e["max_abs_err"] for label, e in self.errors.items()}
        other = next(label for label in worst if label != self.nearer)
        if None in worst.values() or worst[self.nearer] <= worst[other]:
            return ""
        return "; its max abs err is the larger"

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "verdict": self.verdict}


def _fingerprint(boundary) -> tuple:
    return tuple(
        (o.name, o.max_abs_err, o.max_rel_err, o.mean_abs_err, o.sqnr_db) for o in boundary.outputs
    )


def _figures(boundary) -> dict[str, float | None]:
    means = [o.mean_abs_err for o in boundary.outputs if o.mean_abs_err is not None]
    worst = [o.max_abs_err for o in boundary.outputs if o.max_abs_err is not None]
    return {
        "max_abs_err": max(worst) if worst else None,
        "mean_abs_err": sum(means) / len(means) if means else None,
    }


def parting(a, b) -> Parting:
    """Where localisations `a` and `b` (tconform.localise.Localisation, of one model and one
    reference on two runtimes) part."""
    theirs = {bd.key: bd for bd in b.boundaries if bd.status in JUDGED}
    compared = 0
    for mine in a.boundaries:
        other = theirs.get(mine.key)
        if mine.status not in JUDGED or other is None:
            continue
        compared += 1
        if _fingerprint(mine) == _fingerprint(other):
            continue
        errors = {a.runtime: _figures(mine), b.runtime: _figures(other)}
        means = [errors[a.runtime]["mean_abs_err"], errors[b.runtime]["mean_abs_err"]]
        nearer = ""
        if None not in means and means[0] != means[1]:
            nearer = a.runtime if means[0] < means[1] else b.runtime
        return Parting((a.runtime, b.runtime), mine.label, mine.cls, errors, nearer, compared)
    return Parting((a.runtime, b.runtime), None, compared=compared)


def version_partings(located: list[tuple[str, Hashable, object]]) -> list[Parting]:
    """For each runtime localised in one place under two or more specs ((runtime name or
    spec, place, localisation), in the order they ran; a place: the provider, and whatever
    else must be the same, such as the case and cell): where each consecutive pair parts."""
    groups: dict[tuple[str, Hashable], list] = {}
    for name, place, loc in located:
        groups.setdefault((base_name(name), place), []).append(loc)
    return [parting(a, b) for locs in groups.values() for a, b in itertools.pairwise(locs)]


def add_version_runs(localisations: list, runtimes: list[Runtime]) -> None:
    """Each repro bundle of `localisations` (tconform.localise.Localisation), its README with
    how to run it on each version of `runtimes` (the ONNX runtimes the run compared): the
    interpreter of each (an environment tconform made holds exactly that release)."""
    interpreters = {label(r): r.python for r in runtimes}
    for bundle in dict.fromkeys(loc.repro for loc in localisations if loc.repro):
        _add_runs(Path(bundle), interpreters)


def _add_runs(bundle: Path, interpreters: dict[str, str]) -> None:
    readme = bundle / "README.md"
    lines = [
        "",
        "## On each version",
        "",
        "The same bundle on each release the check compared (each interpreter holds that "
        "release of the runtime, numpy and onnx):",
        "",
        "```",
        *(f"{python} reproduce.py   # {label}" for label, python in interpreters.items()),
        "```",
        "",
    ]
    atomic_write_text(readme, readme.read_text() + "\n".join(lines))
