"""`tconform report merge`: the JSON reports of `verify --shard K/N` runs (`--generation`'s
among them), or of `check --shard K/N` runs of one model, made one report, each shard's
localisations and version partings carried into it.

The shards must come from the same goldens (golden manifest sha256), the same tconform version
and the same unit list (its sha256, tconform.units.digest), and together hold every unit exactly
once; anything else is an input error naming the first problem. The merged report is what one
full run would have written: the same results unit for unit, in the run's order (each shard
records its units' places), so the same exit code.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from pathlib import Path

from tconform.errors import (
    EXIT_EP_UNAVAILABLE,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    UsageError,
)
from tconform.files import read_json_object
from tconform.report import RunReport
from tconform.report.json_report import SCHEMA
from tconform.results import Result, exit_code
from tconform.runtimes.specs import base_name
from tconform.units import SEPARATOR, digest, documents_unit, result_unit, unchecked_models

# The exit codes a run that stopped early records (README, "Exit codes").
ERROR_EXIT_CODES = (
    EXIT_FAILURE,
    EXIT_USAGE,
    EXIT_EP_UNAVAILABLE,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
)


SHARDED = ("verify", "check")  # the commands that take --shard
USED_ROUNDING = 1e-6  # a report's figures are rounded as JSON keeps them


def read_shard(path: Path) -> dict:
    """A verify or check JSON report that records its units; anything else is refused in one
    line."""
    data = read_json_object(path, what="report")
    if data.get("tool") != "tconform" or not isinstance(data.get("results"), list):
        raise UsageError(f"{path}: not a tconform JSON report")
    if data.get("schema") != SCHEMA:  # another layout's fields read as this one's would lie
        raise UsageError(
            f"{path}: a report of schema {data.get('schema')!r:.40}; this tconform merges "
            f"{SCHEMA} (merge shards with the tconform that wrote them)"
        )
    if data.get("command") not in SHARDED:
        raise UsageError(
            f"{path}: a report of `tconform {data.get('command')}`, not of verify or check"
        )
    settings = data.get("settings") if isinstance(data.get("settings"), dict) else {}
    units = settings.get("units")
    if not isinstance(units, dict) or not isinstance(units.get("ids"), list):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            # the run stopped before its plan (a usage error): what it said, not a guess
            raise UsageError(
                f"{path}: records no work units: its run stopped first "
                f"(exit {error.get('exit_code')!r:.8}: {error['message']:.200})"
            )
        raise UsageError(f"{path}: records no work units (written by an older tconform?)")
    if not (
        all(isinstance(u, str) for u in units["ids"])
        and isinstance(units.get("total"), int)
        and isinstance(units.get("sha256"), str)
    ):
        raise UsageError(f"{path}: settings.units needs string ids, an integer total and a sha256")
    positions = units.get("positions")
    if positions is not None and not (
        isinstance(positions, list)
        and len(positions) == len(units["ids"])
        and all(type(p) is int and 0 <= p < units["total"] for p in positions)
    ):
        raise UsageError(
            f"{path}: settings.units.positions needs one place in the run (0..total-1) per id"
        )
    error = data.get("error")
    if error is not None and not (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and type(error.get("exit_code")) is int  # never True for 1
        and error.get("exit_code") in ERROR_EXIT_CODES
    ):
        codes = ", ".join(map(str, ERROR_EXIT_CODES))
        raise UsageError(f"{path}: its error entry needs a message and an exit code ({codes})")
    return data


def _same(reports: list[tuple[Path, dict]], what: str, value) -> None:
    """Every report agrees on `value(report)`; the first that does not is named."""
    (first, first_data), *rest = reports
    for path, data in rest:
        if value(data) != value(first_data):
            raise UsageError(
                f"{path}: {what} differs from {first} ({value(data)} != {value(first_data)})"
            )


def _runtimes(reports: list[tuple[Path, dict]]) -> dict[str, object]:
    """Every shard's runtimes with their settings (a shard records the runtimes of its own
    lanes); a runtime two shards ran with different settings is not one run's."""
    seen: dict[str, tuple[Path, object]] = {}
    for path, data in reports:
        held = data["settings"].get("runtimes")
        for name, settings in (held if isinstance(held, dict) else {}).items():
            first = seen.setdefault(name, (path, settings))
            if first[1] != settings:
                raise UsageError(
                    f"{path}: runtime {name} ran with other settings than in {first[0]} "
                    f"({settings} != {first[1]})"
                )
    return {name: settings for name, (_, settings) in seen.items()}


