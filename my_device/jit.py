"""TorchScript on mydev, through the mydev graph compiler (csrc/jit, csrc/compiler).

Ahead of time: `to_mydev(scripted, example_inputs)` lowers methods of a scripted module with
`torch._C._jit_to_backend("mydev", ...)`: each method becomes one mydev program (its text and the
frozen weights are what the lowered module saves), run as a single launch on the current stream.

Transparently: inside `fusion()` (or after `enable()`), TorchScript's optimizer moves maximal runs of
ops a program can express into `mydev::CompilationGroup` nodes, compiled the first time each input
geometry is seen. Graphs that record autograd are left alone (a group has no backward).
"""
import contextlib

import torch

from . import _C


def _spec(example_inputs):
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    return {"inputs": tuple(example_inputs)}


def to_mydev(module, example_inputs, methods=("forward",)):
    """`module` (scripted) lowered to the mydev backend. `example_inputs` fixes each method's input
    geometry: a tuple of tensors for every method, or a dict {method: tuple of tensors}."""
    if not isinstance(module, torch.jit.ScriptModule):
        raise TypeError(f"to_mydev expects a scripted module (torch.jit.script), got {type(module).__name__}")
    if isinstance(example_inputs, dict):
        spec = {m: _spec(example_inputs[m]) for m in methods}
    else:
        spec = {m: _spec(example_inputs) for m in methods}
    for m in methods:
        # A traced module's inputs can share a name (each is named after the parameter the tracer first met
        # it as: `inp`); torch's to_backend writes its wrapper from those names and, with two alike, passes
        # one input in both places, a silent wrong value. test_jit.py::test_to_backend_still_merges_input_names
        # notices when torch stops doing it.
        _C._jit.distinct_argument_names(module, m)
    return torch._C._jit_to_backend("mydev", module, spec)


def to_mydev_selective(module, example_inputs, submodules):
    """`module` (scripted) with the submodules named in `submodules` (dotted paths) lowered to mydev and
    the rest left in TorchScript (torch._C._jit_to_backend_selective, which also retypes the parents).
    `example_inputs` maps each path to its submodule's forward inputs."""
    remaining = list(submodules)

    def lower_one(sub):
        # Called once per path, in the order given, with (a clone of) that submodule.
        return to_mydev(sub, example_inputs[remaining.pop(0)])

    return torch._C._jit_to_backend_selective(module, lower_one, list(submodules))


def enable():
    """Turns on transparent mode for every TorchScript graph optimized from now on, and for those optimized
    before: every live scripted function and module method is re-optimized at its next call."""
    if not _C._jit.fusion_enabled():
        _flush_optimized_graphs()
    _C._jit.enable_fusion(True)


def _flush_optimized_graphs():
    # TorchScript optimizes a function once and keeps the plan (its executor is shared by every instance of
    # a scripted class), so a class run before transparent mode was on would never get its groups. The only
    # handle on those plans is each function's _debug_flush_compilation_cache; the live functions are found
    # among the interpreter's objects (by type, which reads no attribute of theirs).
    import gc

    for obj in gc.get_objects():
        kind = type(obj)
        if issubclass(kind, torch.jit.ScriptFunction):
            obj._debug_flush_compilation_cache()
        elif issubclass(kind, torch.jit.RecursiveScriptModule):
            for name in obj._c._method_names():
                flush = getattr(getattr(obj, name, None), "_debug_flush_compilation_cache", None)
                if flush is not None:  # (a Python override of a method has none)
                    flush()


def disable():
    _C._jit.enable_fusion(False)


@contextlib.contextmanager
def fusion():
    """Transparent mode inside the block (graphs optimized in it keep their groups afterwards)."""
    was = _C._jit.fusion_enabled()
    enable()
    try:
        yield
    finally:
        if not was:
            disable()


def stats():
    """{'groups_compiled', 'groups_run'} of transparent mode, process-wide."""
    return dict(_C._jit.fusion_stats())


def reset_stats():
    _C._jit.reset_fusion_stats()


__all__ = ["disable", "enable", "fusion", "reset_stats", "stats", "to_mydev", "to_mydev_selective"]
