"""Module conversion (`Module.to`, `.mydev()`, `.cpu()`, `.double()`...) that keeps
Parameter objects, and so ties and optimizers, across the mydev boundary.

Why this exists: `nn.Module._apply` keeps a Parameter (it assigns `param.data`)
only when `torch._has_compatible_shallow_copy_type(param, converted)` is true.
In torch 2.13, `TensorImpl::has_compatible_shallow_copy_type` accepts pairs of
dense tensors only for the CPU, CUDA, MPS, HIP, XPU and HPU backends (and sparse
pairs for a similar list); PrivateUse1 is in neither list. So a CPU -> mydev
conversion (and mydev -> CPU) replaces every Parameter with a new one: a weight
shared by two modules (GPT-2's `lm_head`/`wte`) becomes two Parameters, and an
optimizer built before the conversion holds Parameters the module no longer
uses. CUDA keeps them.

`.data =` cannot serve mydev anyway: it copies a tensor's metadata into the
existing TensorImpl, and a CPU tensor's TensorImpl is not a MyDevTensorImpl. The
path PyTorch offers for TensorImpls that cannot be shallow-copied is
`torch.utils.swap_tensors` (`torch.__future__.set_swap_module_params_on_conversion`):
the Parameter object keeps its identity and takes the converted tensor. This
module turns that path on for one module's own parameters, for the duration of
its `_apply`, exactly when one of them converts between mydev and another dense
backend that torch would have kept under CUDA. Every other conversion runs
PyTorch's code unchanged (`test/test_module_conversion.py` checks that torch
still excludes PrivateUse1, so that this can be removed when torch fixes it).
"""
import functools
import warnings
import weakref

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

# The backends TensorImpl::has_compatible_shallow_copy_type counts as dense
# (c10/core/TensorImpl.h), plus mydev.
_DENSE_DEVICE_TYPES = {"cpu", "cuda", "mps", "hip", "xpu", "hpu"}
_SPARSE_COMPRESSED = {torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc}

_torch_apply = torch.nn.Module._apply


def _layout_family(t):
    if t.is_nested or t.is_quantized:
        return None
    if t.layout == torch.strided:
        return "dense"
    if t.layout == torch.sparse_coo:
        return "sparse"
    if t.layout in _SPARSE_COMPRESSED:
        return "sparse_compressed"
    return None


def _kept_on_cuda_not_on_mydev(tensor, converted):
    """True when torch replaces the Parameter only because one side is mydev:
    with CUDA in mydev's place, `has_compatible_shallow_copy_type` would hold."""
    backend = torch._C._get_privateuse1_backend_name()
    if tensor is converted or backend not in (tensor.device.type, converted.device.type):
        return False
    if is_traceable_wrapper_subclass(tensor) or is_traceable_wrapper_subclass(converted):
        return False  # PyTorch swaps those itself
    if torch._has_compatible_shallow_copy_type(tensor, converted):
        return False  # PyTorch keeps the Parameter (mydev to mydev, e.g. .double())
    dense = _DENSE_DEVICE_TYPES | {backend}
    if tensor.device.type not in dense or converted.device.type not in dense:
        return False  # meta, for one, is not kept on CUDA either
    family = _layout_family(tensor)
    return family is not None and family == _layout_family(converted)


def _swappable(param):
    # The conditions torch.utils.swap_tensors checks: where they fail, PyTorch's
    # own behaviour (a new Parameter) is kept rather than raising. A second
    # reference is allowed only when it is the parameter's existing
    # AccumulateGrad node; one held elsewhere (a scripted copy of the module)
    # is not.
    if weakref.getweakrefs(param):
        return False
    count = param._use_count()
    if count == 1:
        return True
    if count != 2 or not param.is_leaf or not param.requires_grad:
        return False
    node = torch.autograd.graph.get_gradient_edge(param).node
    existed = param._use_count() == 2  # getting the edge created no new node
    del node
    return existed


def _warn_not_kept(module, name):
    warnings.warn(
        f"{type(module).__name__}.{name}: this Parameter is referenced elsewhere (a weak reference or another "
        "holder of its tensor), so converting it between mydev and another device replaces it with a new "
        "Parameter; a tie or an optimizer that holds the old one no longer sees the module's.",
        stacklevel=4,
    )


@functools.wraps(_torch_apply)
def _apply(self, fn, recurse=True):
    if recurse:
        for module in self.children():
            module._apply(fn)
    if torch.__future__.get_swap_module_params_on_conversion() or not self._parameters:
        return _torch_apply(self, fn, recurse=False)

    # fn is called once per tensor, in the order _apply calls it (each
    # parameter, then its gradient); the results are kept for _apply to reuse.
    results = {}

    def converted(t):
        entry = results.get(id(t))
        if entry is not None and entry[0] is t:
            return entry[1]
        with torch.no_grad():
            out = fn(t)
        results[id(t)] = (t, out)
        return out

    if isinstance(self, torch.jit.RecursiveScriptModule):
        # A scripted or loaded module's parameters are attributes of its C++
        # module (plain tensors once loaded), which PyTorch moves between CPU
        # and CUDA with `.data =`; that cannot cross to mydev's TensorImpl, and
        # its fallback asserts they are Parameters. The C++ module takes the
        # converted tensors instead (test_module_conversion.py).
        for name, param in list(self._parameters.items()):
            if param is None or not _kept_on_cuda_not_on_mydev(param, converted(param)):
                continue
            moved = converted(param).requires_grad_(param.requires_grad)  # fn ran under no_grad
            if param.grad is not None:
                moved.grad = converted(param.grad)
            self._parameters[name] = moved
        return _torch_apply(self, converted, recurse=False)

    swap, not_swappable = False, []
    for name, param in self._parameters.items():
        if param is None:
            continue
        crossing = _kept_on_cuda_not_on_mydev(param, converted(param))
        if param.grad is not None:
            converted(param.grad)
        if crossing:
            if _swappable(param):
                swap = True
            else:
                not_swappable.append(name)
    for name in not_swappable:
        _warn_not_kept(self, name)
    if not swap or not_swappable:
        return _torch_apply(self, converted, recurse=False)
    # The flag is process-wide: a module converted by another thread at this
    # very moment would take PyTorch's swap path too (which raises, rather than
    # replacing it, if one of that module's Parameters is referenced elsewhere).
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        return _torch_apply(self, converted, recurse=False)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
        results.clear()


def install():
    """Makes nn.Module conversions keep Parameters across mydev (idempotent)."""
    from . import _patches

    _patches.replace(
        torch.nn.Module, "_apply", _apply, target="torch.nn.Module._apply",
        why="torch keeps a Parameter across a conversion only when _has_compatible_shallow_copy_type holds, "
            "which excludes PrivateUse1: ties and optimizers broke on .to('mydev')",
        test="test_module_conversion.py::test_torch_still_excludes_privateuse1_from_shallow_copy")
