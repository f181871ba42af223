"""torch.compile(model, backend="mydev"): Dynamo -> aot_autograd -> the mydev graph compiler.

aot_autograd traces the forward and backward into functional core-ATen graphs; each becomes one
mydev program (csrc/compiler) that runs as a single task on the current stream.
"""
import functools

import torch
from torch._decomp import core_aten_decompositions

from .graph_module import CompiledGraph

_compiled = []  # the CompiledGraphs made, newest last (my_device.compiler.last_program())


def _compiler(kind):
    def compile_graph(gm, example_inputs):
        graph = CompiledGraph(gm, kind)
        _compiled.append(graph)
        del _compiled[:-16]

        def run(args):
            return graph(args)

        # aot_autograd calls compiled graphs with one list argument when this is
        # set on the function itself (not on a class: see the extension-points notes).
        run._boxed_call = True
        run.mydev_graph = graph
        return run

    return compile_graph


@functools.cache
def _backend():
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        decompositions=core_aten_decompositions(),
    )


def mydev_backend(gm, example_inputs, **kwargs):
    """The `mydev` Dynamo backend (also reachable through the torch_dynamo_backends entry point)."""
    return _backend()(gm, example_inputs, **kwargs)


def register():
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "mydev" not in _BACKENDS or _BACKENDS["mydev"] is None:
        register_backend(name="mydev")(mydev_backend)
