"""FX graph (ATen ops, with FakeTensor metadata) -> mydev program text (csrc/compiler/Graph.h).

This is the Dynamo frontend's half of lowering; the compiler itself (fusion, memory plan, the
single-launch executor) is C++ and shared with the TorchScript and Lazy Tensor frontends.
"""
import math
import operator

import torch
from torch.fx.node import Node

# c10::ScalarType names, as Graph.cpp reads them.
_DTYPE_NAMES = {
    torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int", torch.int64: "Long",
    torch.float16: "Half", torch.float32: "Float", torch.float64: "Double", torch.complex32: "ComplexHalf",
    torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble", torch.bool: "Bool",
    torch.bfloat16: "BFloat16",
}
_LAYOUTS = {torch.strided: 0, torch.sparse_coo: 1, torch.sparse_csr: 2}
_MEMORY_FORMATS = {torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2,
                   torch.channels_last_3d: 3}


class Unsupported(Exception):
    """The graph has something a mydev program cannot express; the frontend runs it eagerly."""


def tensor_meta(t, host_scalar_ok=False):
    if not isinstance(t, torch.Tensor):
        raise Unsupported(f"expected a tensor, got {type(t).__name__}")
    if t.device.type != "mydev" and not (host_scalar_ok and t.device.type == "cpu" and t.dim() == 0):
        raise Unsupported(f"a {t.device.type} tensor inside the graph")
    if t.layout != torch.strided or t.dtype not in _DTYPE_NAMES:
        raise Unsupported(f"a {t.layout} {t.dtype} tensor")
    sizes = ",".join(str(int(s)) for s in t.shape)
    strides = ",".join(str(int(s)) for s in t.stride())
    return f"{_DTYPE_NAMES[t.dtype]}[{sizes}]{{{strides}}}+{int(t.storage_offset())}"


def _quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Emitter:
    def __init__(self, name):
        self.lines = [f"program {name}"]
        self.ids = {}        # (fx node, index or None) -> value id
        self.consts = {}     # fx node -> python constant (non-tensor values)
        self.next_id = 0

    def new_value(self):
        self.next_id += 1
        return self.next_id - 1

    def arg(self, a):
        if isinstance(a, Node):
            if a in self.consts:
                return self.arg(self.consts[a])
            key = (a, None)
            if key not in self.ids:
                raise Unsupported(f"{a.format_node()} is not a tensor value of the program")
            return f"%{self.ids[key]}"
        if a is None:
            return "n"
        if isinstance(a, bool):
            return "b1" if a else "b0"
        if isinstance(a, (int, torch.SymInt)):
            return f"i{int(a)}"
        if isinstance(a, (float, torch.SymFloat)):
            a = float(a)
            if math.isnan(a):
                return "fnan"
            if math.isinf(a):
                return "finf" if a > 0 else "f-inf"
            return "f" + repr(a)
        if isinstance(a, str):
            return "s" + _quote(a)
        if isinstance(a, torch.dtype):
            return "t" + _quote(_DTYPE_NAMES[a])
        if isinstance(a, torch.layout):
            return f"i{_LAYOUTS[a]}"
        if isinstance(a, torch.memory_format):
            return f"i{_MEMORY_FORMATS[a]}"
        if isinstance(a, torch.device):
            return "d" + _quote(str(a))
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(self.arg(x) for x in a) + "]"
        raise Unsupported(f"an argument of type {type(a).__name__}")


def _schema_args(op, node):
    """Every argument of the op's schema, in order, defaults filled in."""
    out = []
    schema = op._schema
    for i, formal in enumerate(schema.arguments):
        if not formal.kwarg_only and i < len(node.args):
            out.append(node.args[i])
        elif formal.name in node.kwargs:
            out.append(node.kwargs[formal.name])
        elif formal.has_default_value():
            out.append(formal.default_value)
        else:
            raise Unsupported(f"{op} is missing its argument '{formal.name}'")
    return out


def _op_name(op):
    name = op._schema.name
    return name + ("." + op._schema.overload_name if op._schema.overload_name else "")


