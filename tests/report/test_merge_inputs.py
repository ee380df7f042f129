"""report merge refuses what is not a shard of a verify run, in one line (no run needed)."""

from __future__ import annotations

import json

import pytest

from tconform.compare import tolerance_for
from tconform.errors import UsageError
from tconform.registry import get_case
from tconform.report.json_report import SCHEMA
from tconform.report.merge import _missing_shards, merge, read_shard

pytestmark = pytest.mark.unit

OWN = {"tool": "tconform", "schema": SCHEMA}  # what every JSON report of this tconform says


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ({**OWN, "command": "bench", "results": []}, "not of verify or check"),
        ({**OWN, "command": "verify", "results": [], "settings": {}}, "records no work units"),
        ([1, 2], "a JSON object is expected"),
        (
            {**OWN, "command": "verify", "results": [], "settings": {"units": {
                "ids": ["a", "b"], "total": 2, "sha256": "0", "positions": [0, 2]}}},
            "positions needs one place in the run",
        ),
    ],
)  # fmt: skip
def test_read_shard_refuses_with_the_reason(tmp_path, content, says):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(content))
    with pytest.raises(UsageError, match=says):
        read_shard(path)


def test_missing_shards_are_named_when_the_reports_say_which_they_are():
    assert _missing_shards(["1/4", "3/4"]).startswith("no report of shard 2/4, 4/4")
    assert _missing_shards(["1/2", None]) == "the reports hold shards 1/2, None"


# norm's float32 row: verify's results are held to their case's row, and merge checks that
NORM_ROW = tolerance_for("float32", get_case("norm").tolerance)
COMPARED = {"name": "y", "shape": [2], "status": "pass", "kind": "ok", "atol": NORM_ROW.atol,
            "rtol": NORM_ROW.rtol}  # fmt: skip


def _shard(**changes) -> dict:
    """A one-unit shard report, as verify writes it, with `changes` made."""
    unit = "norm/dynamo-opset18-float32-all/ort-cpu/test_data_set_0"
    from tconform.units import digest

    report = {
        "tool": "tconform", "schema": SCHEMA, "command": "verify", "version": "1", "error": None,
        "exit_code": 0,
        "settings": {"golden_manifest_sha256": "0" * 64, "eps": ["cpu"],
                     "units": {"ids": [unit], "total": 1, "sha256": digest([unit]),
                               "shard": "1/1"}},
        "results": [{"case": "norm", "component": "norm", "runtime": "onnxruntime", "ep": "cpu",
                     "cell": "dynamo-opset18-float32-all",
                     "ep_actual": ["CPUExecutionProvider"], "input_set": "test_data_set_0",
                     "status": "pass", "unit": unit, "outputs": [COMPARED]}],
    }  # fmt: skip
    report.update(changes)
    return report


def _edited(**fields) -> dict:
    """The changes that edit the shard's one result's `fields`."""
    return {"results": [{**_shard()["results"][0], **fields}]}


