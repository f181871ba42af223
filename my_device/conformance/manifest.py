"""Expected failures and skips of the mydev conformance suite, and the CI subset.

This is the only place a conformance test may be skipped or marked as an
expected failure, and every entry says why. test/test_conformance.py runs copies
of the OpInfos that carry the entries as DecorateInfos of their own
(with_entries), so they act like an OpInfo's own skips, restricted to mydev.

An entry:
    Entry(op, kind, reason, tests=(), dtypes=())
op is an OpInfo full_name ("div.floor_rounding"); kind is XFAIL (the test must
fail: it starts failing the suite when it passes, so fixed ops get noticed) or
SKIP (it is not run: for crashes and hangs only); tests are test names without
the device/dtype suffix ("test_forward"), () for all; dtypes () for all.
"""
import copy
import unittest
from typing import NamedTuple

import torch

XFAIL = "xfail"
SKIP = "skip"

TEST_CLASS = "TestConformance"


class Entry(NamedTuple):
    op: str
    kind: str
    reason: str
    tests: tuple = ()
    dtypes: tuple = ()


F32 = (torch.float32,)

ENTRIES = [
    # --- the test's premise does not hold for the op (the CPU would fail the same way)
    Entry("as_strided.partial_views", SKIP, "reads storage outside the sample's view; .to(device) copies only "
          "the view's elements, so the bytes around it are whatever the allocator left there (as on CUDA): "
          "it fails or passes by chance, so it cannot be an expected failure", ("test_forward",)),
    Entry("tensor_split", XFAIL, "a sample passes indices as a tensor that the op requires on the CPU; the "
          "test moves every tensor to mydev", ("test_forward", "test_noncontiguous", "test_backward")),
    Entry("to", XFAIL, "samples convert to an explicit device or to another tensor's device, which the test "
          "cannot retarget to mydev", ("test_forward", "test_noncontiguous", "test_backward")),
    # --- PyTorch itself decides differently for a device type that is not the CPU
    Entry("nn.functional.linear_cross_entropy.chunked", XFAIL, "the chunked path picks its accumulation dtype "
          "by device type (LinearCrossEntropyOptions._resolve_auto_acc_dtype: float32 on CPU and CUDA, the "
          "input's dtype on any other device), so mydev accumulates float16/bfloat16 in float16/bfloat16",
          ("test_noncontiguous", "test_backward"), (torch.float16, torch.bfloat16)),
    Entry("nn.functional.linear_cross_entropy.chunked", XFAIL, "as above; in bfloat16 the forward samples happen "
          "to round to the CPU's values", ("test_forward",), (torch.float16,)),
    Entry("nn.functional.linear_cross_entropy.chunked_none", XFAIL, "as for linear_cross_entropy.chunked: "
          "accumulation in the input dtype off the CPU and CUDA",
          ("test_forward", "test_noncontiguous", "test_backward"), (torch.float16, torch.bfloat16)),
]

# The representative subset CI runs (OpInfo names; every variant of each is
# included): the families of a training step (pointwise, reductions, matmul,
# activations, losses, normalisation, convolution, pooling, indexing, joining,
# random, optimizers' building blocks), a few of each, and every op the former
# test_opinfo.py covered. About 2 minutes on 2 idle cores.
CI_OPS = (
    "add", "sub", "mul", "div", "true_divide", "remainder", "pow", "clamp", "lerp", "addcmul", "where",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "isnan", "bitwise_and",
    "abs", "neg", "exp", "log", "sin", "cos", "tanh", "sqrt", "rsqrt", "sigmoid", "erf", "floor", "round",
    "sum", "mean", "prod", "amax", "amin", "max", "argmax", "var", "std", "norm", "logsumexp", "cumsum", "sort", "topk",
    "any",
    "mm", "addmm", "bmm", "matmul", "einsum", "linalg.vector_norm",
    "softmax", "log_softmax", "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
    "nn.functional.leaky_relu", "nn.functional.hardtanh",
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
    "nn.functional.binary_cross_entropy",
    "nn.functional.layer_norm", "nn.functional.batch_norm", "nn.functional.group_norm",
    "nn.functional.conv2d", "nn.functional.max_pool1d", "nn.functional.avg_pool2d",
    "nn.functional.adaptive_avg_pool2d", "nn.functional.interpolate", "nn.functional.pad",
    "nn.functional.embedding", "nn.functional.linear", "nn.functional.dropout",
    "index_put", "index_select", "index_add", "__getitem__", "gather", "scatter", "scatter_add", "masked_fill",
    "masked_select", "nonzero", "take_along_dim",
    "cat", "stack", "reshape", "transpose", "permute", "flip", "roll", "tril", "repeat",
    "zeros_like", "arange", "full", "linspace",
    "bernoulli", "normal", "uniform", "randn_like",
    "logaddexp", "special.entr", "linalg.inv", "fft.rfft", "histc", "cdist",
)
CI_DTYPES = (torch.float32, torch.int64)

