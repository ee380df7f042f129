import os
import stat
from pathlib import Path

import numpy as np
import pytest

from tconform import golden, registry
from tconform.config import PRESETS
from tconform.errors import UsageError

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]
CASES = (registry.get_case("feed_forward"), registry.get_case("transformer"))


def test_layout_is_the_onnx_test_data_layout(tmp_path):
    golden.write(tmp_path / "g", TINY, 1, CASES, "tiny")
    sets = sorted(p.name for p in (tmp_path / "g" / "transformer").iterdir())
    assert sets == ["test_data_set_0", "test_data_set_1", "test_data_set_2"]
    files = sorted(p.name for p in (tmp_path / "g" / "transformer" / "test_data_set_0").iterdir())
    assert files == [
        "input_0.pb",
        "input_1.pb",
        "input_2.pb",
        "input_3.pb",
        "output_0.pb",
        "output_1.pb",
    ]


def test_round_trip_and_input_sets_cover_dynamic_axes(tmp_path):
    manifest = golden.write(tmp_path / "g", TINY, 1, CASES, "tiny")
    sets = golden.read_case(tmp_path / "g", manifest, CASES[1], TINY)
    assert sets[0].inputs["src_ids"].shape == (1, 1)
    assert sets[2].inputs["tgt_ids"].shape == (3, TINY.max_seq_len)
    assert not sets[2].inputs["src_keep"].all()  # padding masks really mask positions
    assert sets[1].outputs["probs"].dtype == np.float32
    params = CASES[1].make_params(TINY, 1)
    exact = registry.run_oracle(CASES[1], TINY, params, sets[1].inputs)
    assert np.array_equal(sets[1].outputs["logits"], exact[0].astype(np.float32))


def test_refuses_to_overwrite_without_force(tmp_path):
    golden.write(tmp_path / "g", TINY, 1, CASES, "tiny")
    before = (tmp_path / "g" / "manifest.json").read_bytes()
    with pytest.raises(UsageError, match="--force"):
        golden.write(tmp_path / "g", TINY, 2, CASES, "tiny")
    assert (tmp_path / "g" / "manifest.json").read_bytes() == before
    golden.write(tmp_path / "g", TINY, 2, CASES, "tiny", force=True)
    assert (tmp_path / "g" / "manifest.json").read_bytes() != before