def _on_cuda(ep_actual: list[str]) -> dict:
    """The changes that make the shard a CUDA run's, its row's session on `ep_actual`."""
    from tconform.units import digest

    unit = "norm/dynamo-opset18-float32-all/ort-cuda/test_data_set_0"
    units = {"ids": [unit], "total": 1, "sha256": digest([unit]), "shard": "1/1"}
    return {
        "settings": {**_shard()["settings"], "eps": ["cpu", "cuda"], "units": units},
        **_edited(ep="cuda", ep_actual=ep_actual, unit=unit),
    }


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"results": 5}, "not a tconform JSON report"),
        ({"schema": "tconform-report/3"}, "a report of schema 'tconform-report/3'; this"),
        ({"schema": None}, "a report of schema None"),
        ({"error": "text"}, "error entry needs a message"),
        ({"results": [{"status": "bogus"}]}, "result 0 is not a run's result"),
        ({"results": [7]}, "result 0 is not a run's result"),
        ({"error": {"message": "m", "exit_code": 99}}, "error entry needs"),
        ({"error": {"message": "m", "exit_code": True}}, "error entry needs"),  # not 1
        ({"exit_code": 2}, "its exit code 2 is not its results' \\(0\\)"),  # a shard that failed
        # a forged pass whose own figures leave its tolerance
        (
            {
                "results": [
                    {
                        **_shard()["results"][0],
                        "outputs": [{**COMPARED, "max_abs_err": 5.0, "golden_rms": 1.0}],
                    }
                ]
            },
            "a pass whose output 'y' erred by 5, beyond what its tolerance allows",
        ),
        (
            {
                "results": [
                    {**_shard()["results"][0], "outputs": [{**COMPARED, "tolerance_used": 3.0}]}
                ]
            },
            "a pass whose output 'y' used 3 of its tolerance",
        ),
        # a forged pass under a tolerance that cannot see the output (tconform skips such)
        (
            {
                "results": [
                    {
                        **_shard()["results"][0],
                        "outputs": [
                            {
                                **COMPARED,
                                "atol": 1e30,
                                "rtol": 1e30,
                                "max_abs_err": 5.0,
                                "golden_rms": 1.0,
                                "tolerance_used": 5e-30,
                            }
                        ],
                    }
                ]
            },
            "a pass whose output 'y' was held to a tolerance that cannot see it",
        ),
        (
            {
                "results": [
                    {
                        **_shard()["results"][0],
                        "outputs": [
                            {**COMPARED, "rtol": 1e30, "max_abs_err": 3.0, "golden_rms": 1.0}
                        ],
                    }
                ]
            },
            "a pass whose output 'y' was held to a tolerance that cannot see it",
        ),
        (
            {
                "results": [
                    {
                        **_shard()["results"][0],
                        "outputs": [{**COMPARED, "blind": True, "golden_rms": 1.0}],
                    }
                ]
            },
            "a pass whose output 'y' was held to a tolerance that cannot see it",
        ),
        # one unit's result twice: the merge holds every unit exactly once
        (
            {"results": [_shard()["results"][0]] * 2},
            "holds 2 results of unit norm/dynamo-opset18-float32-all/ort-cpu/test_data_set_0",
        ),
        # a shard whose run stopped before its plan says why, not "an older tconform"
        (
            {"settings": {}, "error": {"message": "--shard 2/2 holds no units", "exit_code": 2}},
            "records no work units: its run stopped first \\(exit 2: --shard 2/2 holds no units",
        ),
        # a CUDA pass whose session ran on the CPU alone, or that records no session at all
        (_on_cuda(["CPUExecutionProvider"]), "a pass on cuda whose session ran on CPUExecutionP"),
        # a CPU shard's row edited to claim CUDA, a runtime tconform lacks, another's row
        (_edited(ep="cuda", ep_actual=["CUDAExecutionProvider"]), "provider 'cuda', which the"),
        (_edited(runtime="../../etc"), "runtime '../../etc', which tconform does not have"),
        (_edited(runtime="openvino"), "a row of openvino in a unit of 'ort-cpu'"),
        # a crash is a worker's verdict: a runtime in tconform's own process has none
        (_edited(status="crash", outputs=[]), "a crash of 'ort-cpu', which ran in tconform's"),
        (
            {"settings": {**_shard()["settings"], "runtimes": {"openvino": {}}}},
            "a row of 'ort-cpu', which the run's runtimes do not hold",
        ),
        # figures tconform never writes, and a reference that is not verify's float64 golden
        (_edited(outputs=[{**COMPARED, "max_abs_err": -1.0}]), "has a negative max_abs_err"),
        (_edited(outputs=[{**COMPARED, "tolerance_used": -0.5}]), "has a negative tolerance_used"),
        (
            _edited(outputs=[{**COMPARED, "max_abs_err": 1e-9, "mean_abs_err": 1e-6}]),
            "a mean error above its largest",
        ),
        (
            _edited(outputs=[{**COMPARED, "worst": [{"index": [0], "abs_err": 9.0}]}]),
            "a pass whose output 'y' lists worst elements",
        ),
        (_edited(reference="float16"), "expected outputs computed in 'float16', not float64"),
        (_edited(reference="float32"), "expected outputs computed in 'float32', not float64"),
        ({"results": [{**_shard()["results"][0], "ep_actual": []}]}, "records nothing it ran on"),
        # a failure relabelled as a skip
        (
            {
                "results": [
                    {
                        **_shard()["results"][0],
                        "status": "skip",
                        "outputs": [{**COMPARED, "status": "fail", "mismatches": 3}],
                    }
                ]
            },
            "a skip whose output 'y' failed",
        ),
        # a pass under a tolerance of the forger's choosing, self-consistent as it is
        (
            {
                "results": [
                    {
                        **_shard()["results"][0],
                        "outputs": [
                            {
                                **COMPARED,
                                "atol": 0.2,
                                "rtol": 0.2,
                                "max_abs_err": 0.1,
                                "golden_rms": 1.0,
                                "tolerance_used": 0.5,
                            }
                        ],
                    }
                ]
            },
            "output 'y' held to atol 0.2, rtol 0.2, not its float32",
        ),
        # a looser row claimed for a model whose graph computes in float32
        (
            {
                "results": [
                    {
                        **_shard()["results"][0],
                        "precision": "int4",
                        "model": {
                            "path": "m.onnx",
                            "sha256": "0" * 64,
                            "origin": "exported",
                            "compute_elem_type": "float16",
                        },
                    }
                ]
            },
            "precision 'int4', where its model and lane give float16",
        ),
        ({"results": [{**_shard()["results"][0], "precision": "float64"}]}, "'float64', where"),
        # a float32 model's failing row relabelled to a looser precision, its figures made fit
        (_edited(precision="float16"), "precision 'float16', where its model and lane give fl"),
        # a localisation the reports could not render
        ({"details": {"localisation": [{"runtime": "ort-cpu"}]}}, "details.localisation\\[0\\]"),
        ({"details": {"localisation": {"runtime": "x"}}}, "details.localisation\\[0\\]"),
        (
            {"details": {"version_partings": [{"verdict": "v", "boundaries": [{"status": 1}]}]}},
            "details.version_partings\\[0\\] is not what tconform writes there",
        ),
        # a forged pass that compared nothing merged to a pass
        (
            {"results": [{**_shard()["results"][0], "outputs": []}]},
            "result 0 is not a run's result \\(a pass that compared no output\\)",
        ),
    ],
)
def test_malformed_shards_are_one_line_errors(tmp_path, changes, says):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_shard()))
    assert merge([path]).results[0].status == "pass"  # the well-formed one merges
    path.write_text(json.dumps(_shard(**_on_cuda(["CUDAExecutionProvider", "CPUExecution"]))))
    assert merge([path]).results[0].status == "pass"  # and so does a CUDA run's
    path.write_text(json.dumps(_shard(**changes)))
    with pytest.raises(UsageError, match=says):
        merge([path])


