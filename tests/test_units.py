"""Work units and their split into shards (tconform.units): no export, no runtime."""

from __future__ import annotations

import pytest

from tconform.results import Result
from tconform.units import MODULE, Unit, digest, shard_units, split, unchecked_models

pytestmark = pytest.mark.unit


def _units() -> list[Unit]:
    """Groups of very different sizes, as a real run has (a whole model next to a norm)."""
    units = []
    for n, (case, export) in enumerate([("transformer", 10.0), ("norm", 2.0), ("encoder", 6.0)]):
        for runtime in ("ort-cpu", "ort-cuda"):
            for s in range(3):
                units.append(
                    Unit(case, "cell", runtime, f"set{s}", f"{case}@cell", 0.1 * (n + 1), export)
                )
        units += [
            Unit(case, "module", "torch", f"set{s}", f"{case}@module", 0.1, 0.1) for s in range(3)
        ]
    return units


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_every_unit_is_in_exactly_one_shard(count):
    units = _units()
    shards = split(units, count)
    ids = [u.id for shard in shards for u in shard]
    assert sorted(ids) == sorted(u.id for u in units)
    assert len(ids) == len(set(ids))


def test_a_group_is_never_split_across_shards():
    owner = {}
    for k, shard in enumerate(split(_units(), 3)):
        for u in shard:
            assert owner.setdefault(u.group, k) == k


def test_split_balances_by_cost_not_by_count():
    shards = split(_units(), 2)
    loads = [
        sum(u.cost for u in s) + sum({u.group: u.group_cost for u in s}.values()) for s in shards
    ]
    # The transformer's export (10 s) alone outweighs the other two exports (6 + 2 s).
    assert {u.group for u in shards[0]} >= {"transformer@cell"}
    assert {u.group for u in shards[1]} >= {"encoder@cell", "norm@cell"}
    assert max(loads) / sum(loads) < 0.6


def test_split_is_independent_of_the_order_units_come_in():
    units = _units()
    forward = [[u.id for u in s] for s in split(units, 3)]
    backward = [[u.id for u in s] for s in split(list(reversed(units)), 3)]
    assert [sorted(s) for s in forward] == [sorted(s) for s in backward]
    assert shard_units(units, 2, 3) == split(units, 3)[1]


def test_digest_depends_on_the_set_of_ids_only():
    ids = [u.id for u in _units()]
    assert digest(ids) == digest(reversed(ids))
    assert digest(ids) != digest(ids[1:])


def test_torchscript_exports_are_costed_cheaper_so_shards_balance_by_exporter():
    """One dynamo export and seven TorchScript ones of the whole model over two shards: the
    TorchScript exports (about 8x cheaper each) together weigh less than the dynamo one, so they
    all go to the other shard. Costed alike, the dynamo shard would take three of them too."""
    from tconform.units import Cell

    cells = [Cell("dynamo", 18, "float32")]
    cells += [Cell("torchscript", opset, "float32") for opset in range(14, 21)]
    units = [
        Unit("transformer", cell.key, "ort-cpu", "set0", cell.export_key, 0.15,
             cell.export_seconds("model"))
        for cell in cells
    ]  # fmt: skip
    shards = [[u.cell.split("-")[0] for u in shard] for shard in split(units, 2)]
    assert sorted(shards) == [["dynamo"], ["torchscript"] * 7]


def _row(cell: str, status: str, message: str = "") -> Result:
    return Result("norm", "norm", "onnxruntime", "cpu", [], "set0", status, message, cell=cell)


def test_a_run_whose_every_onnx_lane_was_skipped_checked_no_model():
    torch_pass = _row(MODULE, "pass")
    skipped = _row("cell", "skip", "onnxruntime has no float16 kernel for Erf")
    why = unchecked_models([torch_pass, skipped, skipped])
    assert why.startswith("nothing checked:") and "no float16 kernel for Erf" in why
    assert unchecked_models([torch_pass, skipped, _row("cell", "pass")]) == ""  # one model ran
    assert unchecked_models([torch_pass]) == ""  # no ONNX lane: the torch rows are the run
    assert unchecked_models([_row(MODULE, "fail"), skipped]) == ""  # a failure says more


def test_a_shard_count_costs_nothing_it_does_not_use():
    """Beyond the number of groups every shard is empty, whatever N is: shard 1 of 10^18 is the
    first group's work at once, a shard past the groups holds nothing (issue 20)."""
    units = _units()
    groups = len({u.group for u in units})
    assert shard_units(units, 1, 10**18) == split(units, groups)[0]
    assert shard_units(units, groups + 1, 10**18) == []
    assert shard_units(units, 2, 3) == split(units, 3)[1]  # within the groups, the same split
