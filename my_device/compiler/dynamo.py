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
# rounding: its math decomposition rounds differently, on CPU too. select's and slice's backward
# decompose into a zero fill, an arange, a comparison and a broadcast `where` per index (an attention
# layer's q/k/v split took twice the time of the CPU kernels), where the CPU kernel writes zeros and one slice.
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
    "select_backward.default",
    "slice_backward.default",
)


# Pointwise ops whose foreach forms (the optimizers' `_foreach_*` calls) are traced as one op per
# tensor, so that the compiler fuses an optimizer's whole update of a parameter into one pass. Kept
# as list ops they would be calls of the generic kernel, one per list and per step of the update.
_FOREACH_POINTWISE = (
    "abs", "add", "addcdiv", "addcmul", "clamp_max", "clamp_min", "div", "exp", "lerp", "log", "maximum",
    "minimum", "mul", "neg", "pow", "reciprocal", "rsqrt", "sigmoid", "sign", "sqrt", "sub", "tanh",
)


_KEYWORD_ONLY = ("value", "alpha")


def _per_tensor(packet, schema):
    lists = [i for i, a in enumerate(schema.arguments) if str(a.type) in ("List[Tensor]", "List[number]")]
    names = {schema.arguments[i].name for i in lists}

    def run(*args, **kwargs):
        n = len(args[lists[0]]) if lists[0] < len(args) else len(kwargs[schema.arguments[lists[0]].name])
        out = []
        for i in range(n):
            a, kw = [], {k: (v[i] if k in names else v) for k, v in kwargs.items()}
            for k, x in enumerate(args):
                name, value = schema.arguments[k].name, (x[i] if k in lists else x)
                # addcmul's and addcdiv's `value`, add's and sub's `alpha` are keyword-only there.
                if name in _KEYWORD_ONLY:
                    kw[name] = value
                else:
                    a.append(value)
            out.append(packet(*a, **kw))
        return out

    return run


def _foreach_decompositions():
    table = {}
    for base in _FOREACH_POINTWISE:
        packet = getattr(torch.ops.aten, f"_foreach_{base}", None)
        if packet is None:
            continue
        for name in packet.overloads():
            overload = getattr(packet, name)
            schema = overload._schema
            # Functional overloads only (functionalization has turned the in-place ones into these),
            # and only those whose per-tensor form is the plain op: a `Tensor scalars` argument
            # (one value per tensor, in a tensor) would need host reads.
            types = [str(a.type) for a in schema.arguments]
            if name.endswith("out") or schema.is_mutable or ("Tensor" in types and base in ("addcmul", "addcdiv")):
                continue
            if not any(t in ("List[Tensor]", "List[number]") for t in types):
                continue
            table[overload] = _per_tensor(getattr(torch.ops.aten, base), schema)
    return table


_CORE_LERP = core_aten_decompositions()[torch.ops.aten.lerp.Scalar]


def _lerp_scalar(start, end, weight):
    """lerp with a number weight (the optimizers' exp_avg update) as plain arithmetic the compiler
    fuses. Core ATen's decomposition makes the weight a tensor first (a fill), which is not."""
    if start.dtype != end.dtype or not start.dtype.is_floating_point or isinstance(weight, complex):
        return _CORE_LERP(start, end, weight)
    # The CPU kernel's two forms, chosen as it chooses them: the one near the closer end.
    if abs(weight) < 0.5:
        return (end - start) * weight + start
    return (end - start) * (weight - 1) + end


def decompositions():
    """core_aten_decompositions() less the ops in _KEEP_WHOLE, plus the optimizers' foreach ops as
    per-tensor ops."""
    table = dict(core_aten_decompositions())
    for name in _KEEP_WHOLE:
        packet, overload = name.split(".")
        table.pop(getattr(getattr(torch.ops.aten, packet), overload), None)
    table.update(_foreach_decompositions())
    table[torch.ops.aten.lerp.Scalar] = _lerp_scalar
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
