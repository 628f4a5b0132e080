"""Dequantising a weight-only int8 ONNX export in numpy before onnxruntime sees it (adr/0037).

The shipped MiniLM export stores each weight as an int8 initializer followed by
``Cast(to=float)`` and ``Mul(scale)``. onnxruntime folds those nodes into float
constants when a session is created, and that folding (about 23 million values
through its generic constant-folding pass) was most of the cold start's model
load. Here the same arithmetic is done once with numpy (``float32(q) * scale``:
the same IEEE products, so the weights are bit-identical) and handed to the
session as external initializers, and the word-embedding table is gathered
before it is dequantised (``Gather`` then ``Cast``/``Mul`` on the gathered rows
and their per-row scales: the same values, without dequantising 30,522 rows per
session). Nothing is written to disk.

The model file is read with a small protobuf reader: the ``onnx`` package would do the
same through its public API, but importing it took 0.6-0.8 s of a fresh process here
(its ml_dtypes extension), measured against this reader in adr/0060. Only the pattern above is rewritten;
any other graph, or anything this reader does not understand, is left as it is
and :func:`prepare` returns None so the caller loads the file unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Protobuf field numbers (onnx.proto3).
_MODEL_IR_VERSION, _MODEL_GRAPH, _MODEL_OPSET = 1, 7, 8
_OPSET_DOMAIN, _OPSET_VERSION = 1, 2
_GRAPH_NODE, _GRAPH_NAME, _GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 1, 2, 5, 11, 12
_GRAPH_SPARSE_INITIALIZER = 15
_NODE_INPUT, _NODE_OUTPUT, _NODE_NAME, _NODE_OP, _NODE_ATTRIBUTE, _NODE_DOMAIN = 1, 2, 3, 4, 5, 7
_ATTR_NAME, _ATTR_I = 1, 3
_VALUE_NAME = 1
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_NAME, _TENSOR_RAW = 1, 2, 8, 9
_TENSOR_EXTERNAL, _TENSOR_LOCATION = 13, 14
_FLOAT, _UINT8, _INT8 = 1, 2, 3

# Where placeholders say their data lives; onnxruntime never reads it, because every
# placeholder is supplied through SessionOptions.add_external_initializers.
IN_MEMORY = "groundkit-in-memory"
_MS_DOMAIN = "com.microsoft"  # onnxruntime's contrib operators (DynamicQuantizeMatMul)
_VIEW_BYTES = 1 << 16


class _Unsupported(ValueError):
    """The file is not in the shape this rewrite knows; load it unchanged."""


def _varint(buf, pos: int) -> tuple[int, int]:
    if pos < len(buf) and buf[pos] < 0x80:  # most keys and lengths are one byte
        return buf[pos], pos + 1
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise _Unsupported("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Unsupported("varint too long")


def _fields(buf) -> list[tuple[int, int, object, int, int]]:
    """(field, wire type, value, start, end) for each field of one message; a
    length-delimited value is a memoryview (no copy)."""
    out = []
    pos, end = 0, len(buf)
    while pos < end:
        start = pos
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > end:
                raise _Unsupported("truncated field")
            value = buf[pos : pos + length]
            pos += length
        elif wire == 1:
            value, pos = bytes(buf[pos : pos + 8]), pos + 8
        elif wire == 5:
            value, pos = bytes(buf[pos : pos + 4]), pos + 4
        else:
            raise _Unsupported("group fields")
        out.append((number, wire, value, start, pos))
    if pos != end:
        raise _Unsupported("truncated message")
    return out


def _put_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _put(number: int, payload: bytes) -> bytes:
    """One length-delimited field."""
    return _put_varint(number << 3 | 2) + _put_varint(len(payload)) + payload


def _put_int(number: int, value: int) -> bytes:
    return _put_varint(number << 3) + _put_varint(value)


def _text(value) -> str:
    return bytes(value).decode("utf-8")


@dataclass
class _Node:
    raw: bytes
    inputs: list[str]
    outputs: list[str]
    op: str
    domain: str
    ints: dict[str, int] = field(default_factory=dict)


def _node(raw) -> _Node:
    raw = bytes(raw)  # small; indexing bytes is faster than a memoryview
    inputs, outputs, op, domain, ints = [], [], "", "", {}
    for number, wire, value, _s, _e in _fields(raw):
        if number == _NODE_INPUT:
            inputs.append(_text(value))
        elif number == _NODE_OUTPUT:
            outputs.append(_text(value))
        elif number == _NODE_OP:
            op = _text(value)
        elif number == _NODE_DOMAIN:
            domain = _text(value)
        elif number == _NODE_ATTRIBUTE:
            name, i = None, None
            for n, w, v, _s2, _e2 in _fields(value):
                if n == _ATTR_NAME:
                    name = _text(v)
                elif n == _ATTR_I and w == 0:
                    i = v - (1 << 64) if v >= 1 << 63 else v
            if name is not None and i is not None:
                ints[name] = i
    return _Node(raw, inputs, outputs, op, domain, ints)


def _make_node(op: str, inputs: list[str], outputs: list[str], *, domain: str = "", **ints: int) -> bytes:
    out = b"".join(_put(_NODE_INPUT, i.encode()) for i in inputs)
    out += b"".join(_put(_NODE_OUTPUT, o.encode()) for o in outputs)
    out += _put(_NODE_OP, op.encode())
    if domain:
        out += _put(_NODE_DOMAIN, domain.encode())
    for name, value in ints.items():
        attribute = _put(_ATTR_NAME, name.encode()) + _put_int(_ATTR_I, value) + _put_int(20, 2)  # type INT
        out += _put(_NODE_ATTRIBUTE, attribute)
    return out


@dataclass
class _Tensor:
    name: str
    dtype: int
    dims: tuple[int, ...]
    raw: memoryview | None  # None: stored some other way (typed fields, external file)


def _tensor(raw) -> _Tensor:
    name, dtype, dims, data, other = "", 0, [], None, False
    for number, wire, value, _s, _e in _fields(raw):
        if number == _TENSOR_NAME:
            name = _text(value)
        elif number == _TENSOR_TYPE:
            dtype = value
        elif number == _TENSOR_DIMS:
            if wire == 0:
                dims.append(value)
            else:  # packed
                pos = 0
                while pos < len(value):
                    d, pos = _varint(value, pos)
                    dims.append(d)
        elif number == _TENSOR_RAW:
            data = value
        elif number == _TENSOR_LOCATION and value != 0 or number in (4, 5, 6, 7, 10, 11, _TENSOR_EXTERNAL):
            other = True
    return _Tensor(name, dtype, tuple(dims), None if other else data)


def _tensor_head(name: str, array: np.ndarray) -> bytes:
    """A TensorProto's dims, element type and name for ``array``."""
    packed = b"".join(_put_varint(d) for d in array.shape)
    dtype = {np.dtype(np.float32): _FLOAT, np.dtype(np.int8): _INT8, np.dtype(np.uint8): _UINT8}[array.dtype]
    return _put(_TENSOR_DIMS, packed) + _put_int(_TENSOR_TYPE, dtype) + _put(_TENSOR_NAME, name.encode())


