"""The scoreboard of runtime releases (docs/versions.md): which releases of ONNX Runtime and
OpenVINO load tconform's exports, and how far each one's outputs lie from the exact goldens, on
the tiny goldens (float32, float16 and int8 exports, every graph-optimisation level), on the
whole model at the base preset (1x32 and 8x128), and on the zoo models of tests/zoo.

    python scripts/versions_scoreboard.py                   # correctness: every step
    python scripts/versions_scoreboard.py --steps base --timing   # p50s, on a quiet machine
    python scripts/versions_scoreboard.py --steps summary   # results/versions/scoreboard.md

Each step is one tconform command over every release at once (`--runtime onnxruntime==X` for
each), its JSON report kept in artifacts/versions/; `summary` reads them back into the tables of
results/versions/scoreboard.md and keeps beside it a compact copy of each report (what the
tables read: statuses, errors, versions; no machine's paths).
Environments are made on first use (tconform.runtimes.environments; uv makes each in seconds).
Without --timing the base step times one run per engine (its outputs are judged all the same):
latencies measured on a shared machine are no finding. Run from the repository root, with the
tiny goldens (golden/) and their exports (artifacts/; `tconform verify` makes them).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

REPORTS = Path("artifacts/versions")  # the commands' own reports
OUT = Path("results/versions")  # the scoreboard and the compact copies it is made from
ORT = "onnxruntime"
OV = "openvino"
# From the oldest release that loads the exports to the newest (1.17.3: IR version 10 is beyond
# it); the installed one (tconform's own) joins as plain `onnxruntime`.
ORT_RELEASES = (
    "1.17.3", "1.18.1", "1.19.2", "1.20.1", "1.21.0", "1.22.1", "1.23.2", "1.24.4", "1.28.0",
    "1.32.0",
)  # fmt: skip
OV_RELEASES = ("2024.6.0", "2025.4.0")  # and the installed one, the newest (2026.4)
ZOO = (
    "bert", "gpt2", "bart", "t5", "vit", "llama", "torch_encoder", "resnet", "inplace_mlp",
)  # fmt: skip
STEPS = ("loads", "tiny", "reduced", "graph_opts", "base", "zoo", "summary")


def tconform(*args: str) -> tuple[int, str]:
    """Run `python -m tconform ARGS`; (exit code, its last line on stderr)."""
    print("$ tconform " + " ".join(args), flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "tconform", *args], stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return done.returncode, lines[-1] if lines else ""


def specs(runtime: str, releases: tuple[str, ...]) -> list[str]:
    return [f"{runtime}=={r}" for r in releases] + [runtime]


def loading(runtime: str) -> list[str]:
    """The specs of `runtime` whose release loads the exports (the loads step's record)."""
    record = json.loads((OUT / "loads.json").read_text())
    return [s for s, found in record.items() if found["loads"] and s.startswith(runtime)]


def _load_verdict(code: int, why: str, report: Path) -> dict[str, object]:
    """Whether a release loaded the whole tiny model, and what became of it: it ran (exit 0
    or 1), it loaded but lacks a kernel (every row a skip naming it), or it did not load (exit
    2, the runtime's own reason)."""
    results = json.loads(report.read_text())["results"] if report.is_file() else []
    lacks = sorted({r["message"] for r in results if r["status"] == "skip"})
    return {
        "loads": code in (0, 1) or bool(lacks),
        "runs": code in (0, 1),
        "exit_code": code,
        "why": "; ".join(lacks)
        if lacks
        else ("" if code < 2 else why.removeprefix("tconform: error: ")),
    }


def runtime_args(chosen: list[str], flag: str = "--runtime") -> list[str]:
    return [part for spec in chosen for part in (flag, spec)]


def step_loads() -> None:
    """Each release on the whole tiny model alone: does it load the export, and if not, why."""
    record = {}
    for spec in specs(ORT, ORT_RELEASES) + specs(OV, OV_RELEASES):
        report = REPORTS / "loads" / f"{spec.replace('==', '-')}.json"
        report.parent.mkdir(parents=True, exist_ok=True)
        code, last = tconform(
            "verify", "--no-doc", "--no-export", "--case", "transformer", "--runtime", spec,
            "--json", str(report),
        )  # fmt: skip
        record[spec] = _load_verdict(code, last, report)
    (OUT / "loads.json").write_text(json.dumps(record, indent=2) + "\n")


def step_tiny() -> None:
    for runtime in (ORT, OV):
        tconform(
            "verify", "--no-doc", "--no-export", *runtime_args(loading(runtime)),
            "--json", str(REPORTS / f"tiny-{runtime}.json"),
        )  # fmt: skip


def step_reduced() -> None:
    """float16 and int8 exports (tconform export --dtype), every case, every release."""
    tconform(
        "verify", "--no-doc", "--matrix", "--dtype", "float16,int8", *runtime_args(loading(ORT)),
        "--json", str(REPORTS / "tiny-reduced-onnxruntime.json"),
    )  # fmt: skip


def step_graph_opts() -> None:
    """The float32 exports at ONNX Runtime's other graph-optimisation levels."""
    tconform(
        "verify", "--no-doc", "--matrix", "--graph-opts", "disable,basic,extended",
        *runtime_args(loading(ORT)), "--json", str(REPORTS / "tiny-graph-opts-onnxruntime.json"),
    )  # fmt: skip


def step_base(timing: bool) -> None:
    """The whole model at the base preset, 1x32 and 8x128: bench's accuracy judgement (the
    float64 oracle) per release, and with --timing its p50s."""
    how = ["--seconds", "10"] if timing else ["--runs", "1", "--warmup", "0"]
    suffix = "" if timing else "-accuracy"
    for runtime in (ORT, OV):
        tconform(
            "bench", "--preset", "base", "--case", "transformer", "--shape", "1x32",
            "--shape", "8x128", "--ep", "cpu", *how, *runtime_args(loading(runtime), "--engine"),
            "--json", str(REPORTS / f"base-{runtime}{suffix}.json"),
        )  # fmt: skip


def step_zoo() -> None:
    for name in ZOO:
        (REPORTS / "zoo").mkdir(parents=True, exist_ok=True)
        tconform(
            "check", f"tests.zoo.models:{name}", *runtime_args(loading(ORT)),
            "--localise", "always", "--out", str(Path("artifacts/check/versions") / name),
            "--json", str(REPORTS / "zoo" / f"{name}.json"), "-q",
        )  # fmt: skip


# --- the summary: results/versions/scoreboard.md from the reports above --------------------------


def _release(spec: str, settings: dict) -> str:
    """A spec's release number, as the run's settings record it (the installed one's too)."""
    for label, own in settings.get("runtimes", {}).items():
        if label.split(" ")[0] in (spec.replace(ORT, "ort-cpu"), spec):
            number = str(own.get(ORT) or own.get(OV) or "")
            return number.split("-")[0] or spec
    return spec.partition("==")[2] or spec


def _order(release: str) -> tuple:
    """A release as a sort key (1.9 < 1.10; a name that is no number last)."""
    parts = release.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (1 << 30,)


def _short(why: str) -> str:
    """A load failure's cause without ONNX Runtime's source location."""
    found = re.search(r"(Unsupported model IR version[^|]*)", why)
    return found.group(1).strip() if found else why


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def _worst(results: list[dict], spec: str, case: str, output: str | None = None) -> str:
    """The worst max abs error of `spec` on `case` over its input sets (and cells), or the
    worst status where nothing was compared."""
    mine = [r for r in results if r["runtime"] == spec and r["case"] == case]
    errors = [
        o["max_abs_err"]
        for r in mine
        for o in r["outputs"]
        if (output is None or o["name"] == output) and o["max_abs_err"] is not None
    ]
    failing = {r["status"] for r in mine} - {"pass", "tie"}
    mark = f" **{'/'.join(sorted(failing)).upper()}**" if failing else ""
    if errors:
        return f"{max(errors):.2e}{mark}"
    return "/".join(sorted({r["status"] for r in mine})) or "-"


def _identical(results: list[dict], specs: list[str], names: dict[str, str]) -> list[str]:
    """Releases whose error figures coincide on every output of every input set: one line per
    group (equal figures on every statistic: the same outputs but for a coincidence)."""

    def figures(spec: str) -> tuple:
        return tuple(
            (r["case"], r["cell"], r["input_set"], o["name"], o["max_abs_err"], o["mean_abs_err"])
            for r in sorted(
                (r for r in results if r["runtime"] == spec),
                key=lambda r: (r["case"], r["cell"], r["input_set"]),
            )
            for o in r["outputs"]
        )

    groups: dict[tuple, list[str]] = {}
    for spec in specs:
        groups.setdefault(figures(spec), []).append(names[spec])
    return [", ".join(group) for group in groups.values()]


def _run_section(title: str, path: Path, intro: str) -> list[str]:
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    results = data["results"]
    names = {s: _release(s, data["settings"]) for s in {r["runtime"] for r in results}}
    specs = sorted(names, key=lambda s: _order(names[s]))
    cases = list(dict.fromkeys(r["case"] for r in results if not r["case"].startswith("doc:")))
    lines = [f"### {title}", "", intro, ""]
    rows = [[case, *(_worst(results, s, case) for s in specs)] for case in cases]
    verdicts = []
    for s in specs:
        mine = [r for r in results if r["runtime"] == s]
        passed = sum(r["status"] == "pass" for r in mine)
        verdicts.append(f"{passed}/{len(mine)} pass")
    rows.append(["**verdicts**", *verdicts])
    lines += _table(["case", *(names[s] for s in specs)], rows)
    lines += ["", "Identical figures (every output, input set and cell): "]
    lines += [f"- {group}" for group in _identical(results, specs, names)]
    changes = [
        f"- {row['case']} {row['cell']} {row['input_set']} {row['output']}: {row['change']}"
        for group in data.get("versions", [])
        for row in group["rows"]
        if row["change"]
    ]
    lines += ["", "Regressions and fixes: " + ("none" if not changes else ""), *changes, ""]
    return lines


def _scrubbed(text: str) -> str:
    """A report's text without this machine's paths: the environments' folder, this checkout,
    the interpreter's prefix and the home folder become names."""
    from tconform.runtimes.environments import cache_root

    for path, name in (
        (str(cache_root()), "$TCONFORM_RUNTIME_CACHE"),
        (str(Path.cwd()) + "/", ""),
        (sys.prefix, "$PYTHON_PREFIX"),
        (str(Path.home()), "~"),
    ):
        text = text.replace(path, name)
    return text


def _compact(data: dict) -> dict:
    """What the tables read of a report: per result its status, message and each output's
    errors; the runtimes' versions; the changed rows of the versions comparison; partings."""
    keep_output = ("name", "status", "max_abs_err", "mean_abs_err", "tolerance_used")
    if data.get("tool") == "tconform bench":
        rows = [
            {
                **{k: r.get(k) for k in ("case", "engine", "ep", "batch", "seq", "status")},
                **({"reason": r["reason"]} if "reason" in r else {}),
                "p50_ms": r.get("p50_ms"),
                "accuracy": {
                    k: r.get("accuracy", {}).get(k) for k in ("status", "max_abs_err", "atol")
                },
                "details": {
                    k: v
                    for k, v in r.get("details", {}).items()
                    if k in ("precision", "node_precisions", "layer_precisions", "versions")
                },
            }
            for r in data["results"]
        ]
        return {"tool": data["tool"], "settings": data.get("settings"), "results": rows}
    runtimes = {
        label: {k: v for k, v in own.items() if k in (ORT, OV, "spec", "worker")}
        for label, own in data.get("settings", {}).get("runtimes", {}).items()
    }
    results = [
        {
            **{k: r[k] for k in ("case", "cell", "input_set", "runtime", "ep", "status")},
            "message": r["message"][:300],
            "outputs": [{k: o.get(k) for k in keep_output} for o in r["outputs"]],
        }
        for r in data["results"]
    ]
    versions = [
        {**group, "rows": [row for row in group["rows"] if row["change"]]}
        for group in data.get("versions", [])
    ]
    partings = data.get("details", {}).get("version_partings")
    return {
        "tool": data.get("tool"),
        "command": data.get("command"),
        "exit_code": data.get("exit_code"),
        "error": data.get("error"),
        "settings": {"runtimes": runtimes},
        "results": results,
        "versions": versions,
        **({"details": {"version_partings": partings}} if partings else {}),
    }


def _compact_all() -> None:
    """A compact, path-free copy in results/versions/ of each report of artifacts/versions/."""
    for path in sorted(REPORTS.rglob("*.json")):
        target = OUT / path.relative_to(REPORTS)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = _compact(json.loads(path.read_text()))
        target.write_text(_scrubbed(json.dumps(data, indent=1)) + "\n")
    loads = OUT / "loads.json"
    if loads.is_file():
        loads.write_text(_scrubbed(loads.read_text()))


def write_summary() -> None:
    """results/versions/scoreboard.md: one table per step, from the compact reports."""
    _compact_all()
    lines = ["# Runtime releases against the exact goldens", ""]
    loads = OUT / "loads.json"
    if loads.is_file():
        record = json.loads(loads.read_text())
        rows = [
            [
                spec,
                "yes" if r["loads"] else "no",
                "yes" if r["runs"] else "no",
                _short(r["why"]) or "-",
            ]
            for spec, r in record.items()
        ]
        lines += ["### Loads the exports (the whole tiny model)", ""]
        lines += [*_table(["release", "loads", "runs", "why not"], rows), ""]
    for runtime in (ORT, OV):
        lines += _run_section(
            f"{runtime}: tiny goldens, float32",
            OUT / f"tiny-{runtime}.json",
            "Worst max abs error over the three input sets of each case (every output); "
            "**FAIL** where a set is outside the float32 row.",
        )
    lines += _run_section(
        "onnxruntime: float16 and int8 exports",
        OUT / "tiny-reduced-onnxruntime.json",
        "Worst over both dtypes and the input sets; each dtype judged by its own row.",
    )
    lines += _run_section(
        "onnxruntime: graph-optimisation levels disable, basic, extended",
        OUT / "tiny-graph-opts-onnxruntime.json",
        "Worst over the three levels and the input sets (the float32 export).",
    )
    lines += _base_section()
    lines += _zoo_section()
    (OUT / "scoreboard.md").write_text("\n".join(lines) + "\n")


def _base_section() -> list[str]:
    lines = []
    for runtime in (ORT, OV):
        for suffix, what in (("-accuracy", "accuracy"), ("", "p50")):
            path = OUT / f"base-{runtime}{suffix}.json"
            if not path.is_file():
                continue
            rows_by = json.loads(path.read_text())["results"]
            lines += [f"### {runtime}: the whole model at base ({what})", ""]
            rows = []
            for r in rows_by:
                accuracy = r.get("accuracy", {})
                worst = accuracy.get("max_abs_err")
                evidence = r.get("details", {}).get("node_precisions")
                rows.append(
                    [
                        r["engine"],
                        f"{r['batch']}x{r['seq']}",
                        r["status"],
                        f"{worst:.2e}" if worst is not None else "-",
                        str(accuracy.get("status", "-")),
                        str(r.get("p50_ms", "-")) if what == "p50" else "(not timed)",
                        ", ".join(f"{p} {n}" for p, n in (evidence or {}).items()) or "-",
                    ]
                )
            header = [
                "engine",
                "shape",
                "ran",
                "max abs err",
                "verdict",
                "p50 ms",
                "nodes by precision",
            ]
            lines += [*_table(header, rows), ""]
    return lines


def _pair(parting: dict) -> str:
    older, newer = (label.partition("==")[2] or "installed" for label in parting["runtimes"])
    return f"{older} -> {newer}"


def _zoo_section() -> list[str]:
    folder = OUT / "zoo"
    if not folder.is_dir():
        return []
    lines = ["### Zoo models (tconform check, float64 copy as the reference)", ""]
    rows, header = [], None
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        results = data["results"]
        names = {s: _release(s, data["settings"]) for s in {r["runtime"] for r in results}}
        specs = sorted(names, key=lambda s: _order(names[s]))
        header = header or [
            "model",
            *(names[s] for s in specs),
            "where consecutive releases part (localisation runs; elsewhere identical)",
        ]
        partings = data.get("details", {}).get("version_partings", [])
        parted = "; ".join(
            f"{_pair(p)}: `{p['module']}`" + (f" ({p['nearer']} nearer)" if p["nearer"] else "")
            for p in partings
            if p["module"]
        )
        rows.append([path.stem, *(_worst(results, s, results[0]["case"]) for s in specs), parted])
    return lines + _table(header or ["model"], rows) + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default=",".join(STEPS), help=f"from {', '.join(STEPS)}")
    parser.add_argument("--timing", action="store_true", help="base: p50s (a quiet machine)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    REPORTS.mkdir(parents=True, exist_ok=True)
    for step in args.steps.split(","):
        if step == "base":
            step_base(args.timing)
        elif step == "summary":
            write_summary()
        else:
            globals()[f"step_{step}"]()


if __name__ == "__main__":
    main()
