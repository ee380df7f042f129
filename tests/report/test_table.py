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


def test_each_failure_lists_its_worst_elements_under_its_own_message():
    import numpy as np

    from tconform.compare import Tolerance, compare_output

    golden = np.linspace(-1, 1, 12).reshape(3, 4)
    failed = []
    for input_set, scale in (("test_data_set_0", 1.5), ("test_data_set_1", 2.0)):
        result = _result("dynamo-opset18-float32-all")
        result.input_set, result.status, result.message = input_set, "fail", f"off by {scale}"
        result.outputs = [
            compare_output("y", golden * scale, golden, Tolerance(1e-5, 1e-5, "test"))
        ]
        failed.append(result)
    lines = table.render(failed).splitlines()
    at = [i for i, line in enumerate(lines) if "off by" in line]
    assert len(at) == 2 and lines[at[0] + 1].startswith("      y worst: at [")
    assert all("worst" in line for line in lines[at[0] + 1 : at[1]])  # its own, before the next
    assert "(|err| 0.5, " in lines[at[0] + 1] and "(|err| 1, " in lines[at[1] + 1]  # each its own
    # ranked by the tolerance each used, which the line says (the message names the largest |err|)
    # (0.5 / (1e-5 + 1e-5 * |-1|) at the golden's end)
    assert lines[at[0] + 1].endswith("(|err| 0.5, 2.5e+04x its tolerance)")


def test_an_overflow_shows_an_unbounded_error_not_its_finite_elements_figures():
    """float32 overflow: inf where the float64 golden is 8.7e38. The finite elements' max abs
    error and share of tolerance say little of that row; its error is shown unbounded."""
    import numpy as np

    from tconform.compare import Tolerance, compare_output

    golden = np.array([1.0, 8.7e38])
    actual = np.array([1.0, np.inf], dtype=np.float32)
    compared = compare_output("y", actual, golden, Tolerance(1e-5, 1e-5, "a row"))
    assert compared.kind == "nonfinite"
    result = Result("m", "m", "torch", "cpu", ["cpu"], "example", "fail", outputs=[compared])
    row = table._row(result)
    assert row[3] == "inf" and row[5] == "inf" and row[6] == "FAIL"
