"""Faulty models against the committed goldens: every detectable fault fails, every invisible one
passes (as docs/sensitivity.md says), and the model file is never touched by the check."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tconform import golden, registry
from tconform.config import PRESETS
from tconform.files import sha256_file
from tconform.studies import faults, sensitivity
from tconform.studies.fault_catalogue import (
    DETECTABLE,
    FAULTS,
    INVISIBLE,
    MARGIN_FACTOR,
    MARGINAL,
    Fault,
)
from tconform.weights import DEFAULT_SEED

pytestmark = pytest.mark.integration

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CASES = sorted({case for fault in FAULTS for case in fault.cases})


def pairs(expectation: str) -> list:
    return [
        pytest.param(fault, case, id=f"{fault.name}-{case}")
        for fault in FAULTS
        for case in fault.cases
        if fault.expectation(case) == expectation
    ]


def verify_given_model(case: str, model: Path) -> str:
    """'pass' or 'fail': what `tconform verify --model CASE=PATH` says of `model` against the
    committed goldens (exit 0 or 1; anything else fails the test). Its JSON report must be
    strict JSON, even where the model's outputs are NaN or infinite."""
    from tconform.cli import main

    with tempfile.TemporaryDirectory() as reports:  # not beside the model: a folder of models
        report = Path(reports) / "report.json"
        args = ["verify", "--model", f"{case}={model}", "--golden", str(GOLDEN)]
        with pytest.raises(SystemExit) as ended:
            main([*args, "--json", str(report), "--no-doc", "--no-torch", "-q"])
        assert ended.value.code in (0, 1), f"verify --model exited {ended.value.code}"
        json.loads(report.read_text(), parse_constant=refuse_nonfinite)
    return "pass" if ended.value.code == 0 else "fail"


def refuse_nonfinite(token: str) -> None:
    raise AssertionError(f"the report holds {token}, which JSON does not have")


@pytest.fixture(scope="module")
def clean_models(built) -> dict[str, Path]:
    """The cases the faults apply to, exported with the goldens' config and seed: the
    session's tiny exports, once the committed goldens are known to be of that config."""
    manifest = golden.read_golden_manifest(GOLDEN)
    assert golden.manifest_config(manifest) == PRESETS["tiny"]
    assert int(manifest["seed"]) == DEFAULT_SEED
    return {case: built["artifacts"] / case / "model.onnx" for case in CASES}


def faulty_file(fault: Fault, case: str, clean: Path, folder: Path) -> Path:
    """The fault injected into the clean export, written to a file of its own. The injector
    must leave the clean model as it was and really change the graph (an injector that did
    nothing would pass as 'invisible')."""
    model = onnx.load(str(clean))
    before = model.SerializeToString()
    faulty = fault.inject(model)
    assert model.SerializeToString() == before, f"{fault.name} changed its input model"
    assert faulty.SerializeToString() != before, f"{fault.name} changed nothing"
    path = folder / f"{fault.name}-{case}.onnx"
    path.write_bytes(faulty.SerializeToString())
    return path


@pytest.mark.parametrize("case", CASES)
def test_clean_export_passes(case, clean_models):
    # Without this control, a broken export or golden would make every fault look detected.
    assert verify_given_model(case, clean_models[case]) == "pass"


@pytest.mark.parametrize(("fault", "case"), pairs(DETECTABLE))
def test_detectable_fault_fails_and_file_is_untouched(fault, case, clean_models, tmp_path):
    path = faulty_file(fault, case, clean_models[case], tmp_path)
    digest = sha256_file(path)
    assert verify_given_model(case, path) == "fail"
    assert sha256_file(path) == digest


@pytest.mark.parametrize(("fault", "case"), pairs(INVISIBLE))
def test_invisible_fault_stays_within_tolerance(fault, case, clean_models, tmp_path):
    path = faulty_file(fault, case, clean_models[case], tmp_path)
    digest = sha256_file(path)
    assert verify_given_model(case, path) == "pass"
    assert sha256_file(path) == digest


@pytest.mark.parametrize(("fault", "case"), pairs(MARGINAL))
def test_marginal_fault_lands_near_the_line(fault, case, clean_models, tmp_path):
    # The docs call these marginal: within a factor of MARGIN_FACTOR of the tolerance either way.
    path = faulty_file(fault, case, clean_models[case], tmp_path)
    manifest = golden.read_golden_manifest(GOLDEN)
    spec = registry.get_case(case)
    sets = golden.read_case(GOLDEN, manifest, spec, golden.manifest_config(manifest))
    used = sensitivity.check_model(path, spec, sets).tolerance_used
    assert 1 / MARGIN_FACTOR <= used <= MARGIN_FACTOR


def test_scale_weight_by_scope_changes_that_weight_only(clean_models):
    model = onnx.load(str(clean_models["transformer"]))
    scope = "decoder.layers.1.ffn.w2"
    node = faults.find_node(model, "MatMul", scope=scope)
    assert faults.module_of(node) == (scope, "torch.nn.modules.linear.Linear")

    faulty = faults.scale_weight(model, scope, 2.0)

    index = faults.initializer_input(model, node)
    changed = [
        (old, new)
        for old, new in zip(model.graph.node, faulty.graph.node, strict=True)
        if list(old.input) != list(new.input)
    ]
    assert [old.output for old, _ in changed] == [node.output]
    new_weight = numpy_helper.to_array(faults.initializer(faulty, changed[0][1].input[index]))
    np.testing.assert_array_equal(new_weight, 2.0 * faults.constant_input(model, node, index))


def test_find_node_says_what_it_missed(clean_models):
    model = onnx.load(str(clean_models["feed_forward"]))
    with pytest.raises(LookupError, match="op_type='Trilu'"):
        faults.find_node(model, "Trilu")
