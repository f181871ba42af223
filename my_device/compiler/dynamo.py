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


# Ops that core-ATen decomposition would break up but that are better kept whole: the device runs
# them with PyTorch's fused CPU kernels (attention, norms' and losses' backward), or the compiler
# fuses them as they are (the activations' backward). Keeping attention whole also keeps eager's
# rounding: its math decomposition rounds differently, on CPU too.
_KEEP_WHOLE = (
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "native_layer_norm_backward.default",
    "native_batch_norm_backward.default",
    "_softmax_backward_data.default",
    "_log_softmax_backward_data.default",
    "nll_loss_forward.default",
    "nll_loss_backward.default",
    "embedding_dense_backward.default",
    "mse_loss.default",
    "mse_loss_backward.default",
    "silu.default",
    "silu_backward.default",
    "gelu_backward.default",
    "tanh_backward.default",
    "sigmoid_backward.default",
)


def decompositions():
    """core_aten_decompositions() less the ops in _KEEP_WHOLE."""
    table = dict(core_aten_decompositions())
    for name in _KEEP_WHOLE:
        packet, overload = name.split(".")
        table.pop(getattr(getattr(torch.ops.aten, packet), overload), None)
    return table


@functools.cache
def _backend():
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        decompositions=decompositions(),
    )


def mydev_backend(gm, example_inputs, **kwargs):
    """The `mydev` Dynamo backend (also reachable through the torch_dynamo_backends entry point)."""
    return _backend()(gm, example_inputs, **kwargs)


def register():
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "mydev" not in _BACKENDS or _BACKENDS["mydev"] is None:
        register_backend(name="mydev")(mydev_backend)