def _results(path: Path, data: dict, declared: list[str]) -> list[Result]:
    """The report's results, each of one of its declared units, and one at least per unit
    (unless the run stopped early, which the merged report then says)."""
    results = []
    for n, entry in enumerate(data["results"]):
        try:
            results.append(Result.from_dict(entry))
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise UsageError(f"{path}: result {n} is not a run's result ({exc})") from None
    documents = documents_unit().id  # the documents' verdicts pass without an output
    for n, r in enumerate(results):
        if (
            r.status == "pass"
            and result_unit(r) != documents
            and not any(o.status == "pass" and o.checked for o in r.outputs)
        ):
            raise UsageError(
                f"{path}: result {n} is not a run's result (a pass that compared no output)"
            )
    for n, r in enumerate(results):  # a unit's id names its case, cell and input set
        unit = result_unit(r)
        if unit != documents and not (
            unit.startswith(f"{r.case}{SEPARATOR}{r.cell}{SEPARATOR}")
            and unit.endswith(f"{SEPARATOR}{r.input_set}")
        ):
            raise UsageError(
                f"{path}: result {n} is not a run's result (its case, cell or input set is not "
                "its unit's)"
            )
    own_rows = data["command"] == "verify"  # verify's expected outputs are float64 goldens
    for n, r in enumerate(results):
        contradiction = (
            _impossible(r, own_rows)
            or _not_its_lane(r, data["settings"])
            or _contradiction(r)
            or _not_its_row(r, data)
        )
        if contradiction:
            raise UsageError(f"{path}: result {n} is not a run's result ({contradiction})")
    error = data.get("error")
    recorded = error["exit_code"] if error is not None else exit_code(r.status for r in results)
    if data.get("exit_code") != recorded or type(data.get("exit_code")) is not int:
        raise UsageError(
            f"{path}: its exit code {data.get('exit_code')!r:.20} is not its "
            f"{'error entry' if error is not None else 'results'}' ({recorded})"
        )
    counted = Counter(result_unit(r) for r in results)
    twice = [unit for unit, count in counted.items() if count > 1 and unit != documents]
    if twice:  # a unit is one runtime's run of one input set: one result, merged once
        raise UsageError(f"{path}: holds {counted[twice[0]]} results of unit {twice[0]}")
    held = set(counted)
    stray = sorted(held - set(declared))
    if stray:
        raise UsageError(f"{path}: holds a result of unit {stray[0]}, which it does not declare")
    unrun = [u for u in declared if u not in held]
    if unrun and data.get("error") is None:
        raise UsageError(f"{path}: no result for its unit {unrun[0]}")
    return results


# What a shard's details hold of its localised lanes, and the fields the reports render of each
# (tconform.report.markdown): carried into the merged report, each entry checked first.
CARRIED = {"localisation": ("runtime", "verdict"), "version_partings": ("verdict",)}
BOUNDARY = {"status": str, "cls": str, "outputs": list}


def _carried(path: Path, data: dict, key: str) -> list[dict]:
    """The shard's `details[key]` entries, each a JSON object with the text fields the reports
    render (a localisation's boundaries too); anything else is refused in one line."""
    found = (data.get("details") or {}).get(key) if isinstance(data.get("details"), dict) else None
    if found is None:
        return []
    entries = found if isinstance(found, list) else [None]
    for n, entry in enumerate(entries):
        boundaries = entry.get("boundaries", []) if isinstance(entry, dict) else None
        if not (
            isinstance(entry, dict)
            and all(isinstance(entry.get(field), str) for field in CARRIED[key])
            and isinstance(boundaries, list)
            and all(_is_boundary(b) for b in boundaries)
        ):
            raise UsageError(f"{path}: details.{key}[{n}] is not what tconform writes there")
    return entries


def _is_boundary(b: object) -> bool:
    """Whether `b` is a localisation's boundary as the reports render it."""
    return (
        isinstance(b, dict)
        and all(isinstance(b.get(field), kind) for field, kind in BOUNDARY.items())
        and (b.get("path") is None or isinstance(b["path"], str))
        and all(
            isinstance(o, dict)
            and (
                o.get("tolerance_used") is None or _are_numbers(o, "max_abs_err", "tolerance_used")
            )
            for o in b["outputs"]
        )
    )


def _are_numbers(entry: dict, *fields: str) -> bool:
    return all(_is_number(entry.get(f)) for f in fields)