def _placeholder(name: str, array: np.ndarray) -> bytes:
    """An initializer whose data the session is given from memory."""
    location = _put(1, b"location") + _put(2, IN_MEMORY.encode())
    return _tensor_head(name, array) + _put(_TENSOR_EXTERNAL, location) + _put_int(_TENSOR_LOCATION, 1)


def _array(t: _Tensor, dtype) -> np.ndarray:
    size = int(np.prod(t.dims, dtype=np.int64)) if t.dims else 1
    values = np.frombuffer(t.raw, dtype=dtype)
    if values.size != size:
        raise _Unsupported("tensor size does not match its dims")
    return values.reshape(t.dims)


@dataclass
class Prepared:
    """A rewritten model: its bytes, and the float weights it expects from memory."""

    model: bytes
    initializers: dict[str, np.ndarray]
    folded: int  # Cast/Mul pairs replaced by a float constant
    gathered: int  # embedding tables dequantised after the Gather
    integer: int = 0  # matrices multiplied in int8 (``int8_matmul``)


def prepare(model_bytes: bytes, *, int8_matmul: bool = False, signed: bool = False) -> Prepared | None:
    """The model with its int8 ``Cast``/``Mul`` weights dequantised here, or None when
    the graph has no such weights or is not in a shape this reader handles.

    ``int8_matmul`` (adr/0040): each int8 matrix with one scale per output column that only
    ``MatMul`` nodes read (as their second input) is not dequantised; those nodes become
    onnxruntime's ``DynamicQuantizeMatMul``, which quantises the activations to uint8 at run
    time (one scale and zero point per call, over the whole input tensor) and multiplies
    in integers with the shipped int8 weights (as uint8, zero point 128) and their scales.
    Faster on the CPU, and the vectors change (cosine about 0.995 to the float path); and because the activation
    scale covers the whole input, a text's vector depends on the batch it runs in unless
    each text runs alone (the embedder runs this graph one text per call)."""
    try:
        return _prepare(memoryview(model_bytes), int8_matmul, signed)
    except (_Unsupported, UnicodeDecodeError, ValueError):
        return None