@pytest.mark.parametrize(
    ("field", "forged"),
    [("case", "../../pwn"), ("input_set", "</testcase>"), ("cell", "dynamo-opset20-float16-all")],
)
def test_a_result_whose_names_are_not_its_units_is_refused(tmp_path, field, forged):
    """A result is merged under the names of its unit, never others a report puts beside it."""
    report = _shard()
    report["results"][0][field] = forged
    path = tmp_path / "s.json"
    path.write_text(json.dumps(report))
    with pytest.raises(UsageError, match="its case, cell or input set is not its unit's"):
        merge([path])


def test_a_pipe_or_a_huge_file_is_refused_before_reading(tmp_path):
    import os

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        read_shard(fifo)  # would block forever if it were opened
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(2**30)  # sparse: no disk used
    with pytest.raises(UsageError, match="too large"):
        read_shard(huge)


@pytest.mark.parametrize(
    ("field", "value"),
    [("case", 7), ("case", None), ("input_set", 7), ("cell", ["x"]), ("runtime", {}),
     ("notes", 7), ("placement", "zz"), ("seconds", "zz"), ("ep_actual", [1]),
     ("seconds", float("inf")), ("seconds", float("nan"))],
)  # fmt: skip
def test_a_result_field_of_the_wrong_type_is_named(tmp_path, field, value):
    """What `to_dict` could not have written is refused, naming the field, before any table or
    JUnit file is rendered from it."""
    report = _shard()
    report["results"][0][field] = value
    path = tmp_path / "s.json"
    path.write_text(json.dumps(report))
    with pytest.raises(UsageError, match=f"result 0 is not a run's result.*{field}"):
        merge([path])


