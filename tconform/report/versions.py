"""Two or more versions of one runtime in one run (`--runtime onnxruntime==1.20.1 --runtime
onnxruntime`): per case and output, each version's error against the golden, and the rows where
one version passes and another fails, marked a regression (it passed on the older release) or a
fix (it passed on the newer), with the direction.

A version group is the results of one runtime on one provider under different specs
(tconform.runtimes.specs): the installed one and each named release or interpreter. Each
spec's release is read from the run's settings (the runtime's own report of its version); the
group is ordered oldest first, so "regression 1.20.1 -> 1.31.1" reads as an upgrade.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from tconform.report.text import format_table
from tconform.results import Result
from tconform.runtimes.labels import runtime_label
from tconform.runtimes.specs import base_name

# The settings key each runtime reports its own version under (its package's name).
VERSION_KEYS = {"onnxruntime": "onnxruntime", "openvino": "openvino", "onnx-reference": "onnx"}
PASSING = ("pass", "tie")
FAILING = ("fail", "error", "crash")  # a skip or an unavailable provider checked nothing


@dataclass
class VersionGroup:
    """One runtime on one provider, under two or more specs, oldest release first."""

    runtime: str  # the runtime's name (onnxruntime)
    ep: str
    specs: list[str]  # as results name them (onnxruntime==1.20.1, onnxruntime)
    versions: dict[str, str]  # spec -> its release as the runtime reports it
    rows: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "runtime": self.runtime,
            "ep": self.ep,
            "versions": [{"runtime": s, "version": self.versions[s]} for s in self.specs],
            "rows": self.rows,
            "regressions": sum(r["change"].startswith("regression") for r in self.rows),
            "fixes": sum(r["change"].startswith("fix") for r in self.rows),
            "differences": sum(r["change"].startswith("differs") for r in self.rows),
        }


def release_of(spec: str, ep: str, precision: str, settings: dict) -> str:
    """A spec's release: what the runtime reported in the run's settings, else the spec's own
    '==VERSION', else the spec itself (an interpreter whose runtime said nothing)."""
    runtimes = settings.get("runtimes")
    own = runtimes.get(runtime_label(spec, ep, precision)) if isinstance(runtimes, dict) else None
    key = VERSION_KEYS.get(base_name(spec))
    if isinstance(own, dict) and key and isinstance(own.get(key), str):
        number = re.match(r"[0-9]+(\.[0-9]+)*", own[key])  # OpenVINO adds its build number
        return number.group(0) if number else own[key]
    found = re.search(r"==([^@]+)", spec)
    return found.group(1) if found else spec


def _order(version: str) -> tuple:
    """A release as a sort key: its leading numbers (1.20.1 < 1.21.0 < 2025.4.0)."""
    numbers = re.match(r"[0-9]+(\.[0-9]+)*", version)
    return tuple(int(n) for n in numbers.group(0).split(".")) if numbers else (float("inf"),)


def _outcomes(r: Result, names: list[str]) -> dict[str, tuple[str, float | None]]:
    """{output: (status, max abs err)} of one result; a result without judged outputs (an
    error, a crash) has its own status on each output the others judged (`names`; '*' where
    none did)."""
    if not r.outputs:
        return {name: (r.status, None) for name in names or ["*"]}
    return {o.name: (o.status, o.max_abs_err) for o in r.outputs}


def version_groups(results: list[Result], settings: dict) -> list[VersionGroup]:
    """Every runtime that ran under two or more specs on one provider, compared row by row."""
    specs: dict[tuple[str, str], dict[str, str]] = {}
    for r in results:
        if r.runtime:
            group = specs.setdefault((base_name(r.runtime), r.ep), {})
            group.setdefault(r.runtime, release_of(r.runtime, r.ep, r.precision, settings))
    groups = []
    for (runtime, ep), found in specs.items():
        if len(found) < 2:
            continue
        ordered = sorted(found, key=lambda s: (_order(found[s]), s))
        group = VersionGroup(runtime, ep, ordered, found)
        group.rows = _rows(results, group)
        groups.append(group)
    return groups


def _rows(results: list[Result], group: VersionGroup) -> list[dict]:
    table: dict[tuple[str, str, str, str], dict[str, tuple[str, float | None]]] = {}
    mine = [r for r in results if r.ep == group.ep and r.runtime in group.specs]
    judged: dict[tuple[str, str, str], list[str]] = {}
    for r in mine:
        names = judged.setdefault((r.case, r.cell, r.input_set), [])
        names += [o.name for o in r.outputs if o.name not in names]
    for r in mine:
        for output, outcome in _outcomes(r, judged[(r.case, r.cell, r.input_set)]).items():
            table.setdefault((r.case, r.cell, r.input_set, output), {})[r.runtime] = outcome
    rows = []
    for (case, cell, input_set, output), by_spec in table.items():
        rows.append(
            {
                "case": case,
                "cell": cell,
                "input_set": input_set,
                "output": output,
                "status": {s: by_spec[s][0] for s in group.specs if s in by_spec},
                "max_abs_err": {s: by_spec[s][1] for s in group.specs if s in by_spec},
                "change": _change(group, by_spec),
            }
        )
    return rows


def _change(group: VersionGroup, by_spec: dict[str, tuple[str, float | None]]) -> str:
    """'regression A -> B' where A (older) passes and B (newer) does not, 'fix A -> B' the
    other way round (the first such pair, oldest first), naming a failing side that did not
    merely fail ('fix A -> B (crash on A)'); '' where they agree."""
    ran = [s for s in group.specs if by_spec.get(s, ("",))[0] in (*PASSING, *FAILING)]
    for older, newer in itertools.pairwise(ran):
        before, after = by_spec[older][0] in PASSING, by_spec[newer][0] in PASSING
        if before == after:
            continue
        passing, failing = (older, newer) if before else (newer, older)
        status = by_spec[failing][0]
        if not _ordered(group.versions[older], group.versions[newer]):
            # one release twice (two installs, a source build) or one that said none: no
            # upgrade to read a direction from, so the two sides are named as they are
            return f"differs: {_named(group, passing)} passes, {_named(group, failing)} {status}"
        how = f" ({status} on {group.versions[failing]})" if status != "fail" else ""
        arrow = f"{group.versions[older]} -> {group.versions[newer]}"
        return f"{'regression' if before else 'fix'} {arrow}{how}"
    return ""


def _ordered(older: str, newer: str) -> bool:
    """Whether two releases make an upgrade: both known by their numbers, and not the same."""
    unknown = (float("inf"),)
    return older != newer and _order(older) != unknown and _order(newer) != unknown


def _named(group: VersionGroup, spec: str) -> str:
    """A spec with its release, where the release says more than the spec ('1.31.1 (onnxruntime
    @/opt/py/bin/python)'); a spec whose runtime said no release is named by itself."""
    version = group.versions[spec]
    return spec if version == spec else f"{version} ({spec})"


