"""The headline of a bench run: per case, shape and provider, the fastest verified graph variant
(ONNX Runtime's plain, sdpa, fused, int8 and int4 graphs, OpenVINO's bf16), the precision it
computed in, what it gained over the plain export, and its ratios to torch eager float32 and to
the fastest verified PyTorch engine (eager, torch.compile, int8, bf16 autocast), next to its
share of its precision's GEMM ceiling and its own memory floor. Verified: its outputs passed the
tolerance row of the precision it computed in."""

from __future__ import annotations

from tconform.results import Status
from tconform.runtimes import RUNTIMES, runtime_class

EAGER = "torch"  # torch eager float32: the peer every ratio starts from


def _verified(row: dict) -> bool:
    return row.get("accuracy", {}).get("status") == Status.PASS


def _is_torch(engine: str) -> bool:
    """Whether an engine is one of PyTorch's own (a module runtime)."""
    return engine in RUNTIMES and runtime_class(engine).consumes == "module"


def shape_label(row: dict) -> str:
    """How a row names its shape: a user's model's input set, else BATCHxSEQ."""
    return row.get("input_set") or f"{row['batch']}x{row['seq']}"


def _key(row: dict) -> tuple:
    return row["case"], row.get("input_set"), row["batch"], row["seq"], row["ep"]


def best_variants(rows: list[dict]) -> list[dict]:
    """One entry per case, shape (or input set) and provider where a graph variant's outputs
    passed: the fastest of those. A variant whose outputs were not judged a pass (failed,
    skipped, not judged) never enters it, however fast: a wrong answer timed is no best."""
    # here, not at the top: a report of a run refused before it started (its options) is
    # written without the engines' imports (torch among them, seconds)
    from tconform.bench.engines import BASELINE, IO_BINDING, engine_variant, io_bound

    passed = [r for r in rows if r.get("status") == Status.PASS]
    summary = []
    for key in dict.fromkeys(_key(r) for r in passed):
        of_key = {r["engine"]: r for r in passed if _key(r) == key}
        # each graph variant, on the installed runtime or on a release of it (ENGINE==VERSION),
        # with its outputs copied to numpy or bound on the device (what a GPU deployment runs)
        variants = [r for e, r in of_key.items() if engine_variant(e) is not None and _verified(r)]
        if not variants:
            continue
        best = min(variants, key=lambda r: r["p50_ms"])
        entry: dict[str, object] = {
            "case": best["case"],
            **({"input_set": best["input_set"]} if "input_set" in best else {}),
            "batch": best["batch"],
            "seq": best["seq"],
            "ep": best["ep"],
            "best_engine": best["engine"],
            "attention": best["details"].get("attention"),
            # what ran: the precision it computed in, not the export's dtype (openvino-bf16
            # runs the float32 export in bfloat16)
            "dtype": best.get("precision", "float32"),
            "export_dtype": best["details"].get("dtype", "float32"),
            "p50_ms": best["p50_ms"],
            "peak_fraction": best.get("peak_fraction"),
        }
        plain = BASELINE + IO_BINDING if io_bound(best["engine"]) else BASELINE  # like for like
        if plain in of_key:
            entry["plain_engine"] = plain
            entry["plain_p50_ms"] = of_key[plain]["p50_ms"]
            entry["gain_over_plain"] = _kept(of_key[plain]["p50_ms"] / best["p50_ms"])
        if EAGER in of_key:
            entry["torch_p50_ms"] = of_key[EAGER]["p50_ms"]
            entry["vs_torch"] = _kept(best["p50_ms"] / of_key[EAGER]["p50_ms"])
        torch_rows = [r for e, r in of_key.items() if _is_torch(e) and _verified(r)]
        if torch_rows:
            peer = min(torch_rows, key=lambda r: r["p50_ms"])
            entry["best_torch_engine"] = peer["engine"]
            entry["best_torch_dtype"] = peer.get("precision", "float32")
            entry["best_torch_p50_ms"] = peer["p50_ms"]
            entry["vs_best_torch"] = _kept(best["p50_ms"] / peer["p50_ms"])
        if best.get("memory_floor_ms"):
            entry["memory_floor_ms"] = best["memory_floor_ms"]
            entry["vs_memory_floor"] = _kept(best["p50_ms"] / best["memory_floor_ms"])
        if "outside_matmul_share" in best:
            entry["outside_matmul_share"] = best["outside_matmul_share"]
        summary.append(entry)
    return summary


def _kept(value: float) -> float:
    """A ratio as the report keeps it: three places, or three significant digits below 0.1
    (rounded to places, a model timed in microseconds against torch's milliseconds was 0)."""
    return round(value, 3) if value >= 0.1 else float(f"{value:.3g}")


def ratio(value: float) -> str:
    """A ratio of times as the summaries print it: two decimals, or two significant digits
    below 0.1 (a model timed in microseconds against torch's milliseconds is not "0.00")."""
    return f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"


def summary_lines(summary: list[dict]) -> list[str]:
    """One line per entry: best variant and what it ran in, gain over plain, ratios to torch
    eager and to PyTorch's fastest verified engine, and the bounds."""
    lines = []
    for s in summary:
        parts = [f"best {s['best_engine']} ({s['dtype']}) p50 {s['p50_ms']} ms"]
        if "gain_over_plain" in s and s["p50_ms"] != s["plain_p50_ms"]:  # not plain itself
            gain = ratio(s["gain_over_plain"])
            parts.append(f"{gain}x faster than {s['plain_engine']} ({s['plain_p50_ms']} ms)")
        if "vs_torch" in s:
            parts.append(f"{ratio(s['vs_torch'])}x torch eager float32")
        if "vs_best_torch" in s:
            parts.append(
                f"{ratio(s['vs_best_torch'])}x the fastest verified torch engine "
                f"({s['best_torch_engine']}, {s['best_torch_p50_ms']} ms)"
            )
        if s.get("peak_fraction") is not None:
            parts.append(f"{100 * s['peak_fraction']:.0f}% of the {s['dtype']} GEMM ceiling")
        if "vs_memory_floor" in s:
            parts.append(f"{ratio(s['vs_memory_floor'])}x memory floor")
        if "outside_matmul_share" in s:
            parts.append(f"{100 * s['outside_matmul_share']:.0f}% outside matrix products")
        lines.append(f"{s['case']} {shape_label(s)} {s['ep']}: " + ", ".join(parts))
    return lines
