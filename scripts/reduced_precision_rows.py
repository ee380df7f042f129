"""The measurement behind the int8 and bfloat16 tolerance rows (docs/tolerances.md).

    python scripts/reduced_precision_rows.py [--golden golden] [--dtype int8 --dtype bfloat16
                                             --dtype int4]
                                             [--out results/reduced-precision/rows]

Exports every golden case at each dtype with the golden folder's config and seed (as
scripts/sensitivity.py does), runs it on every runtime that has its kernels (ONNX Runtime's
CPU provider and OpenVINO in f32; a runtime without the kernels says so and is left out) on
every golden input set, and records per output:

- "needed": the smallest t with |err| <= t + t*|golden| for every element, i.e. the row
  Tolerance(t, t) the run would just pass (the share of Tolerance(1, 1) used);
- the SQNR against the golden in dB.

Per tolerance class it prints the worst "needed" and the lowest SQNR next to the row in
tconform.compare.TOLERANCES, and the share of each the clean models use. Writes OUT.json and
OUT.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from collections import defaultdict
from importlib import metadata
from pathlib import Path

from tconform import golden, registry
from tconform.compare import ROW_OUTPUT_RMS, TOLERANCES, Tolerance, judge_outputs, tolerance_for
from tconform.execution import Subject, execute
from tconform.models import derived_file
from tconform.results import Result, Status
from tconform.runtimes import make_runtime
from tconform.studies.sensitivity import export_models, format_sqnr
from tconform.versions import cpu_name, library_versions

RUNTIMES = ("onnxruntime", "openvino")
# Tolerance(1, 1), its atol scaled to each output's RMS as a row's is: the share of it an
# output uses is the t of the row it would just pass.
UNIT = Tolerance(1.0, 1.0, "the needed t is this row's share used", atol_rms=ROW_OUTPUT_RMS)


def measure(golden_dir: Path, dtype: str, work: Path) -> list[dict]:
    manifest = golden.read_golden_manifest(golden_dir)
    cfg = golden.manifest_config(manifest)
    cases = [c for c in registry.CASES if c.name in manifest["cases"]]
    models = export_models([c.name for c in cases], golden_dir, work / dtype, dtype)
    rows = []
    for case in cases:
        sets = golden.read_case(golden_dir, manifest, case, cfg)
        for runtime in RUNTIMES:
            results = execute(
                make_runtime(runtime),
                Subject(derived_file(models[case.name])),
                sets,
                judge_outputs(lambda _precision, _name: UNIT),
                Result.about(case.name, case.component),
            )
            for result in results:
                if result.status == Status.SKIP:
                    print(f"  {case.name} {runtime}: {result.message}", file=sys.stderr)
                    break
                for out in result.outputs:
                    rows.append(
                        {
                            "case": case.name,
                            "class": case.tolerance,
                            "runtime": runtime,
                            "precision": result.precision,
                            "input_set": result.input_set,
                            "output": out.name,
                            "needed": out.tolerance_used,
                            "sqnr_db": out.sqnr_db,
                        }
                    )
            print(f"  {dtype} {case.name} {runtime}: done", file=sys.stderr)
    return rows


def by_class(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """(precision, class) -> the worst needed t and the lowest SQNR, with where they were."""
    worst: dict[tuple[str, str], dict] = defaultdict(
        lambda: {"needed": 0.0, "needed_at": "", "sqnr_db": None, "sqnr_at": ""}
    )
    for row in rows:
        entry = worst[(row["precision"], row["class"])]
        at = f"{row['case']}/{row['output']} on {row['runtime']}"
        if row["needed"] > entry["needed"]:
            entry.update(needed=row["needed"], needed_at=at)
        if row["sqnr_db"] is not None and (
            entry["sqnr_db"] is None or row["sqnr_db"] < entry["sqnr_db"]
        ):
            entry.update(sqnr_db=row["sqnr_db"], sqnr_at=at)
    return dict(worst)


def markdown(worst: dict[tuple[str, str], dict]) -> str:
    lines = [
        "| precision | class | worst needed t (where) | row atol = rtol | share | "
        "lowest SQNR dB (where) | row floor dB | margin dB |",
        "|---|---|---|---:|---:|---|---:|---:|",
    ]
    for (precision, klass), entry in sorted(worst.items()):
        if (precision, klass) not in TOLERANCES:  # a precision being measured for its first row
            lines.append(
                f"| {precision} | {klass} | {entry['needed']:.3g} ({entry['needed_at']}) | "
                f"no row yet | - | {format_sqnr(entry['sqnr_db'])} ({entry['sqnr_at']}) | - | - |"
            )
            continue
        row = tolerance_for(precision, klass)
        floor = row.min_sqnr_db
        margin = (
            f"{entry['sqnr_db'] - floor:.1f}"
            if floor is not None and entry["sqnr_db"] is not None
            else "-"
        )
        lines.append(
            f"| {precision} | {klass} | {entry['needed']:.3g} ({entry['needed_at']}) | "
            f"{row.atol:g} | {entry['needed'] / row.atol:.0%} | "
            f"{format_sqnr(entry['sqnr_db'])} ({entry['sqnr_at']}) | "
            f"{'-' if floor is None else f'{floor:g}'} | {margin} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--golden", type=Path, default=Path("golden"))
    parser.add_argument("--dtype", action="append", choices=("int8", "bfloat16", "int4"))
    parser.add_argument("--out", type=Path, default=Path("results/reduced-precision/rows"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtype or ("int8", "bfloat16", "int4"):
            rows += measure(args.golden, dtype, Path(tmp))
    worst = by_class(rows)
    table = markdown(worst)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    about = {
        "command": shlex.join(["python", "scripts/reduced_precision_rows.py", *sys.argv[1:]]),
        "cpu": cpu_name(),
        "versions": {**library_versions(), "openvino": metadata.version("openvino")},
    }
    args.out.with_suffix(".json").write_text(json.dumps({**about, "rows": rows}, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(
        f"`{about['command']}` on {about['cpu']} ({about['versions']})\n\n{table}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