def lower(gm, name, params=None):
    """The program text of `gm`, the order of its tensor inputs (placeholder positions), the tensors
    of its get_attr constants (appended to the inputs), and how to assemble its outputs.

    Node metadata (node.meta["val"]) must hold concrete FakeTensors.
    """
    e = _Emitter(name)
    input_positions = []
    constants = []
    placeholder_index = 0
    body = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            if isinstance(val, torch.Tensor):
                vid = e.new_value()
                e.ids[(node, None)] = vid
                # A 0-dim CPU input is a scalar argument the launch copies (Program::run).
                e.lines.append(f"input %{vid} : {tensor_meta(val, host_scalar_ok=True)}")
                input_positions.append(placeholder_index)
            elif isinstance(val, (int, float, bool, torch.SymInt)) or val is None:
                e.consts[node] = val
                if isinstance(val, torch.SymInt):
                    raise Unsupported("a symbolic input (compile per size)")
            else:
                raise Unsupported(f"an input of type {type(val).__name__}")
            placeholder_index += 1
        elif node.op == "get_attr":
            t = getattr(gm, node.target)
            if not isinstance(t, torch.Tensor):
                raise Unsupported(f"a constant of type {type(t).__name__}")
            if t.device.type != "mydev":
                t = t.to("mydev")
            vid = e.new_value()
            e.ids[(node, None)] = vid
            constants.append(t)
            body.append(("const", vid, t))
        elif node.op == "call_function":
            if node.target is operator.getitem:
                src, index = node.args
                if (src, index) not in e.ids:
                    raise Unsupported(f"getitem of {src.format_node()}")
                e.ids[(node, None)] = e.ids[(src, index)]
                continue
            if not isinstance(node.target, torch._ops.OpOverload):
                raise Unsupported(f"a call of {node.target}")
            if isinstance(val, (int, float, bool, torch.SymInt)):
                e.consts[node] = val  # shape arithmetic, known at compile time
                continue
            arg_text = ", ".join(e.arg(a) for a in _schema_args(node.target, node))
            if isinstance(val, torch.Tensor):
                vid = e.new_value()
                e.ids[(node, None)] = vid
                outs, metas = f"%{vid}", tensor_meta(val)
            elif isinstance(val, (list, tuple)):
                ids, ms = [], []
                for i, v in enumerate(val):
                    if v is None:
                        ids.append("_")
                        ms.append("_")
                        continue
                    vid = e.new_value()
                    e.ids[(node, i)] = vid
                    ids.append(f"%{vid}")
                    ms.append(tensor_meta(v))
                if not ids:
                    raise Unsupported(f"{node.target} returns nothing")
                outs, metas = ", ".join(ids), ", ".join(ms)
            else:
                raise Unsupported(f"{node.target} returns {type(val).__name__}")
            stack = node.meta.get("stack_trace")
            where = ""
            if stack:
                last = stack.strip().splitlines()
                where = f' @ {_quote(last[-2].strip() if len(last) > 1 else last[-1].strip())}'
            body.append(("line", f"{outs} = {_op_name(node.target)}({arg_text}) : {metas}{where}"))
        elif node.op == "output":
            results = []
            for r in node.args[0]:
                if isinstance(r, Node) and (r, None) in e.ids:
                    results.append(("value", e.ids[(r, None)]))
                elif isinstance(r, Node) and r in e.consts:
                    results.append(("const", e.consts[r]))
                elif r is None or isinstance(r, (int, float, bool)):
                    results.append(("const", r))
                else:
                    raise Unsupported(f"an output {r}")
        else:
            raise Unsupported(f"a {node.op} node")
    # get_attr constants are inputs after the placeholders'.
    for kind, *rest in body:
        if kind == "const":
            vid, t = rest
            e.lines.append(f"input %{vid} : {tensor_meta(t)}")
    for kind, *rest in body:
        if kind == "line":
            e.lines.append(rest[0])
    tensor_results = [v for k, v in results if k == "value"]
    e.lines.append("output" + "".join(f" %{v}" for v in tensor_results))
    return "\n".join(e.lines) + "\n", input_positions, constants, results
