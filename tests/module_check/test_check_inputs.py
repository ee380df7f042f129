"""Inputs of `tconform check`: naming, --inputs FILE.npz, --dynamic, tolerances, factories."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from tconform.compare import TOLERANCES
from tconform.errors import UsageError
from tconform.module_check.inputs import (
    as_inputs,
    load_factory,
    parse_dynamic,
    read_arrays,
    read_npz,
)
from tconform.suites.module import Tolerances

pytestmark = pytest.mark.unit


class TwoInputs(nn.Module):
    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return ids.float() if mask is None else ids.float() * mask


IDS = torch.arange(6).reshape(2, 3)
MASK = torch.ones(2, 3)


def test_positional_inputs_take_forwards_parameter_names():
    inputs = as_inputs(TwoInputs(), (IDS, MASK), "t")
    assert inputs.names == ["ids", "mask"] and inputs.kwargs == {}


def test_keyword_inputs_keep_their_names_and_an_unknown_one_is_refused():
    inputs = as_inputs(TwoInputs(), {"mask": MASK, "ids": IDS}, "t")
    assert inputs.names == ["mask", "ids"] and inputs.args == ()
    with pytest.raises(UsageError, match="no parameter 'tokens'"):
        as_inputs(TwoInputs(), {"tokens": IDS}, "t")


def test_a_non_tensor_input_is_refused():
    with pytest.raises(UsageError, match="input 1 is a list"):
        as_inputs(TwoInputs(), (IDS, [1, 2]), "t")


def test_converted_casts_floats_only():
    inputs = as_inputs(TwoInputs(), (IDS, MASK), "t").converted(torch.float64, None)
    assert inputs.args[0].dtype == torch.int64 and inputs.args[1].dtype == torch.float64


def test_npz_positional_and_named(tmp_path):
    np.savez(tmp_path / "pos.npz", IDS.numpy(), MASK.numpy())
    assert read_npz(tmp_path / "pos.npz", TwoInputs()).names == ["ids", "mask"]
    np.savez(tmp_path / "named.npz", mask=MASK.numpy(), ids=IDS.numpy())
    inputs = read_npz(tmp_path / "named.npz", TwoInputs())
    assert set(inputs.kwargs) == {"ids", "mask"}


def _write_npy(path):
    with path.open("wb") as f:  # np.save(path) would append .npy to the name
        np.save(f, np.zeros(3))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, "no such file"),
        # a text file: said so, not numpy's remark on pickled data
        (lambda p: p.write_text("not an archive"), "not a .npz archive (not a zip of .npy"),
        (lambda p: _write_npy(p), "not a .npz archive"),
        (lambda p: np.savez(p), "the archive holds no arrays"),  # a zip with no member at all
    ],
)
def test_bad_npz_files_are_usage_errors(tmp_path, make, message):
    path = tmp_path / "inputs.npz"
    make(path)
    with pytest.raises(UsageError, match=re.escape(message)) as info:
        read_npz(path, TwoInputs())
    assert str(path) in str(info.value)


def test_an_archive_that_unpacks_beyond_the_memory_available_is_refused_unread(
    tmp_path, monkeypatch
):
    """A few kilobytes of zip can declare gigabytes: the sizes its directory declares are
    weighed against the memory available before any array is read (here the memory is made
    small, not the archive big)."""
    from types import SimpleNamespace

    import psutil

    path = tmp_path / "inputs.npz"
    np.savez_compressed(path, ids=np.zeros(2**20, dtype=np.int8))  # 1 MiB in about 1 kB
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=2**19))
    monkeypatch.setattr(np, "load", lambda *a, **k: pytest.fail("the archive was read"))
    with pytest.raises(UsageError, match=r"unpack to 1\.0 MiB, more than the 0\.5 MiB"):
        read_arrays(path)


def test_dynamic_axes_with_and_without_names():
    inputs = as_inputs(TwoInputs(), (IDS, MASK), "t")
    assert parse_dynamic(["ids=0:batch,1:seq", "mask=-1"], inputs) == {
        "ids": {0: "batch", 1: "seq"},
        "mask": {1: "mask_dim1"},
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tokens=0", "no input 'tokens' (its inputs: ids, mask)"),
        ("ids=2", "axis 2 out of range for ids (rank 2)"),
        ("ids=x", "'x' is not an axis index"),
        ("ids", "expected NAME=AXES"),
        ("ids=0:batch,0:seq", "axis 0 of ids is given twice"),
        ("ids=0:", "no name after '0:'"),
        ("ids=0:b:c", "'b:c' is not an axis name"),  # a separator too many, not a name
        ("ids=0:b\x1bc", "'b\\x1bc' is not an axis name"),  # an escape would recolour a terminal
        ("ids=0:batch,1:batch", "'batch' names axes of different sizes in the example"),
    ],
)
def test_bad_dynamic_specs(spec, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_dynamic([spec], as_inputs(TwoInputs(), (IDS, MASK), "t"))


def test_default_tolerance_is_the_model_row_with_overrides():
    row, tf32 = TOLERANCES[("float32", "model")], TOLERANCES[("tf32", "model")]
    tols = Tolerances(("a", "b"), rtol=2e-4, per_output=(("b", (1.0, 0.5)),))
    assert (tols.module("float32").atol, tols.module("float32").rtol) == (row.atol, 2e-4)
    assert (tols.module("tf32").atol, tols.module("tf32").rtol) == (tf32.atol, 2e-4)
    per_output = tols.by_output("float32")
    assert (per_output["a"].atol, per_output["a"].rtol) == (row.atol, 2e-4)
    assert (per_output["b"].atol, per_output["b"].rtol) == (1.0, 0.5)
    # The row's atol keeps scaling to each output's RMS; an atol the user set is taken as given.
    assert per_output["a"].atol_rms == row.atol_rms and per_output["b"].atol_rms is None
    assert Tolerances(("a",), atol=1e-3).module("float32").atol_rms is None
    float16 = Tolerances(("a",)).module("float16")
    assert (float16.atol, float16.rtol) == (TOLERANCES[("float16", "model")].atol,) * 2
    assert float16.why == "tconform's float16 model row, check's default"
    with pytest.raises(UsageError, match="no output 'c'"):
        Tolerances(("a",), per_output=(("c", (1.0, 1.0)),))


def test_a_precision_with_no_row_is_judged_by_both_bounds_given_or_refused_saying_so():
    """A float64 module: no row of tconform's was measured for it. Both bounds given judge it;
    without them the line says how on (it was "no float64 tolerance row in
    tconform.compare.TOLERANCES", even with --atol and --rtol given)."""
    given = Tolerances(("a",), atol=1e-12, rtol=1e-9).module("float64")
    assert (given.atol, given.rtol, given.given, given.why) == (
        1e-12,
        1e-9,
        True,
        "set by the user",
    )
    for partial in (Tolerances(("a",)), Tolerances(("a",), atol=1e-12)):
        with pytest.raises(UsageError, match=r"float64 have no tolerance row.*--atol and --rtol"):
            partial.module("float64")


def test_an_rtol_given_alone_of_one_or_more_cannot_see_and_is_no_pass():
    """--rtol 1 without --atol: all zeros pass |err| <= |golden|, so the output is `skip`
    saying why (it was a pass: only a given atol marked a tolerance as the user's); the row's
    atol beside it, still scaled to the output, is never what makes it blind."""
    from tconform.compare import compare_output

    golden = np.random.default_rng(0).standard_normal(50)
    blind = compare_output(
        "y", np.zeros_like(golden), golden, Tolerances(("y",), rtol=1.0).module("float32")
    )
    assert blind.unseen() and "is 1 or more" in blind.unseen()  # settled as skip, never a pass
    seeing = Tolerances(("y",), rtol=0.5).module("float32")
    assert seeing.given and seeing.atol_rms is not None
    assert compare_output("y", np.zeros_like(golden), golden, seeing).status == "fail"
    tiny = golden * 1e-9  # below the row's atol, which is scaled to it: judged, not blind
    tol = Tolerances(("y",), rtol=1e-3).module("float32")
    assert compare_output("y", tiny * 1.5, tiny, tol).status == "fail"


def _package(tmp_path, monkeypatch, name: str, source: str) -> str:
    """A throwaway importable module in the current folder, as a user's own code would be."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    return name


@pytest.mark.parametrize(
    ("source", "attribute", "message"),
    [
        ("x = 1\n", "missing", "has no attribute 'missing'"),
        ("make = 3\n", "make", "int is not callable"),
        ("def make():\n    return 42\n", "make", "returned int, not a torch.nn.Module"),
        ("def make():\n    raise ValueError('no weights')\n", "make", "the factory: ValueError"),
        ("raise RuntimeError('broken at import')\n", "make", "': RuntimeError: broken at import"),
        (
            "from torch import nn\nmake = nn.Linear(2, 2)\n",
            "make",
            "a module instance, not a factory",
        ),
    ],
)
def test_bad_factories(tmp_path, monkeypatch, source, attribute, message):
    name = _package(tmp_path, monkeypatch, f"user_factory_{abs(hash(source))}", source)
    with pytest.raises(UsageError, match=re.escape(message)):
        load_factory(f"{name}:{attribute}")


def test_a_factory_is_found_in_the_current_folder(tmp_path, monkeypatch):
    source = "import torch\nfrom torch import nn\ndef make():\n    return nn.Linear(3, 2)\n"
    name = _package(tmp_path, monkeypatch, "user_factory_ok", source)
    module, example, _ = load_factory(f"{name}:make")
    assert isinstance(module, nn.Linear) and example is None


@pytest.mark.parametrize("target", ["no_colon", "pkg:", ":make"])
def test_malformed_targets(target):
    with pytest.raises(UsageError, match=re.escape("PACKAGE.MODULE:FACTORY")):
        load_factory(target)


def test_a_module_that_does_not_import():
    with pytest.raises(UsageError, match=re.escape("cannot import 'no_such_package_xyz.mod'")):
        load_factory("no_such_package_xyz.mod:make")


def test_a_file_name_given_for_a_module_names_the_module(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "user_file_named.py").write_text("def make():\n    return None\n")
    with pytest.raises(UsageError, match=re.escape("give user_file_named:make")):
        load_factory("user_file_named.py:make")
