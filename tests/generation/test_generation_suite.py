"""The generation goldens as a suite of the one pipeline: planned as work units like every other
case (so shards, the pytest plugin and `report merge` take them), nothing exported or run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest
from gen_helpers import GOLDEN_DIR

import tconform
from tconform.errors import UsageError
from tconform.files import sha256_file
from tconform.plan import plan, select_units
from tconform.request import Axes, Generations, Request
from tconform.runtimes import RuntimeOptions
from tconform.suites import open_suite


@pytest.mark.unit
def test_every_golden_is_two_units_per_runtime_and_shards_split_them_whole():
    request = Request(Generations(GOLDEN_DIR), RuntimeOptions(("onnxruntime", "torch")))
    goldens = json.loads((GOLDEN_DIR / "manifest.json").read_text())["cases"]
    with open_suite(request) as suite:
        units = plan(request, suite).units
    assert {(u.case, u.input_set) for u in units} == {
        (name, decoding) for name in goldens for decoding in ("kv-cache", "no-cache")
    }
    assert len(units) == len(goldens) * 2 * 2  # two runtimes
    shards = [
        {u.id for u in select_units(replace(request, shard=(k, 3)), units)} for k in (1, 2, 3)
    ]
    assert all(shards) and sum(map(len, shards)) == len(units)
    assert set().union(*shards) == {u.id for u in units}


@pytest.mark.integration
def test_pytest_tconform_generation_runs_the_goldens_units(generation_artifacts, tmp_path):
    """`pytest --tconform --tconform-generation`: one item per golden, runtime and decoding, as
    `verify --generation` plans them; a golden's four units run and pass."""
    goldens = json.loads((GOLDEN_DIR / "manifest.json").read_text())["cases"]
    plugin = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--tconform",
              "--tconform-generation", "--tconform-golden", str(GOLDEN_DIR),
              "--tconform-artifacts", str(generation_artifacts)]  # fmt: skip
    listed = subprocess.run(
        [*plugin, "--collect-only", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert f"{len(goldens) * 2 * 2} tests collected" in listed.stdout, listed.stdout[-2000:]
    junit = tmp_path / "j.xml"
    done = subprocess.run(
        [*plugin, "-k", "ends-greedy", "-q", "--junitxml", str(junit)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ran = list(ET.parse(junit).getroot().iter("testcase"))
    assert len(ran) == 4 and all(len(case) == 0 for case in ran)  # no failure, error or skip
    assert all(case.get("name").startswith("ends-greedy") for case in ran)


@pytest.mark.integration
def test_the_python_api_verifies_the_goldens_named_with_the_runtime_options_given(
    generation_artifacts,
):
    """`tconform.verify(generation=True, ...)` is `verify --generation --case ...`: the goldens
    named, on the runtimes asked for, with their options recorded in the report."""
    report = tconform.verify(
        GOLDEN_DIR,
        generation_artifacts,
        generation=True,
        cases=["ends-greedy", "right_padding-beam3"],
        runtimes=["onnxruntime"],
        threads=1,
        runtime_options={"graph_opt": "basic"},
    )
    assert report.exit_code == 0
    assert sorted((r.case, r.input_set) for r in report.results) == [
        (name, decoding)
        for name in ("ends-greedy", "right_padding-beam3")
        for decoding in ("kv-cache", "no-cache")
    ]
    (settings,) = report.settings["runtimes"].values()
    assert settings["graph_optimization"] == "basic" and settings["intra_op_threads"] == 1


@pytest.mark.unit
@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"cases": ["norm"]}, "no generation golden 'norm'"),
        ({"runtime_options": {"bogus": 1}}, "bogus"),
        ({"runtime_options": {"graph_opt": "bogus"}}, "'bogus' is not one of disable, basic"),
        ({"threads": -1}, "threads -1: must be 0"),
        ({"shard": (0, 2)}, "--shard 0/2: K/N with 1 <= K <= N"),
        ({"shard": (1, 0)}, "--shard 1/0"),
        (
            {"matrix": Axes(graph_opts=("basic",)), "runtime_options": {"graph_opt": "all"}},
            "not both",
        ),
    ],
)
def test_the_python_api_refuses_what_the_command_refuses(given, says):
    with pytest.raises(UsageError, match=says):
        tconform.verify(GOLDEN_DIR, generation=True, **given)


@pytest.mark.integration
def test_a_given_encoder_is_named_by_every_row_it_ran_under(cli, generation_artifacts, tmp_path):
    """Rows name the decoder that ran; a given encoder is named beside it, and the report's
    settings name every file the decoding ran (path, sha256, origin)."""
    encoder = tmp_path / "encoder.onnx"
    shutil.copyfile(generation_artifacts / "generation" / "gen_encoder" / "model.onnx", encoder)
    report = tmp_path / "r.json"
    code, out, err = cli(
        "verify", "--generation", "--golden-generation", str(GOLDEN_DIR), "--case", "ends-greedy",
        "--artifacts", str(generation_artifacts), "--no-torch", "--model", f"gen_encoder={encoder}",
        "--json", str(report), "-q",
    )  # fmt: skip
    assert code == 0, out + err
    data = json.loads(report.read_text())
    assert len(data["results"]) == 2
    assert all(f"gen_encoder: {encoder} (given" in " ".join(r["notes"]) for r in data["results"])
    models = data["settings"]["models"]
    (named,) = [m for key, m in models.items() if key.startswith("gen_encoder")]
    assert named["origin"] == "given" and named["sha256"] == sha256_file(encoder)
    assert {key.split()[0] for key in models} == {"gen_encoder", "gen_step", "gen_prefix"}
