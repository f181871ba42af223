"""The frontends an OpInfo sample can run through on mydev, for `--frontend`.

eager     the op called on mydev tensors (the default sweep);
compile   torch.compile(backend="mydev"): the device's own compiler;
inductor  torch.compile with Inductor, which generates code for mydev;
lazy      lazy tensors on mydev (my_device.lazy): the call is traced and run as
          a mydev program at mark_step (a module: its parameters and buffers as
          lazy copies, through torch.func.functional_call).

Each sample is compiled afresh (torch._dynamo.reset()), with static shapes:
Dynamo would otherwise stop compiling an op after a few samples of other
shapes (its recompile limit) and run the rest eagerly. The sample's tensors are
the compiled function's arguments, not constants baked into the graph.
"""
FRONTENDS = ("eager", "compile", "inductor", "lazy")
# The frontends the ModuleInfo suite can run a module through.
MODULE_FRONTENDS = ("eager", "compile", "inductor", "lazy")


def check(name, allowed=FRONTENDS):
    if name not in allowed:
        raise ValueError(f"frontend {name!r} is not one of {', '.join(allowed)}")
    return name


def _tree_map(fn, x, leaf=None):
    """x with fn applied to each of its `leaf`s (tensors by default), through lists, tuples and dicts."""
    import torch

    if isinstance(x, leaf or torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        mapped = [_tree_map(fn, e, leaf) for e in x]
        return type(x)(mapped) if not hasattr(x, "_fields") else type(x)(*mapped)
    if isinstance(x, dict):
        return {k: _tree_map(fn, v, leaf) for k, v in x.items()}
    return x


def _seeded_outside_the_graph(op, *args, **kwargs):
    """torch.testing's wrapper_set_seed, through which the OpInfos of random ops call them, with its
    freeze_rng_state and manual_seed(42) run eagerly around the compiled call: Dynamo cannot trace
    freeze_rng_state (it reads the generators under no_dispatch). The op itself is still compiled."""
    import torch

    state = torch._dynamo.disable(_freeze_and_seed)()
    out = op(*args, **kwargs)
    torch._dynamo.disable(_thaw)(state)
    return out


def _freeze_and_seed():
    import torch
    from torch.testing._internal.common_utils import freeze_rng_state

    state = freeze_rng_state()
    state.__enter__()
    torch.manual_seed(42)
    return state


def _thaw(state):
    state.__exit__(None, None, None)


def _seed_random_ops_outside_graphs():
    """Points every OpInfo module's wrapper_set_seed at _seeded_outside_the_graph (once)."""
    import sys

    from torch.testing import _utils

    original = _utils.wrapper_set_seed
    for module in list(sys.modules.values()):
        if getattr(module, "wrapper_set_seed", None) is original and module is not _utils:
            module.wrapper_set_seed = _seeded_outside_the_graph


def _compiled(fn, frontend):
    """fn compiled afresh by `frontend` ("compile" or "inductor"), with static shapes."""
    import torch

    _seed_random_ops_outside_graphs()
    torch._dynamo.reset()
    return torch.compile(fn, backend="mydev" if frontend == "compile" else "inductor", dynamic=False)


def _lazy_call(op, sample):
    import torch._lazy

    import my_device.lazy as ml

    ml.init()
    to_lazy = lambda t: t.to("lazy") if t.device.type == "mydev" else t  # noqa: E731
    out = op(_tree_map(to_lazy, sample.input), *_tree_map(to_lazy, list(sample.args)),
             **_tree_map(to_lazy, dict(sample.kwargs)))
    torch._lazy.mark_step()
    return _tree_map(lambda t: t.to("mydev") if t.device.type == "lazy" else t, out)


def call(frontend, op, sample):
    """op(sample) through `frontend`, for a sample whose tensors are on mydev."""
    if frontend == "eager":
        return op(sample.input, *sample.args, **sample.kwargs)
    if frontend == "lazy":
        return _lazy_call(op, sample)
    def body(inp, args, kwargs):
        return op(inp, *args, **kwargs)

    return _compiled(body, frontend)(sample.input, list(sample.args), dict(sample.kwargs))


def _lazy_module_call(module, args, kwargs):
    """module(*args, **kwargs) on lazy tensors: its parameters and buffers (lazy copies, through which
    gradients reach the mydev parameters), and its arguments, with torch.func.functional_call; the
    buffers it updated (running statistics) are copied back into the module, as an eager call leaves them."""
    import torch
    import torch._lazy
    from torch.func import functional_call

    import my_device.lazy as ml

    ml.init()
    to_lazy = lambda t: t.to("lazy") if t.device.type == "mydev" else t  # noqa: E731
    buffers = dict(module.named_buffers())
    state = {name: to_lazy(t) for name, t in [*module.named_parameters(), *buffers.items()]}
    out = functional_call(module, state, _tree_map(to_lazy, tuple(args)), _tree_map(to_lazy, dict(kwargs)))
    torch._lazy.mark_step()
    with torch.no_grad():
        for name, buffer in buffers.items():
            if buffer is not None and state[name] is not None:
                buffer.copy_(state[name].to(buffer.device))
    return _tree_map(lambda t: t.to("mydev") if t.device.type == "lazy" else t, out)


def call_module(frontend, module, args, kwargs):
    """module(*args, **kwargs) through `frontend` (one of MODULE_FRONTENDS)."""
    if frontend == "eager":
        return module(*args, **kwargs)
    if frontend == "lazy":
        return _lazy_module_call(module, args, kwargs)
    return _compiled(module, frontend)(*args, **kwargs)