# The figures of an output that are never negative, as tconform writes them.
NON_NEGATIVE = (
    "atol", "rtol", "max_abs_err", "max_rel_err", "mean_abs_err", "mismatches",
    "tolerance_used", "excluded", "both_nonfinite", "golden_rms", "golden_median",
)  # fmt: skip
# What the expected outputs can have been computed in (Result.reference): verify's goldens are
# float64; check falls back to float32 where its float64 copy of the model cannot run.
REFERENCES = ("float64", "float32")


def _impossible(r: Result, goldens: bool) -> str:
    """Why a result holds what tconform never writes ('' where it does not): a negative figure,
    a mean error above the largest, a reference that is not one (float64 only, against
    `goldens`), or a pass that lists worst elements (only a failure lists them)."""
    allowed = REFERENCES[:1] if goldens and result_unit(r) != documents_unit().id else REFERENCES
    if r.reference not in allowed:
        return f"expected outputs computed in {r.reference!r:.20}, not {' or '.join(allowed)}"
    for o in r.outputs:
        negative = next((f for f in NON_NEGATIVE if (getattr(o, f) or 0) < 0), None)
        if negative:
            return f"output {o.name!r:.80} has a negative {negative}"
        if (o.mean_abs_err or 0) > (o.max_abs_err or 0) * (1 + USED_ROUNDING):
            return f"output {o.name!r:.80} has a mean error above its largest"
        if r.status == "pass" and o.worst:
            return f"a pass whose output {o.name!r:.80} lists worst elements (a failure's)"
    return ""


def _not_its_lane(r: Result, settings: dict) -> str:
    """Why a result did not run on its unit's lane ('' where it did): its runtime is none
    tconform has, its provider is not one the run asked for, or its unit (and the run's
    runtimes) name another runtime or provider. A shard's CPU row edited to claim CUDA is
    not a CUDA pass."""
    from tconform.runtimes import RUNTIMES
    from tconform.runtimes.labels import runtime_label

    unit = result_unit(r)
    if unit == documents_unit().id:  # the documents' rows run the oracle, on no provider
        return ""
    if base_name(r.runtime) not in RUNTIMES:
        return f"runtime {r.runtime!r:.40}, which tconform does not have"
    if r.ep not in (settings.get("eps") or []):
        return f"provider {r.ep!r:.20}, which the run did not ask for ({settings.get('eps')})"
    lane = unit[len(f"{r.case}{SEPARATOR}{r.cell}{SEPARATOR}") : -len(f"{SEPARATOR}{r.input_set}")]
    own = runtime_label(r.runtime, r.ep)
    if lane != own and not lane.startswith(f"{own} ("):
        return f"a row of {own} in a unit of {lane!r:.60}"
    runtimes = settings.get("runtimes")
    if isinstance(runtimes, dict) and lane not in runtimes:
        return f"a row of {lane!r:.60}, which the run's runtimes do not hold"
    ran = runtimes.get(lane) if isinstance(runtimes, dict) else None
    if r.status == "crash" and not (isinstance(ran, dict) and ran.get("worker")):
        return f"a crash of {lane!r:.60}, which ran in tconform's own process, not a worker"
    # the row a pass is judged by: its model's where that is narrower than float32, else its
    # lane's (float32, or the runtime's tf32 or bfloat16, which its unit's label says)
    earned = r.model.precision if r.model is not None else "float32"
    due = earned if earned != "float32" else lane[len(own) :].strip(" ()") or "float32"
    if r.status == "pass" and r.precision != due:
        return f"precision {r.precision!r:.20}, where its model and lane give {due}"
    return ""


