"""The documents' numbers and properties through ONNX Runtime and torch, and the CLI."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tconform.commands.doc import doc
from tconform.doc import checks, properties, report_results, run_document_checks, worked
from tconform.doc.run import OpenedComponents, RuntimeOutcome, doc_runtimes
from tconform.runtimes import RuntimeOptions
from tconform.runtimes.providers import available_eps, unavailable_reason

pytestmark = pytest.mark.integration

FAST = settings(max_examples=25, deadline=None)
FLOAT32_LIMIT = properties.LIMITS["float32"]
RUNTIMES = ["ort-cpu", "torch"]
WITH_RUNTIME = [c for c in worked.document_cases() if c.runtime is not None]


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("case", WITH_RUNTIME, ids=lambda c: c.id)
def test_document_numbers_through_the_components_match_the_oracle(components, case, runtime):
    outcome = components.run_check(runtime, case.runtime)
    assert outcome.status == "pass", outcome.message
    assert outcome.max_abs_err is not None and outcome.max_abs_err < 3e-6


@pytest.mark.parametrize("ep", [ep for ep in available_eps() if ep != "cpu"])
def test_a_provider_that_cannot_run_is_unavailable_never_pass(components, ep):
    on_ep = OpenedComponents(
        components.artifacts_dir, runtimes=doc_runtimes(RuntimeOptions(eps=(ep,)))
    )
    outcome = on_ep.run_check(f"ort-{ep}", WITH_RUNTIME[0].runtime)
    expected = "unavailable" if unavailable_reason(ep) else "pass"
    assert outcome.status == expected, outcome.message


@FAST
@given(seed=st.integers(0, 10_000), tgt=st.integers(1, 6), src=st.integers(1, 6))
def test_ort_attention_rows_sum_to_one(components, seed, tgt, src):
    feeds = checks.draw_inputs("attention", 1, src, tgt, seed)
    feeds["mask"][:] = True  # every key visible, so every column has weight for the broken check
    weights = checks.run_component(components, "ort-cpu", "attention", feeds)[1].astype(np.float64)
    assert properties.softmax_row_violation(weights) <= FLOAT32_LIMIT
    if tgt > 1:  # the same check catches weights normalised along the wrong axis
        wrong = weights / weights.sum(axis=-2, keepdims=True)
        assert properties.softmax_row_violation(wrong) > FLOAT32_LIMIT


@FAST
@given(ids=st.lists(st.integers(0, checks.PROPERTY_CONFIG.tgt_vocab - 1), min_size=2, max_size=6))
def test_exported_transformer_hides_the_future(components, ids):
    src = np.arange(4)[None] % checks.PROPERTY_CONFIG.src_vocab
    run = checks.transformer_run(components, "ort-cpu", src)
    tgt = np.array([ids])
    assert properties.causal_violation(run, tgt, checks.PROPERTY_CONFIG.tgt_vocab) <= FLOAT32_LIMIT

    def leaky(tgt_ids):  # broken: every position also sees the sequence's last token
        out = run(tgt_ids)
        return out + out[:, -1:]

    assert properties.causal_violation(leaky, tgt, checks.PROPERTY_CONFIG.tgt_vocab) > 1e-3


def test_every_property_passes_on_every_runtime(components):
    for outcome in checks.property_outcomes(components, RUNTIMES):
        assert outcome.status == "pass", (outcome.id, outcome.runtime, outcome.violation)


def test_cli_table_json_and_exit_code(components, tmp_path):
    out = tmp_path / "doc.json"
    args = ["--artifacts", str(components.artifacts_dir), "--ep", "cpu", "--json", str(out)]
    result = CliRunner().invoke(doc, args)
    assert result.exit_code == 0, result.output
    assert "000-attention-scores" in result.output and "erratum" in result.output
    data = json.loads(out.read_text())
    assert data["command"] == "doc" and data["exit_code"] == 0 and data["environment"]["cpu"]
    assert {r["case"] for r in data["results"]} >= {"doc:000-attention-scores"}
    oracle_runs = [r for r in data["results"] if r["runtime"] == "oracle" and r["outputs"]]
    assert oracle_runs and all(r["model"]["origin"] == "oracle" for r in oracle_runs)
    assert all(r["model"]["sha256"] and r["model"]["path"] for r in oracle_runs)
    scores = next(c for c in data["details"]["cases"] if c["id"] == "000-attention-scores")
    assert {
        "id",
        "source",
        "section",
        "quantity",
        "printed",
        "exact",
        "decimals",
        "verdict",
        "note",
        "runtimes",
    } <= set(scores)
    weights = next(c for c in data["details"]["cases"] if c["id"] == "000-attention-weights")
    assert weights["runtimes"]["ort-cpu"]["status"] == "pass"


def test_cli_exits_1_when_a_runtime_disagrees(components, monkeypatch):
    monkeypatch.setattr(
        "tconform.doc.run.OpenedComponents.run_check",
        lambda self, *args: RuntimeOutcome("fail", 1.0, "forced disagreement"),
    )
    result = CliRunner().invoke(doc, ["--artifacts", str(components.artifacts_dir), "--ep", "cpu"])
    assert result.exit_code == 1


def test_verify_results_one_per_case_or_property_and_runtime(components):
    report = run_document_checks(RuntimeOptions(), components.artifacts_dir)
    results = report_results(report)
    assert {r.status for r in results} <= {"pass", "fail", "unavailable", "skip", "error"}
    assert all(r.case.startswith("doc:") and r.component == "document check" for r in results)
    ort = [
        r for r in results if r.case == "doc:000-attention-weights" and r.runtime == "onnxruntime"
    ]
    assert len(ort) == 1 and ort[0].status == "pass" and ort[0].ep == "cpu"
    assert any(r.case == "doc:property-causal-mask" and r.runtime == "torch" for r in results)
