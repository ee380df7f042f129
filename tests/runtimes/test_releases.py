"""Two releases of one runtime in one run: `--runtime onnxruntime==1.20.1 --runtime onnxruntime`
makes the environment on first use (in this run's temporary folder: one small install per test
run), prints both rows with their exact versions recorded, and compares them. Skipped, saying
why, where the package index cannot be reached; CI has the network."""

from __future__ import annotations

import json

import pytest

from tconform.runtimes.environments import RECORD, installer

pytestmark = pytest.mark.integration

OLD = "onnxruntime==1.20.1"


@pytest.fixture(scope="session")
def runtime_cache(tmp_path_factory):
    """The environments' folder for this test run: made once, kept until the run ends."""
    return tmp_path_factory.mktemp("runtime-cache")


def test_two_releases_run_side_by_side(cli, workspace, tmp_path, runtime_cache, monkeypatch):
    monkeypatch.setenv("TCONFORM_RUNTIME_CACHE", str(runtime_cache))
    report = tmp_path / "verify.json"
    code, out, err = cli(
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(workspace["artifacts"]),
        "--no-export", "--no-doc", "--case", "norm", "--runtime", OLD, "--runtime", "onnxruntime",
        "--json", str(report),
    )  # fmt: skip
    if code == 2 and "could not be reached" in err:
        pytest.skip(f"no package index here: {err.strip()}")
    assert code == 0, err
    data = json.loads(report.read_text())
    assert {r["runtime"] for r in data["results"]} == {OLD, "onnxruntime"}
    assert {r["status"] for r in data["results"]} == {"pass"}
    old = data["settings"]["runtimes"]["ort-cpu==1.20.1"]
    assert old["onnxruntime"] == "1.20.1"  # read back by the runtime in its worker
    assert old["worker"]["packages"]["onnxruntime"] == "1.20.1"
    assert all(old["worker"]["packages"][name] for name in ("numpy", "onnx", "ml_dtypes"))
    (group,) = data["versions"]
    assert [v["runtime"] for v in group["versions"]] == [OLD, "onnxruntime"]  # oldest first
    assert group["regressions"] == 0 and len(group["rows"]) == 3  # norm's three input sets
    assert "versions of onnxruntime on cpu" in out and "ort-cpu==1.20.1" in out
    assert len(list(runtime_cache.glob("onnxruntime-1.20.1-*"))) == 1  # made once, kept
    # an unknown release: one line naming the spec and the way on
    code, _, err = cli(
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(workspace["artifacts"]),
        "--no-export", "--no-doc", "--case", "norm", "--runtime", "onnxruntime==1.99.0",
    )  # fmt: skip
    assert code == 2 and "onnxruntime==1.99.0" in err and "way on" in err
    assert "Traceback" not in err
    # a release published as a source package alone: wheels only, its build never runs
    code, _, err = cli(
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(workspace["artifacts"]),
        "--no-export", "--no-doc", "--case", "norm", "--runtime", "onnx-reference==1.0",
    )  # fmt: skip
    assert code == 2 and "onnx-reference==1.0: cannot be installed" in err, err
    assert "setuptools" not in err  # the build backend's name: a build ran


def test_a_release_whose_onnx_brings_no_ml_dtypes_runs_and_an_older_environment_is_remade(
    cli, workspace, tmp_path, runtime_cache, monkeypatch
):
    """onnx before 1.19 does not depend on ml_dtypes, which a worker imports (bfloat16): the
    environment installs it. One that an earlier tconform made without it (an older record)
    is made again, not used and not refused."""
    monkeypatch.setenv("TCONFORM_RUNTIME_CACHE", str(runtime_cache))
    args = (
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(workspace["artifacts"]),
        "--no-export", "--no-doc", "--case", "norm", "--runtime", "onnx-reference==1.17.0", "-q",
    )  # fmt: skip
    code, _, err = cli(*args)
    if code == 2 and "could not be reached" in err:
        pytest.skip(f"no package index here: {err.strip()}")
    assert code == 0, err
    (folder,) = runtime_cache.glob("onnx-1.17.0-*")
    record = json.loads((folder / RECORD).read_text())
    assert record["packages"]["ml_dtypes"]
    record["schema"] = "tconform-environment/1"  # as tconform made it before ml_dtypes
    (folder / RECORD).write_text(json.dumps(record))
    code, _, err = cli(*args)
    assert code == 0, err
    remade = json.loads((folder / RECORD).read_text())
    assert remade["schema"] != "tconform-environment/1"


@pytest.mark.skipif(installer() is None, reason="uv is not installed (tconform[versions])")
def test_no_network_is_one_line_naming_the_way_on(cli, workspace, tmp_path, monkeypatch):
    """The package index unreachable: an address nothing listens on. (pip names no cause
    for it, so its line is the generic one, which names both ways on.)"""
    monkeypatch.setenv("TCONFORM_RUNTIME_CACHE", str(tmp_path / "cache"))
    nowhere = "http://127.0.0.1:9/simple"
    for name, value in (("UV_DEFAULT_INDEX", nowhere), ("UV_NO_CACHE", "1")):
        monkeypatch.setenv(name, value)
    code, _, err = cli(
        "verify", "--golden", str(workspace["golden"]), "--artifacts", str(workspace["artifacts"]),
        "--no-export", "--no-doc", "--case", "norm", "--runtime", "onnxruntime==1.20.1",
    )  # fmt: skip
    assert code == 2 and "Traceback" not in err
    assert "onnxruntime==1.20.1: the package index could not be reached" in err
    assert "way on: run once with network" in err
    assert not any((tmp_path / "cache").glob("onnxruntime-*"))  # nothing half-made is left
