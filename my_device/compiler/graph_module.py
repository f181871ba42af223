"""One FX graph compiled for mydev: the callable aot_autograd's compilers return.

Static graphs are lowered once. A graph with symbolic sizes (torch.compile(dynamic=True)) is lowered
per concrete input geometry the first time it is seen, with FakeTensor propagation giving that
geometry's metadata: Dynamo still compiles the frame once, and the program cache keeps one program
per size. A graph the program cannot express runs eagerly (its ops are ordinary mydev kernels), with
a warning naming the reason, counted in my_device.compiler.counters()["graphs_eager"].
"""
import itertools
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from .. import _C
from .lowering import Unsupported, lower

_names = itertools.count()
_stats = {"graphs_eager": 0, "specializations": 0}


def _is_symbolic(val):
    if isinstance(val, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride(), val.storage_offset()))
    return isinstance(val, (torch.SymInt, torch.SymFloat))


class _Lowered:
    __slots__ = ("program", "positions", "constants", "results")

    def __init__(self, gm, name):
        text, self.positions, self.constants, self.results = lower(gm, name)
        self.program = _C._compiler.compile(text)

    def __call__(self, args):
        inputs = [args[i] for i in self.positions]
        inputs.extend(self.constants)
        outs = iter(self.program.run(inputs))
        return [next(outs) if kind == "value" else v for kind, v in self.results]


def _is_host_value(val):
    if isinstance(val, (list, tuple)):
        return len(val) > 0 and all(_is_host_value(v) for v in val)
    return isinstance(val, torch.Tensor) and val.device.type == "cpu"


def split_host_prologue(gm):
    """Splits off the ops that compute on CPU tensors only, which the host must run at the call.

    An optimizer compiled with capturable=False keeps its step counts on the CPU: the graph
    increments them and derives bias corrections from them, which mydev kernels then read as
    scalars. Run inside a queued program those CPU ops would finish later than the host expects
    (it may read a step count right after the call). So they form a prologue the host runs first;
    its results that the rest reads become the program's extra inputs, 0-dim CPU tensors the
    launch copies. Returns (prologue, rest), or None when there is nothing to split off or an op
    on CPU tensors reads a device tensor (that needs the device's result: the graph runs eagerly).
    """
    nodes = list(gm.graph.nodes)
    host = set()
    for node in nodes:
        if node.op == "placeholder":
            if _is_host_value(node.meta.get("val")):
                host.add(node)
        elif node.op == "call_function" and _is_host_value(node.meta.get("val")):
            if not all(a in host for a in node.all_input_nodes):
                return None
            host.add(node)
    computed = [n for n in nodes if n in host and n.op != "placeholder"]
    if not computed:
        return None
    # Host values the rest of the graph reads (a getitem of a host node is itself a host node).
    exported = [n for n in computed if any(u not in host for u in n.users)]
    placeholders = [n for n in nodes if n.op == "placeholder"]

    prologue = torch.fx.Graph()
    env = {}
    for n in placeholders:
        env[n] = prologue.node_copy(n)
    for n in computed:
        env[n] = prologue.node_copy(n, lambda a: env[a])
    prologue.output(tuple(env[n] for n in exported))

    rest = torch.fx.Graph()
    env = {}
    for n in placeholders:
        env[n] = rest.node_copy(n)
    for n in exported:
        p = rest.placeholder(f"host_{n.name}")
        p.meta = dict(n.meta)
        env[n] = p
    for n in nodes:
        if n.op == "placeholder" or n in host:
            continue
        env[n] = rest.node_copy(n, lambda a: env[a])
    return torch.fx.GraphModule(gm, prologue), torch.fx.GraphModule(gm, rest)


class CompiledGraph:
    """The boxed callable for one FX graph (aot_autograd's forward, backward or inference graph)."""

    def __init__(self, gm, kind):
        self.gm = gm
        self.name = f"mydev_{kind}_{next(_names)}"
        self.dynamic = any(_is_symbolic(n.meta.get("val")) for n in gm.graph.nodes)
        self.programs = {}
        self.eager = None
        self.lowered = None
        self.prologue = None
        if not self.dynamic:
            split = split_host_prologue(gm)
            if split is not None:
                self.prologue, gm = split
            self.lowered = self._lower(gm)
            if self.lowered is None:
                self.prologue = None  # the whole original graph runs eagerly

    def _lower(self, gm):
        try:
            return _Lowered(gm, self.name)
        except (Unsupported, RuntimeError) as e:
            _stats["graphs_eager"] += 1
            warnings.warn(f"mydev compiler: graph {self.name} runs eagerly: {e}", stacklevel=3)
            self.eager = gm
            return None

    def _specialize(self, args):
        key = tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        lowered = self.programs.get(key)
        if lowered is None and key not in self.programs:
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            fakes = [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]
            FakeTensorProp(self.gm, mode).propagate_dont_convert_inputs(*fakes)
            _stats["specializations"] += 1
            lowered = self.programs[key] = self._lower(self.gm)
        return lowered

    def __call__(self, args):
        lowered = self._specialize(args) if self.dynamic else self.lowered
        if lowered is None:
            out = self.gm(*args)
        else:
            inputs = args if self.prologue is None else [*args, *self.prologue(*args)]
            out = lowered(inputs)
            del inputs
        args.clear()  # the boxed convention: inputs may be freed as early as the caller allows
        return out

    def dump(self):
        if self.lowered is not None:
            return self.lowered.program.dump()
        return "\n".join(p.program.dump() for p in self.programs.values() if p is not None)


def stats():
    return dict(_stats)


def reset_stats():
    for k in _stats:
        _stats[k] = 0