def test_an_infinite_error_in_a_passing_output_is_refused(tmp_path):
    """Python reads `Infinity` as a float; a merged report would carry it on as invalid JSON."""
    report = _shard()
    report["results"][0]["outputs"] = [
        {"name": "y", "shape": [2], "status": "pass", "kind": "ok", "atol": 1e-5, "rtol": 1e-5,
         "max_abs_err": float("inf")}
    ]  # fmt: skip
    path = tmp_path / "s.json"
    path.write_text(json.dumps(report))  # writes the bare token Infinity
    assert "Infinity" in path.read_text()
    with pytest.raises(UsageError, match="max_abs_err inf: expected float"):
        merge([path])


def test_a_deeply_nested_file_is_refused(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UsageError, match="RecursionError"):
        read_shard(path)


def test_shard_counts_in_a_report_are_read_as_ascii_digits_and_cost_nothing():
    """A shard report's `K/N` is data: a count of eighteen digits lists its first absent shards
    at once, and digits int() refuses (`²`) are named as they are, never a traceback."""
    from tconform.report.merge import _missing_shards

    huge = "9" * 18
    said = _missing_shards([f"1/{huge}", f"3/{huge}"])
    assert said.startswith(f"no report of shard 2/{huge}, 4/{huge}") and said.count(", ...") == 1
    assert _missing_shards(["²/3", "1/3"]) == "the reports hold shards 1/3, ²/3"


def _two_shards(tmp_path, first: dict, second: dict, places: tuple = ()) -> list:
    """Two one-unit shards of one two-unit run, recording `first` and `second` as the
    settings of their runtimes, and `places` as their units' places in the run."""
    from tconform.units import digest

    units = [f"norm/dynamo-opset18-float32-all/ort-cpu/test_data_set_{n}" for n in (0, 1)]
    paths = []
    for k, (unit, runtimes) in enumerate(zip(units, (first, second), strict=True), 1):
        report = _shard()
        report["settings"]["units"] = {
            "ids": [unit], "total": 2, "sha256": digest(units), "shard": f"{k}/2"
        }  # fmt: skip
        report["settings"]["runtimes"] = {"ort-cpu": {}, **runtimes}  # its own lane's
        if places:
            report["settings"]["units"]["positions"] = [places[k - 1]]
        report["results"][0].update(unit=unit, input_set=unit.rsplit("/", 1)[1])
        paths.append(tmp_path / f"s{k}.json")
        paths[-1].write_text(json.dumps(report))
    return paths


def test_shards_whose_runtime_ran_with_other_settings_are_not_one_run(tmp_path):
    one, other = {"ort-cpu": {"intra_op_threads": 0}}, {"ort-cpu": {"intra_op_threads": 1}}
    with pytest.raises(UsageError, match="runtime ort-cpu ran with other settings"):
        merge(_two_shards(tmp_path, one, other))
    torch = {"torch": {"threads": 0}}  # a runtime only one shard ran is that shard's
    merged = merge(_two_shards(tmp_path, one, {**one, **torch}))
    assert merged.settings["runtimes"] == {**one, **torch}


@pytest.mark.parametrize(
    ("key", "first", "second", "says"),
    [
        ("eps", ["cpu"], ["cpu", "cuda"], "eps differs"),
        ("allow_missing_ep", False, True, "allow missing ep differs"),
        ("seed", 0, 1, "seed differs"),
    ],
)
def test_shards_of_other_requests_are_not_one_run(tmp_path, key, first, second, says):
    """A shard run with other providers, another seed, or unavailable rows allowed to skip
    is another run's: merged, it borrowed the first shard's settings."""
    paths = _two_shards(tmp_path, {}, {})
    for path, value in zip(paths, (first, second), strict=True):
        data = json.loads(path.read_text())
        data["settings"][key] = value
        path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=f"s2.json: {says} from"):
        merge(paths)