def _contradiction(r: Result) -> str:
    """Why a pass contradicts its own figures ('' where it does not): an output that did not
    pass, counted mismatches, more than its tolerance used, an SQNR below its floor, or a
    largest error beyond what its tolerance allows anywhere in the output (no element exceeds
    the output's RMS times the square root of its size), or a tolerance that cannot see the
    output (tconform makes such an output skip, never a pass): one it marked so, or, without an
    SQNR floor to see by, an atol at or above the output's RMS or an rtol of 1 or more."""
    failed = next((o.name for o in r.outputs if o.status == "fail"), None)
    if r.status in ("skip", "unavailable") and failed is not None:
        return f"a {r.status} whose output {failed!r:.80} failed"
    if r.status != "pass":
        return ""
    ran_on = _ran_elsewhere(r)
    if ran_on:
        return ran_on
    for o in r.outputs:
        said = f"a pass whose output {o.name!r:.80}"
        if o.status != "pass" or o.mismatches:
            return f"{said} is {o.status} with {o.mismatches} mismatches"
        blind = o.min_sqnr_db is None and (o.rtol >= 1 or 0 < (o.golden_rms or 0) <= o.atol)
        if o.unseen() or blind:
            return (
                f"{said} was held to a tolerance that cannot see it (atol {o.atol:.3g}, "
                f"rtol {o.rtol:.3g}, RMS {o.golden_rms or 0:.3g})"
            )
        if (o.tolerance_used or 0.0) > 1 + USED_ROUNDING:
            return f"{said} used {o.tolerance_used:.3g} of its tolerance"
        if o.sqnr_db is not None and o.min_sqnr_db is not None and o.sqnr_db < o.min_sqnr_db:
            return f"{said} is below its SQNR floor"
        largest = (o.golden_rms or 0.0) * math.sqrt(max(1, math.prod(o.shape or [1])))
        allowed = (o.atol + o.rtol * largest) * (1 + USED_ROUNDING)
        if o.max_abs_err is not None and o.golden_rms is not None and o.max_abs_err > allowed:
            return f"{said} erred by {o.max_abs_err:.3g}, beyond what its tolerance allows"
    return ""


def _not_its_row(r: Result, data: dict) -> str:
    """Why a pass was not judged by its row ('' where it was, or where the row is not known):
    each output's tolerance is the row of (its precision, the case's class, the goldens'
    preset for verify), its atol scaled to the output's RMS; for check, the class its settings
    name with the user's atol, rtol and per-output tolerances where given (a default check is
    held to the row too)."""
    from tconform.compare import TOLERANCES, tolerance_for
    from tconform.registry import case_names, get_case

    if r.status != "pass":
        return ""  # a row that did not pass claims nothing
    settings = data["settings"]
    given = settings.get("tolerance") if data["command"] == "check" else None
    if data["command"] == "verify" and r.case in case_names():
        kind, preset, given = get_case(r.case).tolerance, settings.get("preset"), {}
    elif isinstance(given, dict) and isinstance(given.get("per_output"), dict):
        kind, preset = given.get("class"), None  # check: its module's row
    else:
        return ""  # a generation golden, a document check: rows of their own
    if (r.precision, kind) not in TOLERANCES:
        return f"precision {r.precision!r:.20}, which has no {kind!s:.20} row"
    row = tolerance_for(r.precision, kind, *([str(preset)] if preset is not None else []))
    overrides = given.get("per_output") or {}
    for o in r.outputs:
        scaled = row.atol_for(o.golden_rms, o.golden_median)
        if o.name in overrides:
            due = (*overrides[o.name], None)
        elif given.get("atol") is None and given.get("rtol") is None:
            due = (scaled, row.rtol, row.min_sqnr_db)
        else:  # a user's atol is theirs; the row's keeps scaling
            atol = scaled if given.get("atol") is None else given["atol"]
            due = (atol, row.rtol if given.get("rtol") is None else given["rtol"], None)
        held = (o.atol, o.rtol, o.min_sqnr_db)
        if not all(
            a == b or (_is_number(a) and _is_number(b) and math.isclose(a, b, rel_tol=1e-6))
            for a, b in zip(held, due, strict=True)
        ):
            return (
                f"output {o.name!r:.80} held to atol {o.atol:.3g}, rtol {o.rtol:.3g}, not its "
                f"{r.precision} {kind} row's"
            )
    return ""


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


def _ran_elsewhere(r: Result) -> str:
    """Why a pass did not run on what it names ('' where it did): no provider recorded, or an
    ONNX Runtime pass on a provider its session did not have (a session that fell back to the
    CPU is never the requested provider's pass: tconform.runtimes.onnxruntime)."""
    from tconform.runtimes.providers import PROVIDERS

    if result_unit(r) == documents_unit().id:  # a document property's row holds no session
        return ""
    if not r.ep_actual:
        return "a pass that records nothing it ran on"
    wanted = PROVIDERS.get(r.ep)
    if base_name(r.runtime) == "onnxruntime" and wanted and wanted not in r.ep_actual:
        return f"a pass on {r.ep} whose session ran on {', '.join(map(str, r.ep_actual))}"
    return ""


