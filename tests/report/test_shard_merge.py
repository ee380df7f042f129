"""verify --shard K/N and report merge: the shards' union is the full run, unit for unit."""

from __future__ import annotations

import json

import pytest

from tconform import golden, registry
from tconform.config import PRESETS
from tconform.weights import DEFAULT_SEED

pytestmark = pytest.mark.integration

CASES = ("embedding", "norm")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Goldens of two cases, and one artifacts folder the runs share (exported once)."""
    root = tmp_path_factory.mktemp("shards")
    golden.write(
        root / "golden", PRESETS["tiny"], DEFAULT_SEED, registry.select_cases(CASES), "tiny"
    )
    return root


def _verify(cli, root, json_name, *extra):
    # cuda is requested and absent here: every shard holds `unavailable` units (exit 3), so the
    # exit code compared below is not the trivial 0.
    args = ["verify", "--golden", str(root / "golden"), "--artifacts", str(root / "art")]
    args += [a for case in CASES for a in ("--case", case)]
    code, _, err = cli(
        *args, "--ep", "cpu,cuda", "--no-doc", "-q", "--json", str(root / json_name), *extra
    )
    return code, err, json.loads((root / json_name).read_text())


def _units(report):
    return {
        (r["case"], r["cell"], r["runtime"], r["ep"], r["input_set"]): (
            r["status"],
            r["outputs"] and max(o["max_abs_err"] for o in r["outputs"]),
        )
        for r in report["results"]
    }


def test_three_shards_merged_equal_the_full_run(cli, small):
    full_code, _, full = _verify(cli, small, "full.json")
    shards = [_verify(cli, small, f"s{k}.json", "--shard", f"{k}/3") for k in (1, 2, 3)]
    ids = [set(report["settings"]["units"]["ids"]) for _, _, report in shards]
    assert all(ids) and not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert {s[2]["settings"]["units"]["sha256"] for s in shards} == {
        full["settings"]["units"]["sha256"]
    }
    assert [s[2]["settings"]["units"]["shard"] for s in shards] == ["1/3", "2/3", "3/3"]

    code, _, err = cli(
        "report",
        "merge",
        *(str(small / f"s{k}.json") for k in (1, 2, 3)),
        "--json",
        str(small / "merged.json"),
        "--junit",
        str(small / "merged.xml"),
        "--markdown",
        str(small / "merged.md"),
    )
    merged = json.loads((small / "merged.json").read_text())
    assert full_code == 3 and code == full_code == merged["exit_code"], err
    assert _units(merged) == _units(full)
    # in the whole run's order, units and results both
    assert merged["settings"]["units"]["ids"] == full["settings"]["units"]["ids"]
    assert list(_units(merged)) == list(_units(full))
    assert len(merged["results"]) == full["settings"]["units"]["total"] == len(full["results"])
    assert "unavailable" in (small / "merged.md").read_text()
    assert (small / "merged.xml").read_text().count("<testcase") == len(full["results"])


def test_merge_refuses_missing_duplicated_and_foreign_reports(cli, small, tmp_path):
    for k in (1, 2):
        if not (small / f"s{k}.json").exists():
            _verify(cli, small, f"s{k}.json", "--shard", f"{k}/3")
    s1, s2 = str(small / "s1.json"), str(small / "s2.json")

    code, _, err = cli("report", "merge", s1, s2)
    assert code == 2 and "units missing" in err and err.count("\n") == 1
    assert "no report of shard 3/3" in err

    code, _, err = cli("report", "merge", s1, s1, s2)
    assert code == 2 and "is in both" in err

    before = (small / "s1.json").read_bytes()
    code, _, err = cli("report", "merge", s1, s2, "--junit", s1)  # never over an input
    assert code == 2 and "an input of this run" in err
    assert (small / "s1.json").read_bytes() == before

    other = json.loads((small / "s2.json").read_text())
    other["settings"]["golden_manifest_sha256"] = "0" * 64
    (tmp_path / "other.json").write_text(json.dumps(other))
    code, _, err = cli("report", "merge", s1, str(tmp_path / "other.json"))
    assert code == 2 and "golden manifest sha256 differs" in err

    other = json.loads((small / "s2.json").read_text())
    other["version"] = "0.0.0"
    (tmp_path / "old.json").write_text(json.dumps(other))
    code, _, err = cli("report", "merge", s1, str(tmp_path / "old.json"))
    assert code == 2 and "tconform version differs" in err

    (tmp_path / "plain.json").write_text(json.dumps({"results": []}))
    code, _, err = cli("report", "merge", str(tmp_path / "plain.json"))
    assert code == 2 and "not a tconform JSON report" in err


@pytest.mark.parametrize(
    ("value", "message"),
    [("0/2", "K must be 1..N"), ("3/2", "K must be 1..N"), ("a/b", "is not K/N")],
)
def test_bad_shard_is_one_line_exit_2(cli, value, message):
    code, _, err = cli("verify", "--shard", value)
    assert code == 2 and message in err and err.count("\n") == 1


def _matrix_of_norm(cli, root, artifacts: str, exporters: str, opsets: str, *extra):
    """`verify --matrix` of the norm case over `exporters` x `opsets`, into root/`artifacts`."""
    args = ["verify", "--golden", str(root / "golden"), "--artifacts", str(root / artifacts)]
    args += ["--case", "norm", "--no-doc", "-q", "--matrix", "--exporter", exporters]
    return cli(*args, "--opset", opsets, *extra)


def test_matrix_over_two_exporters_and_two_opsets_gives_every_cell_a_verdict_or_a_reason(
    cli, small
):
    report_path, plot = small / "matrix.json", small / "matrix.png"
    code, out, err = _matrix_of_norm(
        cli, small, "art", "dynamo,torchscript", "18,23", "--json", str(report_path), "--plot",
        str(plot),
    )  # fmt: skip
    report = json.loads(report_path.read_text())
    cells = {r["cell"] for r in report["results"]} - {"module"}
    assert cells == {
        f"{e}-opset{o}-float32-all" for e in ("dynamo", "torchscript") for o in (18, 23)
    }
    for r in report["results"]:
        assert r["status"] in ("pass", "skip"), r
        if r["status"] == "skip":
            assert r["cell"] == "torchscript-opset23-float32-all"
            assert "not applicable: opset 23 out of range for torchscript" in r["message"]
    assert code == 0, err
    assert "torchscript-opset23-float32-all ort-cpu" in out and "n.a." in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Each export cell sits in a folder of its own; the impossible one has none.
    assert sorted(p.name for p in (small / "art" / "matrix").iterdir() if p.is_dir()) == [
        "dynamo-opset18-float32",
        "dynamo-opset23-float32",
        "torchscript-opset18-float32",
    ]


def test_a_matrix_none_of_whose_onnx_cells_can_exist_checks_nothing_and_exits_3(cli, small):
    """The torch rows would pass, but no model is checked: exit 3, naming why, before any
    export."""
    code, _, err = _matrix_of_norm(cli, small, "none", "torchscript", "21,23")
    assert code == 3, err
    assert "nothing to check: no ONNX lane of this run can exist" in err
    assert "torchscript-opset23-float32-all: opset 23 out of range for torchscript" in err
    assert not (small / "none").exists()


def test_a_precision_plan_is_not_applicable_to_tconforms_own_cases(cli, small):
    """int8-planned is a dtype of a user's model (check): verify's cells say why not."""
    code, _, err = _matrix_of_norm(cli, small, "planned", "dynamo", "18", "--dtype", "int8-planned")
    assert code == 3, err
    assert "int8-planned: a precision plan is made for a user's module (tconform check)" in err
    assert not (small / "planned").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--matrix", "--exporter", "onnxscript"), "unknown value 'onnxscript'"),
        (("--matrix", "--opset", "16"), "unknown value '16'"),
        (("--matrix", "--graph-opts", "max"), "unknown value 'max'"),
        (("--matrix", "--opset", "18,,20"), "'18,,20': an empty value between commas"),
        (("--matrix", "--dtype", "float32,float32"), "'float32' given twice"),
        (
            ("--matrix", "--dtype", "float32", "--dtype", "float32"),
            "--dtype: 'float32' given twice",
        ),
        (("--matrix", "--graph-opt", "disable,all"), "one value; --matrix takes lists"),
        (("--graph-opts", "all"), "--graph-opts is a matrix axis: add --matrix"),
        (("--dtype", "float16"), "--dtype is a matrix axis: add --matrix"),
    ],
)
def test_unknown_matrix_axis_value_is_one_line_exit_2(cli, args, message):
    code, _, err = cli("verify", *args)
    assert code == 2 and message in err and err.count("\n") == 1


def test_float16_matrix_shards_merge_unit_for_unit(cli, small):
    """A float16 model's results carry the float16 precision; their units still match the
    plan's ids, so the shards merge (and n.a. cells are named at the cell's precision)."""
    args = ["verify", "--golden", str(small / "golden"), "--artifacts", str(small / "art")]
    args += ["--case", "norm", "--no-doc", "-q", "--matrix", "--dtype", "float32,float16"]
    args += [
        "--runtime",
        "onnxruntime",
        "--runtime",
        "onnx-reference",
        "--graph-opts",
        "disable,all",
    ]
    for k in (1, 2):
        code, _, err = cli(*args, "--shard", f"{k}/2", "--json", str(small / f"h{k}.json"))
        assert code == 0, err
    code, out, err = cli(
        "report",
        "merge",
        str(small / "h1.json"),
        str(small / "h2.json"),
        "--json",
        str(small / "h.json"),
    )
    merged = json.loads((small / "h.json").read_text())
    assert code == 0, err
    assert (
        len(merged["results"]) == merged["settings"]["units"]["total"] == 2 * 2 * 2 * 3
    )  # dtypes x levels x runtimes x sets
    assert {r["precision"] for r in merged["results"] if "float16" in r["cell"]} == {"float16"}
    not_applicable = [r for r in merged["results"] if r["status"] == "skip"]
    assert {(r["runtime"], r["cell"].rsplit("-", 1)[1]) for r in not_applicable} == {
        ("onnx-reference", "disable")
    }
    assert "matrix (worst over input sets" in out