# --- the ModuleInfo suite (test/test_modules.py) ------------------------------
MODULE_TEST_CLASS = "TestModuleConformance"
MODULE_DTYPES = (torch.float32, torch.float64)
# Expected failures and skips of the ModuleInfo suite: Entry(module name, ...),
# tests named without the mode/device/dtype suffix ("test_forward").
MODULE_ENTRIES = [
]
# The CI subset of the ModuleInfo suite, in float32 and float64 (well under a
# minute on 2 cores): layers of a training step, the fused-cell recurrent ones,
# two losses (the full sweep covers attention, transformers and the rest).
CI_MODULES = (
    "nn.Linear", "nn.Conv2d", "nn.BatchNorm2d", "nn.LayerNorm", "nn.Embedding", "nn.GELU", "nn.MaxPool2d",
    "nn.MSELoss", "nn.MultiLabelMarginLoss", "nn.LSTM", "nn.GRU", "nn.LSTMCell", "nn.GRUCell",
)


def _decorator(entry):
    if entry.kind == XFAIL:
        return unittest.expectedFailure
    if entry.kind == SKIP:
        return unittest.skip(f"conformance manifest: {entry.reason}")
    raise ValueError(f"manifest entry for {entry.op}: kind must be XFAIL or SKIP, not {entry.kind!r}")


def _on_backend(param_kwargs):
    """Whether an instantiated test runs on the PrivateUse1 device (mydev), from the device it is given."""
    device = param_kwargs.get("device")
    return device is not None and torch.device(device).type == torch._C._get_privateuse1_backend_name()


def _checked(entries, what):
    for e in entries:
        if not e.reason.strip():
            raise ValueError(f"{what} entry for {e.op} has no reason")
        _decorator(e)
    return entries


def _with_decorations(infos, name_of, entries, test_class):
    """Copies of the infos that carry their entries as DecorateInfos, restricted to mydev.

    Restricted by the device the test is handed, not by DecorateInfo(device_type=...)
    (nor set_test_configs(op_overrides=...), which sets that): the framework
    matches device_type against the class's, which reads "privateuse1" until
    PrivateUse1TestBase first resolves its device ("mydev") while instantiating
    the first test, after that test's first (op, dtype) took its decorators. Which
    test comes first follows a set of names, so PYTHONHASHSEED decided which
    entry was lost."""
    from torch.testing._internal.opinfo.core import DecorateInfo

    out = []
    for info in infos:
        extra = [DecorateInfo(_decorator(e), test_class, test, dtypes=e.dtypes or None, active_if=_on_backend)
                 for e in entries if e.op == name_of(info) for test in e.tests or (None,)]
        if extra:
            info = copy.copy(info)
            info.decorators = (*info.decorators, *extra)
        out.append(info)
    return out


def with_entries(op_infos):
    """Copies of the OpInfos with ENTRIES applied (see _with_decorations)."""
    return _with_decorations(op_infos, lambda op: op.full_name, _checked(ENTRIES, "manifest"), TEST_CLASS)


def lookup(op, test, dtype):
    """The entry that applies to one test (dtype as a torch.dtype), or None."""
    for e in ENTRIES:
        if e.op == op and (not e.tests or test in e.tests) and (not e.dtypes or dtype in e.dtypes):
            return e
    return None


def with_module_entries(module_infos):
    """Copies of the ModuleInfos with MODULE_ENTRIES applied (see _with_decorations)."""
    return _with_decorations(module_infos, lambda m: m.name, _checked(MODULE_ENTRIES, "module manifest"),
                             MODULE_TEST_CLASS)


def module_lookup(module, test, dtype):
    """The MODULE_ENTRIES entry that applies to one test of the ModuleInfo suite, or None."""
    test = test.removesuffix("_train_mode").removesuffix("_eval_mode")
    for e in MODULE_ENTRIES:
        if e.op == module and (not e.tests or test in e.tests) and (not e.dtypes or dtype in e.dtypes):
            return e
    return None
