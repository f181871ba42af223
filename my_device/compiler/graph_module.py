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


class CompiledGraph:
    """The boxed callable for one FX graph (aot_autograd's forward, backward or inference graph)."""

    def __init__(self, gm, kind):
        self.gm = gm
        self.name = f"mydev_{kind}_{next(_names)}"
        self.dynamic = any(_is_symbolic(n.meta.get("val")) for n in gm.graph.nodes)
        self.programs = {}
        self.eager = None
        self.lowered = None
        if not self.dynamic:
            self.lowered = self._lower(gm)

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
            out = lowered(args)
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
