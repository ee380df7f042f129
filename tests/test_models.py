"""Reading a model file tconform did not write (tconform.models)."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from tconform.errors import UsageError
from tconform.models import given_file

pytestmark = pytest.mark.unit


def test_a_file_stamped_with_an_opset_onnx_does_not_know_is_an_input_error(tmp_path):
    """ONNX's checker lets opset 999 by and every runtime refuses it: an input error (exit 2)
    before the run, not a row of errors counted as a conformance failure (outsider's)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    for opset, path in ((18, tmp_path / "ok.onnx"), (999, tmp_path / "future.onnx")):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 9
        onnx.save(model, path)
    assert given_file(tmp_path / "ok.onnx").provenance.opsets == {"ai.onnx": 18}
    with pytest.raises(UsageError, match="stamped with ONNX opset 999, beyond the newest"):
        given_file(tmp_path / "future.onnx")


@pytest.mark.parametrize("shared", [False, True])
def test_a_model_in_a_locked_folder_swapped_mid_run_is_not_read_as_the_runs_own(tmp_path, shared):
    """Outsider's race: check's export folder moved away right after the export and another
    put in its place, holding a model of the tester's: it was run and named `exported`. A
    folder read under a shared lock (verify's artifacts) is held the same."""
    from tconform.errors import Refused
    from tconform.folders import folder_lock

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    folder = tmp_path / "exp"
    folder.mkdir()
    onnx.save(model, folder / "model.onnx")
    with folder_lock(folder, shared=shared):
        assert given_file(folder / "model.onnx", origin="exported").provenance.origin == "exported"
        folder.rename(tmp_path / "moved")
        folder.mkdir()
        onnx.save(model, folder / "model.onnx")  # the planted one
        with pytest.raises(Refused, match="no longer the folder this run locked"):
            given_file(folder / "model.onnx", origin="exported")