# Kept over onnx.load/numpy_helper: importing onnx made a fresh first hybrid answer 2.4x slower (adr/0060).
def _prepare(buf: memoryview, int8_matmul: bool = False, signed: bool = False) -> Prepared | None:
    top = _fields(buf)
    graphs = [f for f in top if f[0] == _MODEL_GRAPH and f[1] == 2]
    if len(graphs) != 1:
        raise _Unsupported("no single graph")
    graph_buf = graphs[0][2]
    graph_fields = _fields(graph_buf)
    nodes: list[_Node] = []
    tensors: dict[str, _Tensor] = {}
    initializer_names: list[str] = []  # in file order
    boundary: set[str] = set()  # graph inputs and outputs keep their names and values
    for number, wire, value, _s, _e in graph_fields:
        if number == _GRAPH_NODE:
            nodes.append(_node(value))
        elif number == _GRAPH_INITIALIZER:
            t = _tensor(value)
            tensors[t.name] = t
            initializer_names.append(t.name)
        elif number in (_GRAPH_INPUT, _GRAPH_OUTPUT):
            for n, _w, v, _s2, _e2 in _fields(value):
                if n == _VALUE_NAME:
                    boundary.add(_text(v))
        elif number == _GRAPH_SPARSE_INITIALIZER:
            raise _Unsupported("sparse initializers")
    consumers: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        for name in node.inputs:
            consumers.setdefault(name, []).append(index)

    def only_consumer(name: str) -> int | None:
        users = consumers.get(name, [])
        return users[0] if len(users) == 1 and name not in boundary else None

    drop: set[int] = set()
    replace: dict[int, list[bytes]] = {}
    removed_tensors: set[str] = set()
    weights: dict[str, np.ndarray] = {}
    gathered = integer = 0
    for name, t in tensors.items():
        if t.dtype != _INT8 or t.raw is None or name in boundary:
            continue
        cast_i = only_consumer(name)
        if cast_i is None:
            continue
        cast = nodes[cast_i]
        if cast.op != "Cast" or cast.domain or cast.ints.get("to") != _FLOAT or len(cast.outputs) != 1:
            continue
        mul_i = only_consumer(cast.outputs[0])
        if mul_i is None:
            continue
        mul = nodes[mul_i]
        if mul.op != "Mul" or mul.domain or len(mul.inputs) != 2 or len(mul.outputs) != 1:
            continue
        scale_name = mul.inputs[1] if mul.inputs[0] == cast.outputs[0] else mul.inputs[0]
        scale = tensors.get(scale_name)
        if (scale is None or scale.dtype != _FLOAT or scale.raw is None or only_consumer(scale_name) != mul_i
                or mul.outputs[0] in boundary):
            continue
        q = _array(t, np.int8)
        s = _array(scale, "<f4")
        out = mul.outputs[0]
        users = [nodes[i] for i in consumers.get(out, [])]
        per_row = q.ndim == 2 and s.shape == (q.shape[0], 1)
        if per_row and users and all(
            u.op == "Gather" and not u.domain and u.inputs[0] == out and u.ints.get("axis", 0) == 0
            and len(u.inputs) == 2 and len(u.outputs) == 1 for u in users
        ):
            # Gather the int8 rows and their scales, then dequantise only those rows.
            for k, user_i in enumerate(consumers[out]):
                user = nodes[user_i]
                stem = f"{out}/groundkit_gather{k}"
                replace[user_i] = [
                    _make_node("Gather", [name, user.inputs[1]], [stem + "_q"], axis=0),
                    _make_node("Gather", [scale_name, user.inputs[1]], [stem + "_scale"], axis=0),
                    _make_node("Cast", [stem + "_q"], [stem + "_f"], to=_FLOAT),
                    _make_node("Mul", [stem + "_f", stem + "_scale"], [user.outputs[0]]),
                ]
            drop.update((cast_i, mul_i))
            gathered += 1
            continue
        if (int8_matmul and users and q.ndim == 2 and s.shape in ((q.shape[1],), (1, q.shape[1])) and all(
                u.op == "MatMul" and not u.domain and len(u.inputs) == 2 and u.inputs[1] == out
                and u.inputs[0] != out and len(u.outputs) == 1 for u in users)):
            # The int8 matrix, with its scales as the 1-D per-column vector the op takes. As
            # uint8 with zero point 128 (q + 128: the same integers) unless ``signed``:
            # onnxruntime's uint8 x int8 kernel on AVX2 without VNNI (vpmaddubsw) saturates
            # pairs of products at 16 bits, so its sums are wrong where activations and weights
            # are both large; uint8 x uint8 sums exactly everywhere. Where the int8 kernel is
            # exact too (``signed``, decided by onnx_cpu's probe) it gives the same integers,
            # about twice as fast (adr/0040, adr/0042).
            stem = f"{name}/groundkit_{'s8' if signed else 'u8'}"
            if signed:
                weights[stem] = np.ascontiguousarray(q)
                weights[stem + "_zero"] = np.zeros(q.shape[1], dtype=np.int8)
            else:
                weights[stem] = np.ascontiguousarray((q.astype(np.int16) + 128).astype(np.uint8))
                weights[stem + "_zero"] = np.full(q.shape[1], 128, dtype=np.uint8)
            weights[stem + "_scale"] = np.ascontiguousarray(s.reshape(-1), dtype=np.float32)
            for user_i in consumers[out]:
                user = nodes[user_i]
                replace[user_i] = [_make_node("DynamicQuantizeMatMul",
                                              [user.inputs[0], stem, stem + "_scale", stem + "_zero"],
                                              [user.outputs[0]], domain=_MS_DOMAIN)]
            drop.update((cast_i, mul_i))
            removed_tensors.update((name, scale_name))
            integer += 1
            continue
        try:
            np.broadcast_shapes(q.shape, s.shape)
        except ValueError:
            continue
        # float32(q) * scale: the products onnxruntime's Cast and Mul kernels compute.
        w = np.array(q, dtype=np.float32)
        w *= s
        weights[out] = np.ascontiguousarray(w)
        drop.update((cast_i, mul_i))
        removed_tensors.update((name, scale_name))
    if not weights and not gathered:
        return None
    if int8_matmul and not integer:
        return None  # nothing to run in integers: the caller falls back to the float graph

    # Large int8 tables left in the graph (the gathered embeddings) are handed over as views of
    # the file's bytes too, so onnxruntime parses a graph of a few hundred kilobytes.
    views = {}
    for name, t in tensors.items():
        if t.dtype == _INT8 and t.raw is not None and name not in removed_tensors and len(t.raw) >= _VIEW_BYTES:
            views[name] = _array(t, np.int8)
    parts = []
    node_index = initializer_index = 0
    for number, wire, value, start, end in graph_fields:
        raw = graph_buf[start:end]
        if number == _GRAPH_NODE:
            i = node_index
            node_index += 1
            if i in replace:
                parts.extend(_put(_GRAPH_NODE, n) for n in replace[i])
            elif i not in drop:
                parts.append(raw)
        elif number == _GRAPH_INITIALIZER:
            name = initializer_names[initializer_index]
            initializer_index += 1
            if name in views:
                parts.append(_put(_GRAPH_INITIALIZER, _placeholder(name, views[name])))
            elif name not in removed_tensors:
                parts.append(raw)
        else:
            parts.append(raw)
    parts.extend(_put(_GRAPH_INITIALIZER, _placeholder(n, a)) for n, a in weights.items())
    graph = b"".join(parts)
    model = b"".join(_put(_MODEL_GRAPH, graph) if number == _MODEL_GRAPH else buf[start:end]
                     for number, _w, _v, start, end in top)
    if integer and not any(
            n == _MODEL_OPSET and w == 2 and any(f == _OPSET_DOMAIN and _text(v2) == _MS_DOMAIN
                                                 for f, _w2, v2, _s2, _e2 in _fields(v))
            for n, w, v, _s, _e in top):
        model += _put(_MODEL_OPSET, _put(_OPSET_DOMAIN, _MS_DOMAIN.encode()) + _put_int(_OPSET_VERSION, 1))
    return Prepared(model, {**views, **weights}, folded=len(weights) - 3 * integer, gathered=gathered,
                    integer=integer)


