"""The terminal table (no run needed)."""

from __future__ import annotations

import pytest

from tconform.report import table
from tconform.results import Result

pytestmark = pytest.mark.unit


def _result(cell: str, runtime: str = "onnxruntime") -> Result:
    return Result("transformer", "model", runtime, "cpu", ["CPUExecutionProvider"],
                  "test_data_set_0", "pass", cell=cell)  # fmt: skip


def test_a_cell_column_appears_only_where_rows_differ_by_cell_alone():
    plain = table.render([_result("dynamo-opset18-float32-all"), _result("module", "torch")])
    assert "cell" not in plain.splitlines()[0]
    both = table.render([_result("kv-cache"), _result("no-cache")])
    header, _, first, second = both.splitlines()[:4]
    assert header.split()[:3] == ["case", "runtime", "cell"]
    assert "kv-cache" in first and "no-cache" in second


def test_the_pivot_has_one_order_whatever_order_the_results_come_in():
    """A merged report (shards concatenated) shows the columns a single run shows."""
    from tconform.report import pivot

    results = [
        _result("torchscript-opset18-float32-all"),
        _result("module", "torch"),
        _result("dynamo-opset23-float32-all"),
        _result("dynamo-opset18-float32-all"),
    ]
    forward, backward = pivot.build(results), pivot.build(results[::-1])
    assert forward.columns == backward.columns
    assert forward.columns[0].startswith("dynamo-opset18") and forward.columns[-1] == "torch"
