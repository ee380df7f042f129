"""Two releases of one runtime in one report: each one's error per case and output, oldest
first, and the rows one passes and the other fails marked regression or fix with the direction;
in check, the first module call where two localised releases part."""

from __future__ import annotations

import pytest

from tconform.compare import OutputComparison
from tconform.localise.judge import Boundary
from tconform.localise.versions import parting, version_partings
from tconform.report.versions import render, version_groups
from tconform.results import Result

pytestmark = pytest.mark.unit

SETTINGS = {
    "runtimes": {
        "ort-cpu==1.20.1": {"onnxruntime": "1.20.1"},
        "ort-cpu": {"onnxruntime": "1.31.1"},
        "openvino": {"openvino": "2026.4.1-22982-e213a147257-releases/2026/4"},
    }
}


def _result(runtime: str, case: str, status: str, error: float | None, input_set="s0") -> Result:
    outputs = [] if error is None else [
        OutputComparison("out", [2], status, "ok", 1e-5, 1e-5, max_abs_err=error)
    ]  # fmt: skip
    return Result(case, case, runtime, "cpu", ["cpu"], input_set, status, outputs=outputs)


def test_releases_are_ordered_by_number_and_changes_get_a_direction():
    results = [  # the installed (newer) release first, as a user may name them
        _result("onnxruntime", "norm", "fail", 3e-5),
        _result("onnxruntime==1.20.1", "norm", "pass", 2e-7),
        _result("onnxruntime", "attention", "pass", 1e-7),
        _result("onnxruntime==1.20.1", "attention", "crash", None),
        _result("onnxruntime", "embedding", "pass", 0.0),
        _result("onnxruntime==1.20.1", "embedding", "pass", 0.0),
        _result("onnxruntime==1.20.1", "mask", "skip", None),  # checked nothing: no fix
        _result("onnxruntime", "mask", "pass", 1e-7),
        _result("openvino", "norm", "pass", 1e-7),  # one spec only: no group
    ]
    (group,) = version_groups(results, SETTINGS)
    assert group.specs == ["onnxruntime==1.20.1", "onnxruntime"]
    assert group.versions == {"onnxruntime==1.20.1": "1.20.1", "onnxruntime": "1.31.1"}
    changes = {row["case"]: row["change"] for row in group.rows}
    assert changes == {
        "norm": "regression 1.20.1 -> 1.31.1",
        "attention": "fix 1.20.1 -> 1.31.1 (crash on 1.20.1)",  # what the failing side did
        "embedding": "",
        "mask": "",
    }
    attention = next(r for r in group.rows if r["case"] == "attention")
    assert attention["status"] == {"onnxruntime==1.20.1": "crash", "onnxruntime": "pass"}
    summary = group.to_dict()
    assert summary["regressions"] == 1 and summary["fixes"] == 1
    text = render([group])
    assert "1.20.1 (onnxruntime==1.20.1), 1.31.1 (onnxruntime)" in text
    assert "CRASH" in text and "same max error" in text
    mask = next(line for line in text.splitlines() if line.startswith("mask"))
    assert "SKIP" in mask and "same max error" not in mask  # one release's error: nothing same
    assert "1 regressions, 1 fixes" in text


@pytest.mark.parametrize(
    ("other", "release", "says"),
    [  # one release twice: two installs of 1.31.1, one crashing (no upgrade between them)
        (
            "onnxruntime@/envs/crashing/bin/python",
            {"onnxruntime": "1.31.1"},
            "differs: 1.31.1 (onnxruntime) passes, 1.31.1 (onnxruntime@/envs/crashing/bin/python) "
            "crash",
        ),
        # a worker that crashed before saying its release: named by its spec, no direction
        (
            "onnxruntime@/shims/segv",
            None,
            "differs: 1.31.1 (onnxruntime) passes, onnxruntime@/shims/segv crash",
        ),
    ],
)
def test_sides_of_no_known_order_differ_and_are_never_a_regression(other, release, says):
    """A regression reads as an upgrade (older passes, newer does not): between one release
    installed twice, or a side whose release is unknown, there is no upgrade, so the row says
    the two differ and names each side, and the counts keep it apart."""
    settings = {"runtimes": {**SETTINGS["runtimes"]}}
    if release is not None:
        settings["runtimes"][f"ort-cpu{other.removeprefix('onnxruntime')}"] = release
    results = [_result("onnxruntime", "norm", "pass", 1e-7), _result(other, "norm", "crash", None)]
    (group,) = version_groups(results, settings)
    (row,) = group.rows
    assert row["change"] == says
    summary = group.to_dict()
    assert (summary["regressions"], summary["fixes"], summary["differences"]) == (0, 0, 1)
    assert "0 regressions, 0 fixes, 1 differences" in render([group])


def test_an_openvino_build_string_is_read_as_its_release():
    results = [_result("openvino==2025.4.0", "norm", "pass", 1e-7),
               _result("openvino", "norm", "pass", 1e-7)]  # fmt: skip
    (group,) = version_groups(results, SETTINGS)
    assert group.versions["openvino"] == "2026.4.1"
    assert group.specs == ["openvino==2025.4.0", "openvino"]


def _boundary(path: str, mean: float, maximum: float) -> Boundary:
    out = OutputComparison("y", [4], "pass", "ok", 1e-5, 1e-5, max_abs_err=maximum,
                           mean_abs_err=mean)  # fmt: skip
    return Boundary(path, 0, 1, f"torch.nn.{path}", "pass", "pass", outputs=[out])


class _Localised:
    def __init__(self, runtime: str, boundaries: list[Boundary]) -> None:
        self.runtime, self.boundaries = runtime, boundaries


def test_two_releases_part_at_the_first_call_computed_differently():
    older = _Localised("ort-cpu==1.20.1", [_boundary("emb", 0, 0), _boundary("ln", 5e-8, 4e-7),
                                           _boundary("fc", 9e-8, 8e-7)])  # fmt: skip
    newer = _Localised("ort-cpu", [_boundary("emb", 0, 0), _boundary("ln", 4e-8, 4e-7),
                                   _boundary("fc", 1e-7, 9e-7)])  # fmt: skip
    found = parting(older, newer)
    assert found.module == "ln" and found.compared == 2
    assert found.nearer == "ort-cpu"  # the smaller mean error there
    assert "part first at ln" in found.verdict and "ort-cpu is nearer" in found.verdict
    same = parting(older, _Localised("ort-cpu==1.21.0", older.boundaries))
    assert same.module is None and "the same" in same.verdict
    located = [("onnxruntime==1.20.1", "cpu", older), ("openvino", "cpu", newer)]
    pairs = version_partings([*located, ("onnxruntime", "cpu", newer)])
    assert len(pairs) == 1 and pairs[0].runtimes == ("ort-cpu==1.20.1", "ort-cpu")


def test_the_document_checks_compare_releases_too():
    """`tconform doc` with two releases: its rows (cases `doc:...`, beside the oracle's) are
    grouped and compared like verify's; the oracle, one spec, makes no group."""
    results = [
        _result("oracle", "doc:softmax-rows", "pass", 2e-16),
        _result("onnxruntime==1.20.1", "doc:softmax-rows", "pass", 8.9e-8),
        _result("onnxruntime", "doc:softmax-rows", "fail", 3e-4),
    ]
    (group,) = version_groups(results, SETTINGS)
    (row,) = group.rows
    assert (group.runtime, row["case"], row["change"]) == (
        "onnxruntime", "doc:softmax-rows", "regression 1.20.1 -> 1.31.1",
    )  # fmt: skip