# -- whether onnxruntime's uint8 x int8 kernel sums exactly on this CPU --------------------

_VALUE_TYPE, _TYPE_TENSOR, _TENSOR_ELEM, _TENSOR_SHAPE, _SHAPE_DIM, _DIM_VALUE = 2, 1, 1, 2, 1, 1


def _value_info(name: str, shape: tuple[int, ...]) -> bytes:
    dims = b"".join(_put(_SHAPE_DIM, _put_int(_DIM_VALUE, d)) for d in shape)
    tensor = _put_int(_TENSOR_ELEM, _FLOAT) + _put(_TENSOR_SHAPE, dims)
    return _put(_VALUE_NAME, name.encode()) + _put(_VALUE_TYPE, _put(_TYPE_TENSOR, tensor))


def _constant(name: str, array: np.ndarray) -> bytes:
    """An initializer holding its data."""
    return _tensor_head(name, array) + _put(_TENSOR_RAW, np.ascontiguousarray(array).tobytes())


def signed_probe(rows: int = 8, k: int = 384, n: int = 384) -> tuple[bytes, np.ndarray, float]:
    """A one-node model (``DynamicQuantizeMatMul`` of a ``[rows, k]`` input by a ``[k, n]``
    int8 matrix of 127s, scale 1, zero point 0, as MiniLM's matrices are multiplied with
    ``signed``), an input of ones and what every output is in exact integers: 127 * k. The
    input quantises to 255 throughout, so each pair of products is 64,770; a kernel that
    saturates pairs at 16 bits (32,767) answers about half. The shapes are MiniLM's."""
    node = _make_node("DynamicQuantizeMatMul", ["a", "b", "b_scale", "b_zero"], ["y"], domain=_MS_DOMAIN)
    graph = (_put(_GRAPH_NODE, node) + _put(_GRAPH_NAME, b"groundkit-probe")
             + _put(_GRAPH_INITIALIZER, _constant("b", np.full((k, n), 127, dtype=np.int8)))
             + _put(_GRAPH_INITIALIZER, _constant("b_scale", np.ones(n, dtype=np.float32)))
             + _put(_GRAPH_INITIALIZER, _constant("b_zero", np.zeros(n, dtype=np.int8)))
             + _put(_GRAPH_INPUT, _value_info("a", (rows, k)))
             + _put(_GRAPH_OUTPUT, _value_info("y", (rows, n))))
    opsets = (_put(_MODEL_OPSET, _put(_OPSET_DOMAIN, b"") + _put_int(_OPSET_VERSION, 13))
              + _put(_MODEL_OPSET, _put(_OPSET_DOMAIN, _MS_DOMAIN.encode()) + _put_int(_OPSET_VERSION, 1)))
    model = _put_int(_MODEL_IR_VERSION, 8) + opsets + _put(_MODEL_GRAPH, graph)
    return model, np.ones((rows, k), dtype=np.float32), 127.0 * k
