"""The mydev graph compiler: one compiler, several frontends.

- `torch.compile(model, backend="mydev")` (dynamo.py, through aot_autograd);
- programs written by hand or by another frontend: `compile(text)` (the text form is described in
  csrc/compiler/Graph.h).

Each program fuses chains of elementwise ops (and reductions of them) into single passes over
memory, plans its intermediates in one arena by liveness, and runs as ONE task on the current
stream: the host returns at once.
"""
from .. import _C
from . import graph_module

Program = _C._compiler.Program


def compile(text):
    """A Program from its text form; `program.run([tensors])` queues it and returns its outputs."""
    return _C._compiler.compile(text)


def counters():
    """Process-wide: graphs_compiled, fused_groups, fused_nodes, launches, ops_launched (graph nodes
    run by those launches; ops_launched / launches is the ops per launch), graphs_eager (graphs the
    compiler could not express, run op by op) and specializations (programs made for new sizes of a
    dynamic graph)."""
    c = dict(_C._compiler.counters())
    c.update(graph_module.stats())
    return c


def reset_counters():
    _C._compiler.reset_counters()
    graph_module.reset_stats()


def last_graphs(n=2):
    """The last `n` CompiledGraphs made by the mydev backend (forward, backward...), newest last."""
    from .dynamo import _compiled

    return list(_compiled[-n:])


def dump(n=2):
    """A readable dump of the last `n` programs: the graph, its steps and kernels, and its memory plan."""
    return "\n".join(g.dump() for g in last_graphs(n))


__all__ = ["Program", "compile", "counters", "dump", "last_graphs", "reset_counters"]
