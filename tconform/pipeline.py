"""The one pipeline every check runs through: `verify` (tconform's cases against the goldens),
`check` (a user's model against its float64 copy) and the pytest plugin's units alike.

Top to bottom: the plan (tconform.plan: lanes and work units, from the request and the suite),
the units this machine runs (a shard, or those named), the models the lanes run (the suite
exports, holds or is given them), then case by case the input sets and each lane's results
(tconform.execution: open, feed, run, judge, stamp), localised where asked (and where two
versions of a runtime were localised on one model, where they part: tconform.localise.versions),
all landing in one RunReport as they come; last, the suite's own units (the documents'
checks). Every result records the providers the session really used and the exact model that
ran (path, sha256, origin).
"""

from __future__ import annotations

from collections.abc import Callable

from tconform.localise import Localisation
from tconform.localise.versions import add_version_runs, version_partings
from tconform.plan import Lane, Plan, Progress, Suite, plan, select_units
from tconform.report import RunReport
from tconform.request import Request
from tconform.results import Result, allow_missing
from tconform.runtimes import label
from tconform.units import Unit, digest, require_checked, unit_id

# Told of a lane as it starts (what it does: "ran", "was localised"; no results) and as that
# ends (no doing; its results)
Watch = Callable[[Lane, str | None, list[Result] | None], None]


def run_request(request: Request, report: RunReport, progress: Progress = lambda _: None) -> None:
    """Run `request` on its subject's suite (tconform.suites), into `report`."""
    from tconform.suites import open_suite

    with open_suite(request, progress) as suite:
        run(request, suite, report, progress)
    require_checked(report.results, request.whole_run)


def run(
    request: Request,
    suite: Suite,
    report: RunReport,
    progress: Progress,
    watch: Watch | None = None,
) -> None:
    """Fill `report` with one result per lane and input set of `suite` that this machine runs
    (and the settings that produced them). Results land in `report` as they come, so an error
    that stops the run midway leaves the results so far in place for the reports. `watch` is
    told of each lane as it starts to run or to be localised (what it does) and as that ends
    (its results, [] for a localisation): check's process sends them to the command's, which
    then knows what a crash of the whole process ended."""
    watch = watch or (lambda lane, doing, results: None)
    planned = plan(request, suite)
    mine = select_units(request, planned.units)
    mine_ids = {u.id for u in mine}
    lanes = [
        lane for lane in planned.lanes if any(u.id in mine_ids for u in planned.units_of(lane))
    ]
    if request.shard:
        index, count = request.shard
        progress(f"shard {index}/{count}: {len(mine)} of {len(planned.units)} units")
    models = suite.models(lanes, mine_ids, progress)
    report.settings = {**suite.settings(), **_settings(request, planned, lanes, mine)}
    localisations: list[Localisation] = []
    located: list[tuple[str, tuple, Localisation]] = []  # (spec, place, localisation)
    cases = list(dict.fromkeys(lane.case for lane in lanes))
    for n, case in enumerate(cases, 1):
        progress(f"[{n}/{len(cases)}] {case.name}")
        sets = suite.input_sets(case)
        for lane in (lane for lane in lanes if lane.case == case):
            lane_sets = [
                s
                for s in sets
                if unit_id(case.name, lane.cell, label(lane.runtime), s.name) in mine_ids
            ]
            watch(lane, "ran", None)
            results = lane_results(lane, models, lane_sets, suite, request)
            watch(lane, None, results)
            if _localises(request, lane) and lane.model_key in models:  # not a failed one
                model = models[lane.model_key]
                watch(lane, "was localised", None)
                found = suite.localise(lane.runtime, model, results, sets)
                watch(lane, None, [])
                localisations += found
                place = (lane.runtime.ep, case.name, lane.cell)
                located += [(lane.runtime.name, place, loc) for loc in found]
            report.results += results
    if localisations:
        report.details["localisation"] = [found.to_dict() for found in localisations]
        report.localisations = localisations
    report.partings = version_partings(located)
    if report.partings:  # where versions of a runtime part; a bundle runs on each of them
        report.details["version_partings"] = [p.to_dict() for p in report.partings]
        compared = [lane.runtime for lane in lanes if _localises(request, lane)]
        add_version_runs(localisations, compared)
    report.results += suite.extra_results(progress)
    if request.allow_missing_ep:
        report.results = allow_missing(report.results)


def _localises(request: Request, lane: Lane) -> bool:
    return (
        request.localise.when != "never"
        and lane.runtime.consumes == "onnx"
        and not lane.not_applicable
    )


def lane_results(lane: Lane, models, sets, suite: Suite, request: Request) -> list[Result]:
    """The lane's results on `sets`, each stamped with its cell and unit."""
    case, runtime = lane.case, lane.runtime
    if lane.not_applicable:
        # Named at the precision the cell would have run at, like its neighbours in the pivot.
        results = [
            Result(
                case.name,
                case.component,
                runtime.name,
                runtime.ep,
                [],
                s.name,
                "skip",
                f"not applicable: {lane.not_applicable}",
                precision=lane.precision,
            )
            for s in sets
        ]
    else:
        results = suite.run(lane, models, sets, request.strict_placement)
    for r in results:
        r.cell = lane.cell
        r.unit = unit_id(case.name, lane.cell, label(runtime), r.input_set)
    return results


def _settings(
    request: Request, planned: Plan, lanes: list[Lane], mine: list[Unit]
) -> dict[str, object]:
    """What the run's report records of how it was made, beside the suite's own."""
    units = planned.units
    position = {u.id: n for n, u in enumerate(units)}
    axes = request.axes
    return {
        "eps": list(request.runtimes.eps),
        "threads": request.runtimes.threads,  # 0: each runtime's default
        "allow_missing_ep": request.allow_missing_ep,
        "strict_placement": request.strict_placement,
        "runtimes": {label(lane.runtime): lane.runtime.settings() for lane in lanes},
        "runtime_options": request.runtimes.flags(),
        "localise": request.localise.when != "never",
        "matrix": [cell.key for cell in planned.suite.cells(axes)] if axes.matrix else None,
        "units": {
            "total": len(units),
            "sha256": digest(u.id for u in units),
            "shard": f"{request.shard[0]}/{request.shard[1]}" if request.shard else None,
            "ids": [u.id for u in mine],
            # each one's place in the whole run: `report merge` lists shards' results in it
            "positions": [position[u.id] for u in mine],
        },
    }
