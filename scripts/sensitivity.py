"""How far past the tolerance line each fault of tconform.studies.faults lands
(docs/sensitivity.md).

    python scripts/sensitivity.py [--golden golden] [--fault NAME ...] [--keep DIR]
                                  [--dtype float32|int8|int4|bfloat16]

Exports the cases the faults apply to with the golden folder's config and seed, injects each
fault, runs the faulty model with ONNX Runtime (CPU) on every golden input set and prints a
markdown table: fault, case, expectation, the worst share of tolerance used by the faulty model
and by the clean one, and the verdict. Exit 1 when a measurement contradicts its expectation.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tconform.errors import TconformError
from tconform.studies.fault_catalogue import FAULTS, get_fault
from tconform.studies.sensitivity import format_used, markdown_table, measure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--golden", type=Path, default=Path("golden"))
    parser.add_argument("--fault", action="append", help="only this fault (repeatable)")
    parser.add_argument("--keep", type=Path, help="write the clean and faulty models here")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "int8", "int4", "bfloat16"),
        help="the models' dtype, judged by its own row (int8, int4: faults injected before "
        "quantisation; bfloat16: run on OpenVINO)",
    )
    args = parser.parse_args()
    try:
        faults = [get_fault(n) for n in args.fault] if args.fault else list(FAULTS)
    except LookupError as exc:
        parser.error(str(exc))

    def progress(m) -> None:
        print(f"{m.fault.name} {m.case}: {format_used(m.check.tolerance_used)}", file=sys.stderr)

    with tempfile.TemporaryDirectory() as tmp:
        try:
            measurements = measure(
                args.golden, args.keep or Path(tmp), faults, progress, args.dtype
            )
        except TconformError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
    print(markdown_table(measurements), end="")
    return 0 if all(m.as_expected for m in measurements) else 1


if __name__ == "__main__":
    sys.exit(main())
