"""The sdpa attention kernel as an export variant: its graphs carry ONNX's Attention op at
opset 23, the manifest and the folder record the kernel, they pass verify against the same
goldens, and ONNX Runtime's fused kernel keeps padding, causal and fully masked rows right for
both fills."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tconform import registry
from tconform.config import PRESETS
from tconform.errors import UsageError
from tconform.export import ExportSettings, build_module, export_cases, read_artifacts_manifest

pytestmark = pytest.mark.integration

TINY = PRESETS["tiny"]
SDPA = dict(opset=23, attention="sdpa")


def test_sdpa_graphs_carry_onnx_attention_and_the_manifest_says_so(tmp_path):
    cases = registry.select_cases(["mha_causal", "attention"])
    records = export_cases(cases, ExportSettings(TINY, **SDPA), tmp_path)
    by_case = {r.case: r for r in records}
    ops = Counter(n.op_type for n in onnx.load(by_case["mha_causal"].location).graph.node)
    assert ops["Attention"] == 1 and "Softmax" not in ops
    assert by_case["mha_causal"].attention_nodes == 1
    # The attention case exports its weights too, which the fused op does not give: plain.
    assert by_case["attention"].attention_nodes == 0
    manifest = read_artifacts_manifest(tmp_path)
    assert manifest["attention"] == "sdpa" and manifest["opset"] == 23
    assert manifest["models"]["mha_causal"]["attention"] == "sdpa"
    # One folder holds one kernel's graphs.
    with pytest.raises(UsageError, match="holds dynamo opset 23 float32 sdpa-attention models"):
        export_cases(cases, ExportSettings(TINY, opset=23), tmp_path)


def test_sdpa_needs_the_dynamo_exporter():
    with pytest.raises(UsageError, match="dynamo"):
        ExportSettings(TINY, exporter="torchscript", opset=20, attention="sdpa")


def test_sdpa_models_pass_verify_against_the_float64_goldens(cli, built, tmp_path):
    code, out, err = cli(
        "verify",
        "--golden",
        str(built["golden"]),
        "--artifacts",
        str(tmp_path / "sdpa"),
        "--attention",
        "sdpa",
        "--case",
        "decoder_layer",
        "--case",
        "transformer",
        "--no-doc",
        "--no-torch",
    )  # fmt: skip  (the decoder layer holds causal self- and cross-attention)
    assert code == 0, out + err
    assert "sdpa attention: 2 ONNX Attention nodes" in out + err  # the decoder layer's two
    # The plain folder refuses to be verified as sdpa.
    code, _, err = cli(
        "verify", "--golden", str(built["golden"]), "--artifacts", str(built["artifacts"]),
        "--attention", "sdpa", "--case", "mha_causal", "--no-doc", "--no-export",
    )  # fmt: skip
    assert code == 2 and "plain-attention models" in err


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the oracle's 0/0 rows
@pytest.mark.parametrize("fill", ["-inf", "-1e9"])
def test_onnx_runtime_keeps_every_mask_right_for_both_fills(tmp_path, fill):
    """Padding and causal masks, and a sequence that is all padding (fully masked rows), on
    ONNX Runtime's fused kernel, against the float64 oracle."""
    cfg = TINY.replace(mask_fill=fill)
    case = registry.get_case("mha_causal")
    settings = ExportSettings(cfg, **SDPA)
    (record,) = export_cases((case,), settings, tmp_path)
    inputs = registry.make_inputs(case, cfg, registry.Shape(3, 6, 6), np.random.default_rng(3))
    keep = inputs["tgt_keep"]
    keep[:] = False
    keep[0, :], keep[1, :2] = True, True  # full, padded, and all padding
    session = ort.InferenceSession(record.location, providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, inputs)
    (expected,) = registry.run_oracle(case, cfg, build_module(case, settings)[1], inputs)
    if fill == "-inf":
        assert np.isnan(expected[2]).all() and not np.isnan(expected[:2]).any()
    else:
        assert not np.isnan(expected).any()
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5, equal_nan=True)