def _worst(errors: list[float | None]) -> float | None:
    known = [e for e in errors if e is not None]
    return max(known) if known else None


def render(groups: list[VersionGroup]) -> str:
    """Per group: each case's worst error per version over its input sets, what changed."""
    blocks = []
    for group in groups:
        names = [f"{group.versions[s]} ({s})" for s in group.specs]
        lines = [f"versions of {group.runtime} on {group.ep}, oldest first: {', '.join(names)}"]
        cells = len({row["cell"] for row in group.rows}) > 1  # a matrix: say which cell
        merged: dict[tuple[str, str, str], list[dict]] = {}
        for row in group.rows:
            merged.setdefault((row["case"], row["cell"], row["output"]), []).append(row)
        body = []
        for (case, cell, output), rows in merged.items():
            worst = [_worst([r["max_abs_err"].get(s) for r in rows]) for s in group.specs]
            changes = sorted({r["change"] for r in rows if r["change"]})
            known = [w for w in worst if w is not None]  # a skip's column says SKIP
            same = len(known) > 1 and len(set(known)) == 1
            body.append(
                [
                    case + (f" [{cell}]" if cells else ""),
                    output,
                    *(_cell(w, rows, s) for w, s in zip(worst, group.specs, strict=True)),
                    "; ".join(changes) or ("same max error" if same else "-"),
                ]
            )
        header = ["case", "output", *(group.versions[s] for s in group.specs), "change"]
        lines.append(format_table(header, body))
        counts = group.to_dict()
        lines.append(
            f"{counts['regressions']} regressions, {counts['fixes']} fixes"
            + (f", {counts['differences']} differences" if counts["differences"] else "")
            + f" over {len(group.rows)} outputs x input sets (a regression passes on the older "
            "release and not on the newer; a difference is between sides of no known order)"
        )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _cell(worst: float | None, rows: list[dict], spec: str) -> str:
    """A version's worst error, or its status where it has none (an error, a crash)."""
    if worst is not None:
        return f"{worst:.2e}"
    statuses = {r["status"].get(spec) for r in rows} - {None}
    return "/".join(sorted(statuses)).upper() or "-"
