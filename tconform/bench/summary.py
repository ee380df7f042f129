"""The headline of a bench run: per case, shape and provider, the fastest graph variant (ONNX
Runtime's plain, sdpa, fused and int8 graphs, OpenVINO's bf16) and what it gained over the
plain export, next to torch eager, the GEMM ceiling and the variant's own memory floor."""

from __future__ import annotations

from tconform.bench.engines import BASELINE, GRAPH_VARIANTS
from tconform.results import Status


def best_variants(rows: list[dict]) -> list[dict]:
    """One entry per (case, batch, seq, ep) where a graph variant ran."""
    passed = [r for r in rows if r.get("status") == Status.PASS]
    keys = dict.fromkeys((r["case"], r["batch"], r["seq"], r["ep"]) for r in passed)
    summary = []
    for key in keys:
        of_key = {
            r["engine"]: r for r in passed if (r["case"], r["batch"], r["seq"], r["ep"]) == key
        }
        variants = [of_key[e] for e in GRAPH_VARIANTS if e in of_key]
        if not variants:
            continue
        best = min(variants, key=lambda r: r["p50_ms"])
        entry: dict[str, object] = {
            "case": key[0],
            "batch": key[1],
            "seq": key[2],
            "ep": key[3],
            "best_engine": best["engine"],
            "attention": best["details"].get("attention"),
            "dtype": best["details"].get("dtype", "float32"),
            "p50_ms": best["p50_ms"],
            "peak_fraction": best.get("peak_fraction"),
        }
        if BASELINE in of_key:
            entry["plain_p50_ms"] = of_key[BASELINE]["p50_ms"]
            entry["gain_over_plain"] = round(of_key[BASELINE]["p50_ms"] / best["p50_ms"], 3)
        if "torch" in of_key:
            entry["torch_p50_ms"] = of_key["torch"]["p50_ms"]
            entry["vs_torch"] = round(best["p50_ms"] / of_key["torch"]["p50_ms"], 3)
        if best.get("memory_floor_ms"):
            entry["memory_floor_ms"] = best["memory_floor_ms"]
            entry["vs_memory_floor"] = round(best["p50_ms"] / best["memory_floor_ms"], 3)
        if "accuracy" in best:
            entry["accuracy"] = best["accuracy"]["status"]
        if "outside_matmul_share" in best:
            entry["outside_matmul_share"] = best["outside_matmul_share"]
        summary.append(entry)
    return summary


def summary_lines(summary: list[dict]) -> list[str]:
    """One line per entry: best variant, gain over plain, ratios to torch and the bounds."""
    lines = []
    for s in summary:
        parts = [f"best {s['best_engine']} p50 {s['p50_ms']} ms"]
        if s.get("accuracy") not in (None, Status.PASS):
            parts.append(f"outputs judged: {s['accuracy']}")
        if "gain_over_plain" in s:
            parts.append(f"{s['gain_over_plain']:.2f}x faster than plain ({s['plain_p50_ms']} ms)")
        if "vs_torch" in s:
            parts.append(f"{s['vs_torch']:.2f}x torch eager")
        if s.get("peak_fraction") is not None:
            parts.append(f"{100 * s['peak_fraction']:.0f}% of GEMM ceiling")
        if "vs_memory_floor" in s:
            parts.append(f"{s['vs_memory_floor']:.2f}x memory floor")
        if "outside_matmul_share" in s:
            parts.append(f"{100 * s['outside_matmul_share']:.0f}% outside matrix products")
        lines.append(f"{s['case']} {s['batch']}x{s['seq']} {s['ep']}: " + ", ".join(parts))
    return lines
