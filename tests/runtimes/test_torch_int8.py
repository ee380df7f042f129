"""torch-int8: the reference module with its Linear layers dynamically quantised by
torch.ao.quantization, run eagerly; it says it computes in int8 (its tolerance row)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tconform import registry
from tconform.config import PRESETS
from tconform.execution import Subject, case_module, open_subject
from tconform.export import ExportSettings, build_module, example_shape
from tconform.runtimes import make_runtime
from tconform.runtimes.torch_session import prepared

TINY = PRESETS["tiny"]


@pytest.mark.unit
def test_every_linear_is_quantised_and_the_session_computes_in_int8():
    case = registry.get_case("feed_forward")
    _, params = build_module(case, ExportSettings(TINY))
    subject = Subject(module=case_module(case, TINY, params))
    feeds = registry.make_inputs(case, TINY, example_shape(TINY), np.random.default_rng(0))
    runtime = make_runtime("torch-int8")
    with open_subject(runtime, subject) as opened:
        module = opened.session.module
        assert not any(type(m) is torch.nn.Linear for m in module.modules())
        dynamic = torch.ao.nn.quantized.dynamic.Linear
        quantised = [m for m in module.modules() if isinstance(m, dynamic)]
        assert len(quantised) == 2  # the feed-forward's two Linear layers
        assert opened.precision == "int8"
        (out,) = opened.run(feeds).values()
    with open_subject(make_runtime("torch"), subject) as eager:
        (reference,) = eager.run(feeds).values()
    assert out.dtype == np.float32 and out.shape == reference.shape
    assert 0 < np.abs(out - reference).max() < 0.1  # quantisation noise, not another function
    assert runtime.settings()["quantization"]["dtype"] == "qint8"


@pytest.mark.integration
def test_verify_judges_torch_int8_under_the_int8_rows(cli, tmp_path, built):
    """Every golden of the tiny preset through torch-int8 is judged by an int8 row (with its
    SQNR floor) and passes; the document properties, which have no int8 limit, say so."""
    out = tmp_path / "verify.json"
    code, _, err = cli(
        "verify", "--runtime", "torch-int8", "--artifacts", str(built["artifacts"]),
        "--golden", str(built["golden"]), "--no-export", "-q", "--json", str(out),
    )  # fmt: skip
    assert code == 0, err
    rows = [r for r in json.loads(out.read_text())["results"] if r["runtime"] == "torch-int8"]
    judged = [r for r in rows if r["outputs"]]
    assert judged and all(r["precision"] == "int8" and r["status"] == "pass" for r in judged)
    assert all(o["min_sqnr_db"] is not None for r in judged for o in r["outputs"])
    unjudged = [r for r in rows if not r["outputs"]]
    assert all(r["status"] == "skip" and "no limit for int8" in r["message"] for r in unjudged)


@pytest.mark.unit
def test_the_users_module_keeps_its_modes_and_its_float_layers():
    """The quantised module is a copy in eval mode; the one given is left as it was."""
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1)).train()
    quantised = prepared(make_runtime("torch-int8"), module)
    assert all(m.training for m in module.modules())
    assert type(module[0]) is torch.nn.Linear
    assert not quantised[1].training  # the copy's dropout is off
