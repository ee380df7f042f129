"""Break the BERT export of `tconform check examples.bert:make` the way a faulty converter would:
the weight of one Linear (`encoder.layer.1.intermediate.dense`) scaled by 1.5, found through
the module path the dynamo exporter records on each node. Writes bert_bad.onnx (README).
"""

import onnx
from onnx import numpy_helper

model = onnx.load("artifacts/check/examples.bert.make/model.onnx")
scope = "encoder.layer.1.intermediate.dense"
node = next(
    n
    for n in model.graph.node
    if n.op_type == "MatMul" and any(scope + ":" in p.value for p in n.metadata_props)
)
weight = next(t for t in model.graph.initializer if t.name in node.input)
weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.5, weight.name))
onnx.save(model, "bert_bad.onnx")