def _tree(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_golden_case_adds_or_replaces_only_the_named_cases(tmp_path):
    """`golden --case NAME` into a golden folder: a new case is added, an existing one replaced
    only with force, every other case kept byte for byte; a different seed is refused."""
    folder = tmp_path / "g"
    golden.write(folder, TINY, 1, CASES, "tiny")
    before = _tree(folder)
    norm = (registry.get_case("norm"),)
    manifest = golden.write(folder, TINY, 1, norm, "tiny", only_these=True)
    assert list(manifest["cases"]) == ["feed_forward", "transformer", "norm"]
    after = _tree(folder)
    assert {k: v for k, v in after.items() if k.parts[0] in ("feed_forward", "transformer")} == {
        k: v for k, v in before.items() if k.parts[0] != "manifest.json"
    }
    assert golden.check(folder, (*CASES, *norm)) == ([], 0)

    with pytest.raises(UsageError, match="already holds goldens for 'transformer'"):
        golden.write(folder, TINY, 1, CASES[1:], "tiny", only_these=True)
    with pytest.raises(UsageError, match="seed 1"):
        golden.write(folder, TINY, 2, norm, "tiny", force=True, only_these=True)
    assert _tree(folder) == after
    golden.write(folder, TINY, 1, CASES[1:], "tiny", force=True, only_these=True)
    assert set(golden.read_golden_manifest(folder)["cases"]) == {
        "feed_forward",
        "transformer",
        "norm",
    }
    assert (
        _tree(folder)[Path("norm/test_data_set_0/input_0.pb")]
        == after[Path("norm/test_data_set_0/input_0.pb")]
    )


def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    golden.write(tmp_path / "g", TINY, 1, CASES, "tiny")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    def boom(*args):
        raise RuntimeError("disk full")

    monkeypatch.setattr(golden, "generate_case", boom)
    with pytest.raises(RuntimeError):
        golden.write(tmp_path / "g", TINY, 2, CASES, "tiny", force=True)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_check_passes_on_a_fresh_folder_and_catches_a_changed_value(tmp_path):
    manifest = golden.write(tmp_path / "g", TINY, 1, CASES, "tiny")
    assert golden.check(tmp_path / "g", CASES)[0] == []
    # A plain check expects every registry case: the others are missing, not fine.
    missing = {d.path.rsplit("/", 1)[-1] for d in golden.check(tmp_path / "g")[0]}
    assert missing == set(registry.case_names()) - {c.name for c in CASES}
    # --case: those alone are compared; the folder's others are not drift
    assert len(CASES) > 1 and golden.check(tmp_path / "g", CASES[:1]) == ([], 0)
    # Rewrite one output 3 ulp away and fix its sha256, so only regeneration can tell.
    path = tmp_path / "g" / "feed_forward" / "test_data_set_1" / "output_0.pb"
    rel = "test_data_set_1/output_0.pb"
    sha = manifest["cases"]["feed_forward"]["sha256"][rel]
    name, array = golden.read_tensor(path, sha, None, tmp_path / "g")
    bumped = array.copy()
    bumped.flat[0] = np.nextafter(np.nextafter(np.nextafter(bumped.flat[0], 9), 9), 9)
    data = golden.numpy_helper.from_array(bumped, name=name).SerializeToString()
    path.write_bytes(data)
    manifest["cases"]["feed_forward"]["sha256"]["test_data_set_1/output_0.pb"] = (
        golden.sha256_bytes(data)
    )
    golden.atomic_write_json(tmp_path / "g" / "manifest.json", manifest)
    drifts, _ = golden.check(tmp_path / "g", CASES)
    assert len(drifts) == 1 and "3 ulp" in drifts[0].message


def test_ulp_distance():
    a = np.array([1.0, -1.0, 0.0], dtype=np.float32)
    b = np.nextafter(a, np.float32(2))
    assert golden.ulp_distance(a, b).tolist() == [1, 1, 1]
    assert golden.ulp_distance(np.float32([-0.0]), np.float32([0.0])).tolist() == [0]


def test_committed_goldens_match_a_regeneration():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "golden"
    drifts, _ = golden.check(root)
    assert drifts == []
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert size < 10 * 1024 * 1024


def test_committed_manifest_records_the_current_tolerance_table():
    import json
    from pathlib import Path

    from tconform.compare import TOLERANCES

    manifest = json.loads(
        (Path(__file__).resolve().parents[1] / "golden" / "manifest.json").read_text()
    )
    recorded = {
        k: (v["atol"], v["rtol"], v.get("min_sqnr_db"), v["atol_rms"])
        for k, v in manifest["tolerances"].items()
    }
    assert recorded == {
        f"{p}/{c}": (t.atol, t.rtol, t.min_sqnr_db, t.atol_rms) for (p, c), t in TOLERANCES.items()
    }


def test_goldens_never_go_inside_another_tconform_folder_or_over_a_users_file(tmp_path):
    folder = tmp_path / "g"
    golden.write(folder, TINY, 1, CASES[:1], "tiny")
    before = _tree(folder)
    with pytest.raises(UsageError, match="lies in"):
        golden.write(folder / "sub", TINY, 1, CASES[:1], "tiny")
    assert _tree(folder) == before and not list(folder.glob(".*"))  # not even a lock file
    notes = folder / "feed_forward" / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(UsageError, match=r"notes\.txt: not listed in the golden manifest"):
        golden.write(folder, TINY, 1, CASES[:1], "tiny", force=True)
    assert notes.read_text() == "mine"
    notes.unlink()
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    link = folder / "feed_forward" / "mine"  # a link to a folder: a file of the user's, too
    link.symlink_to(elsewhere)
    with pytest.raises(UsageError, match=r"feed_forward/mine: not listed in the golden manifest"):
        golden.write(folder, TINY, 1, CASES[:1], "tiny", force=True)
    assert link.is_symlink()
    link.unlink()
    empty = folder / "feed_forward" / "test_data_set_0" / "mine"  # holds nothing, still mine
    empty.mkdir()
    with pytest.raises(UsageError, match=r"test_data_set_0/mine: not listed in the golden"):
        golden.write(folder, TINY, 1, CASES[:1], "tiny", force=True)
    assert empty.is_dir()


def test_a_golden_folder_has_the_mode_mkdir_gives(tmp_path):
    """Written in a staging folder and renamed into place: with mkdir's mode (0o777 less the
    umask), not the staging folder's owner-only 0700."""
    old = os.umask(0o022)
    try:
        golden.write(tmp_path / "g", TINY, 1, CASES[:1], "tiny")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "g").stat().st_mode) == 0o755


def test_force_never_replaces_goldens_of_the_other_kind(tmp_path):
    """The generation goldens written with --force over the components' folder: refused, the
    folder left as it was (no later verify would find its goldens)."""
    from tconform.generation import golden as generation_golden

    folder = tmp_path / "g"
    golden.write(folder, TINY, 1, CASES[:1], "tiny")
    before = _tree(folder)
    with pytest.raises(UsageError, match="holds the components' goldens; golden --force"):
        generation_golden.write(folder, TINY, 1, "tiny", force=True)
    assert _tree(folder) == before


@pytest.mark.parametrize("dims", [[-2, 3], [3, 2]])
def test_a_tensor_whose_dims_are_not_its_manifest_shape_is_refused(tmp_path, dims):
    """A golden .pb rewritten with negative dims (its data unchanged, its sha256 updated) was
    read as a tensor and passed; so was one of another shape of the same size."""
    proto = golden.numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "y")
    del proto.dims[:]
    proto.dims.extend(dims)
    data = proto.SerializeToString()
    (tmp_path / "g").mkdir()
    path = tmp_path / "g" / "output_0.pb"
    path.write_bytes(data)
    with pytest.raises(golden.UsageError, match=r"output_0.pb: dims .* are not the shape \[2, 3\]"):
        golden.read_tensor(path, golden.sha256_bytes(data), [2, 3], tmp_path / "g")