def _missing_shards(shards: list) -> str:
    """Which `K/N` shards are absent, when the reports say; what they hold otherwise. (A shard
    records only its own unit ids, so the missing ids are known by their shard, not by name.)
    A shard count is whatever a report holds: read as ASCII digits only, and the absent shards
    are found lazily (the first few), so a count of twenty digits costs nothing."""
    held = [str(shard) for shard in shards]
    parsed = [re.fullmatch(r"([0-9]{1,18})/([0-9]{1,18})", shard) for shard in held]
    counts = {found.group(2) for found in parsed if found}
    if len(counts) == 1 and all(parsed):
        count = int(counts.pop())
        missing = (f"{k}/{count}" for k in range(1, count + 1) if f"{k}/{count}" not in held)
        absent = list(itertools.islice(missing, 10))
        if absent:
            more = ", ..." if len(absent) == 10 else ""
            return (
                f"no report of shard {', '.join(absent)}{more} (the reports hold {', '.join(held)})"
            )
    return f"the reports hold shards {', '.join(sorted(held))}"


def _in_run_order(merged: RunReport, reports: list[tuple[Path, dict]]) -> None:
    """The merged units and results in the order the whole run lists them, where every shard
    recorded its units' places (a report of an older tconform did not: shard order then)."""
    place: dict[str, int] = {}
    for _, data in reports:
        units = data["settings"]["units"]
        place.update(zip(units["ids"], units.get("positions") or [], strict=False))
    held = merged.settings["units"]
    if len(place) != len(held["ids"]):
        return
    if sorted(place.values()) != list(range(held["total"])):
        raise UsageError(
            "settings.units.positions: the reports do not give each of the run's "
            f"{held['total']} units a place of its own"
        )
    held["ids"] = sorted(held["ids"], key=place.__getitem__)
    held["positions"] = list(range(held["total"]))
    merged.results.sort(key=lambda result: place[result_unit(result)])  # stable: within a unit


def merge(paths: list[Path]) -> RunReport:
    """One report from shard reports (see the module docstring)."""
    reports = [(path, read_shard(path)) for path in paths]  # a path given twice: duplicates
    _same(reports, "command", lambda d: d["command"])
    _same(reports, "golden manifest sha256", lambda d: d["settings"].get("golden_manifest_sha256"))
    _same(reports, "model checked", lambda d: d["settings"].get("reference_model"))
    _same(reports, "tconform version", lambda d: d.get("version"))
    _same(reports, "unit list sha256", lambda d: d["settings"]["units"].get("sha256"))
    # how the run was asked for: one request, whichever machine ran a shard of it
    for key in ("strict_placement", "allow_missing_ep", "eps", "runtime_options", "matrix", "seed"):
        _same(reports, key.replace("_", " "), lambda d, key=key: d["settings"].get(key))
    _same(reports, "unit count", lambda d: d["settings"]["units"].get("total"))
    runtimes = _runtimes(reports)
    owner: dict[str, Path] = {}
    for path, data in reports:
        for unit in data["settings"]["units"]["ids"]:
            if unit in owner:
                raise UsageError(f"unit {unit} is in both {owner[unit]} and {path}")
            owner[unit] = path
    first = reports[0][1]
    expected = first["settings"]["units"]
    if len(owner) != expected["total"] or digest(owner) != expected["sha256"]:
        shards = [d["settings"]["units"].get("shard") for _, d in reports]
        raise UsageError(
            f"{expected['total'] - len(owner)} of {expected['total']} units missing: "
            f"{_missing_shards(shards)}"
        )
    merged = RunReport(first["command"])
    merged.settings = {
        **first["settings"],
        "units": {
            **{k: v for k, v in expected.items() if k != "positions"},
            "shard": None,
            "ids": list(owner),
        },
        "runtimes": runtimes,
    }
    merged.details["shards"] = [
        {
            "report": str(path),
            "shard": data["settings"]["units"].get("shard"),
            "exit_code": data.get("exit_code"),
            "environment": data.get("environment"),
        }
        for path, data in reports
    ]
    for path, data in reports:
        merged.results += _results(path, data, data["settings"]["units"]["ids"])
        for key in CARRIED:
            found = _carried(path, data, key)
            if found:
                merged.details.setdefault(key, []).extend(found)
        if data.get("error") is not None and merged.error is None:
            shard = data["settings"]["units"].get("shard")
            merged.error = {
                "message": f"shard {shard} ({path}): {data['error']['message']}",
                "exit_code": data["error"]["exit_code"],
            }
    _in_run_order(merged, reports)
    why = unchecked_models(merged.results)  # as the whole run would have ended
    if why and merged.error is None:
        merged.error = {"message": why, "exit_code": EXIT_EP_UNAVAILABLE}
    return merged