def test_merged_units_take_their_places_in_the_run_and_no_place_twice(tmp_path):
    merged = merge(_two_shards(tmp_path, {}, {}, places=(1, 0)))  # shard 2 held the first
    ids = merged.settings["units"]["ids"]
    assert ids[0].endswith("test_data_set_1") and merged.settings["units"]["positions"] == [0, 1]
    assert [r.input_set for r in merged.results] == ["test_data_set_1", "test_data_set_0"]
    with pytest.raises(UsageError, match="a place of its own"):
        merge(_two_shards(tmp_path, {}, {}, places=(0, 0)))


LOCALISED = {
    "runtime": "ort-cpu",
    "verdict": "first divergence at `fc` (isolated error 40x tolerance)",
    "boundaries": [
        {"path": "fc", "cls": "torch.nn.Linear", "status": "fail",
         "outputs": [{"max_abs_err": 0.5, "tolerance_used": 40.0}]},
        {"path": None, "cls": "M", "status": "pass", "outputs": [{"tolerance_used": None}]},
    ],
}  # fmt: skip


def test_each_shards_localisations_and_partings_are_carried_into_the_merged_report(tmp_path):
    """A sharded `check --localise`: what each shard found is in the merged report (JSON and
    markdown), in shard order, not left behind in the shard's own file."""
    from tconform.report import markdown

    details = {"localisation": [LOCALISED], "version_partings": [{"verdict": "they part at fc"}]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_shard(details=details)))
    merged = merge([path])
    assert merged.details["localisation"] == [LOCALISED]
    assert merged.details["version_partings"] == [{"verdict": "they part at fc"}]
    text = markdown.build(merged)
    assert "### Localisation on ort-cpu" in text and "| `fc` | Linear | 5.00e-01 | 40x |" in text
    assert "where they part: they part at fc" in text


def _check_shard(atol: float, tolerance: dict) -> dict:
    """A one-unit shard of `check` on a user's model, its output held to `atol`."""
    from tconform.units import digest

    unit = "pk.m:lin/given/ort-cpu/example"
    row = tolerance_for("float32", "model")
    output = {**COMPARED, "atol": atol, "rtol": row.rtol, "max_abs_err": 1e-7, "golden_rms": 1.0}
    result = {
        **_shard()["results"][0],
        "case": "pk.m:lin",
        "component": "pk.m:lin",
        "cell": "given",
        "input_set": "example",
        "unit": unit,
        "outputs": [output],
    }
    settings = {
        **_shard()["settings"],
        "tolerance": {"class": "model", **tolerance},
        "units": {"ids": [unit], "total": 1, "sha256": digest([unit]), "shard": "1/1"},
    }
    return _shard(command="check", settings=settings, results=[result])  # fmt: skip


def test_a_check_pass_is_held_to_its_row_or_to_the_tolerance_its_user_gave(tmp_path):
    """Outsider's forgery: a failing check row made a pass by an atol just above its error;
    check's settings say the tolerance asked for (its row by default), so merge knows it."""
    row = tolerance_for("float32", "model")
    default = {"atol": None, "rtol": None, "per_output": {}}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_check_shard(row.atol_for(1.0), default)))
    assert merge([path]).results[0].status == "pass"
    path.write_text(json.dumps(_check_shard(0.018, default)))
    forged = r"held to atol 0\.018, rtol .*, not its float32 model row"
    with pytest.raises(UsageError, match=forged):
        merge([path])
    given = {"atol": 0.018, "rtol": None, "per_output": {}}  # the user asked for it: theirs
    path.write_text(json.dumps(_check_shard(0.018, given)))
    assert merge([path]).results[0].status == "pass"
