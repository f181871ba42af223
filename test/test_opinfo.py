"""OpInfo-driven tests: selected aten ops on mydev agree with the CPU.

Uses PyTorch's device-generic test framework (instantiate_device_type_tests +
@ops over op_db), instantiated only for the mydev (PrivateUse1) device. For
every selected OpInfo (all its variants) and float32:

- test_forward_matches_cpu:  every sample, moved to mydev, gives the CPU result
  and every output tensor lives on mydev;
- test_backward_matches_cpu: gradients of a fixed random weighting of the
  outputs (a vector-Jacobian product) agree with the CPU's;
- test_no_copying_fallback:  forward (and backward) run without the copying
  CPU fallback, i.e. my_device.fallback_counts() stays empty;
- test_out_variant:          out= a wrong-sized mydev tensor is resized and
  filled in place and the same object is returned;
- test_noncontiguous_inputs: non-contiguous mydev inputs give the CPU result.

Every expected value is computed by running the same op on the CPU.

The generated class is TestOpInfoMydevPRIVATEUSE1 (the framework names it after
PrivateUse1TestBase.device_type, which is still "privateuse1" at import time);
the test names end in _mydev_float32 and the tests run on "mydev:0".
"""
import itertools

import torch
from torch.testing._internal.common_device_type import (
    instantiate_device_type_tests,
    ops,
)
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import (
    TestCase,
    noncontiguous_like,
    run_tests,
)

import my_device

# OpInfo names; every variant_test_name of each is included.
OP_NAMES = (
    "add", "sub", "mul", "div", "true_divide",
    "eq", "ne", "lt", "le", "gt", "ge",
    "abs", "neg", "exp", "log", "sin", "cos", "tanh", "sqrt", "rsqrt", "sigmoid",
    "sum", "mean", "amax", "amin", "max", "argmax",
    "softmax", "log_softmax",
    "mm", "addmm", "bmm", "matmul",
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
    "where", "cat", "stack",
    "index_put", "index_select", "__getitem__", "gather", "scatter",
    "nn.functional.embedding", "nn.functional.linear", "nn.functional.cross_entropy",
    "nn.functional.conv2d", "nn.functional.max_pool2d", "nn.functional.layer_norm",
    "clamp", "pow", "masked_fill", "cumsum",
)

# OpInfo variants (full_name) of the ops above that are deliberately not run.
EXCLUDED_VARIANTS = {
    # A DSL OpInfo for a CUDA Triton override of torch.bmm: decorated onlyCUDA and
    # skipIfNoTritonDSL, so on mydev it could only ever be skipped. Plain torch.bmm
    # is covered by the "bmm" OpInfo.
    "bmm.triton_optimized": "CUDA/Triton-only OpInfo (onlyCUDA, skipIfNoTritonDSL)",
}

_available = {op.name for op in op_db}
MISSING_OPS = tuple(n for n in OP_NAMES if n not in _available)  # () with torch 2.13
SELECTED_OPS = [op for op in op_db if op.name in OP_NAMES and op.full_name not in EXCLUDED_VARIANTS]
AUTOGRAD_OPS = [op for op in SELECTED_OPS if op.supports_autograd]
OUT_OPS = [op for op in SELECTED_OPS if op.supports_out]

DTYPES = (torch.float32,)
# Samples per op and test; None runs them all (about 35 s for the whole file on
# 2 cores). Lower these if the file gets too slow.
MAX_SAMPLES = None
MAX_OUT_SAMPLES = None


def _take(it, n):
    # Lazy, so the framework's "Caused by sample input at index i" names the
    # sample being run when a test fails.
    return itertools.islice(it, n)


def _to_device(device):
    def f(t):
        if isinstance(t, torch.Tensor):
            return t.to(device)
        return t  # dtypes are passed through transform() too
    return f


def _normalize(out):
    # return_types structseqs (e.g. torch.max(x, dim)) compare as plain tuples
    if isinstance(out, tuple) and type(out) is not tuple:
        return tuple(out)
    return out


def _tree_tensors(x):
    """All tensors in a (nested) tensor / list / tuple / dict, in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tree_tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tree_tensors(v)]
    return []


def _sample_tensors(sample):
    return _tree_tensors([sample.input, sample.args, sample.kwargs])


class TestOpInfoMydev(TestCase):
    exact_dtype = True

    def _to_cpu_checked(self, out, device):
        """Moves (nested) op outputs to the CPU, asserting every tensor was on `device`."""
        if isinstance(out, torch.Tensor):
            self.assertEqual(out.device, torch.device(device),
                             msg=f"output on {out.device}, expected {device}")
            return out.detach().cpu()
        if isinstance(out, list):
            return [self._to_cpu_checked(o, device) for o in out]
        if isinstance(out, tuple):  # also return_types structseqs: compared as plain tuples
            return tuple(self._to_cpu_checked(o, device) for o in out)
        return out

    def _check_forward(self, op, cpu_sample, dev_sample, device):
        expected = op(cpu_sample.input, *cpu_sample.args, **cpu_sample.kwargs)
        actual = op(dev_sample.input, *dev_sample.args, **dev_sample.kwargs)
        actual_cpu = self._to_cpu_checked(actual, device)
        self.assertEqual(_normalize(actual_cpu), _normalize(expected),
                         msg=f"{op.full_name} sample {cpu_sample.name!r} differs from CPU")

    # ------------------------------------------------------------------ forward
    @ops(SELECTED_OPS, allowed_dtypes=DTYPES)
    def test_forward_matches_cpu(self, device, dtype, op):
        n = 0
        for sample in _take(op.sample_inputs("cpu", dtype), MAX_SAMPLES):
            n += 1
            self._check_forward(op, sample, sample.transform(_to_device(device)), device)
        self.assertGreater(n, 0, f"{op.full_name} has no float32 samples")

    # ----------------------------------------------------------------- backward
    def _grads(self, op, sample, device, seed):
        """VJP of op's floating outputs with seeded random weights, w.r.t. sample's
        requires_grad tensors, rebuilt as fresh leaves on `device`.
        Returns (grads, number of differentiable outputs)."""
        leaves = []

        def make_leaf(t):
            if isinstance(t, torch.Tensor):
                leaf = t.detach().to(device)
                if device == "cpu":
                    leaf = leaf.clone()
                if t.requires_grad:
                    leaf.requires_grad_()
                    leaves.append(leaf)
                return leaf
            return t

        s = sample.transform(make_leaf)
        out = op(s.input, *s.args, **s.kwargs)
        out = sample.output_process_fn_grad(out)
        outs = [o for o in _tree_tensors(out)
                if o.requires_grad and (o.dtype.is_floating_point or o.dtype.is_complex)]
        if not outs or not leaves:
            return None, 0
        gen = torch.Generator().manual_seed(seed)
        weights = [torch.randn(o.shape, dtype=o.dtype, generator=gen).to(device) for o in outs]
        grads = torch.autograd.grad(outs, leaves, grad_outputs=weights, allow_unused=True)
        return grads, len(outs)

    @ops(AUTOGRAD_OPS, allowed_dtypes=DTYPES)
    def test_backward_matches_cpu(self, device, dtype, op):
        checked = 0
        for i, sample in enumerate(_take(op.sample_inputs("cpu", dtype, requires_grad=True), MAX_SAMPLES)):
            expected, n_out = self._grads(op, sample, "cpu", seed=1234 + i)
            if expected is None:
                continue  # no differentiable output / input in this sample
            actual, n_out_dev = self._grads(op, sample, device, seed=1234 + i)
            self.assertEqual(n_out_dev, n_out, msg="differentiable outputs differ from CPU")
            self.assertIsNotNone(actual, msg=f"{op.full_name}: no differentiable output on {device}")
            self.assertEqual(len(actual), len(expected))
            for k, (a, e) in enumerate(zip(actual, expected)):
                if e is None:
                    self.assertIsNone(a, msg=f"grad {k}: CPU has none, {device} has one")
                    continue
                self.assertIsNotNone(a, msg=f"grad {k}: {device} has none, CPU has one")
                self.assertEqual(self._to_cpu_checked(a, device), e,
                                 msg=f"{op.full_name} sample {sample.name!r} grad {k} differs from CPU")
            checked += 1
        self.assertGreater(checked, 0, f"{op.full_name}: no sample with a differentiable output")

    # ----------------------------------------------------------------- fallback
    @ops(SELECTED_OPS, allowed_dtypes=DTYPES)
    def test_no_copying_fallback(self, device, dtype, op):
        requires_grad = op.supports_autograd
        n = 0
        for sample in _take(op.sample_inputs("cpu", dtype, requires_grad=requires_grad), MAX_SAMPLES):
            n += 1
            leaves = []

            def make_leaf(t):
                if isinstance(t, torch.Tensor):
                    leaf = t.detach().to(device)
                    if t.requires_grad:
                        leaf.requires_grad_()
                        leaves.append(leaf)
                    return leaf
                return t

            s = sample.transform(make_leaf)
            my_device.reset_fallback_counts()
            out = op(s.input, *s.args, **s.kwargs)
            used = {"forward": my_device.fallback_counts()}
            if requires_grad:
                out = sample.output_process_fn_grad(out)
                outs = [o for o in _tree_tensors(out)
                        if o.requires_grad and (o.dtype.is_floating_point or o.dtype.is_complex)]
                if outs and leaves:
                    grad_outputs = [torch.ones_like(o) for o in outs]
                    my_device.reset_fallback_counts()
                    torch.autograd.grad(outs, leaves, grad_outputs=grad_outputs, allow_unused=True)
                    used["backward"] = my_device.fallback_counts()
            my_device.reset_fallback_counts()
            used = {phase: counts for phase, counts in used.items() if counts}
            if used:  # fail on this sample, so the framework's repro names it
                self.fail(f"{op.full_name} used the copying CPU fallback: {used}")
        self.assertGreater(n, 0, f"{op.full_name} has no float32 samples")

    # ---------------------------------------------------------------------- out=
    @ops(OUT_OPS, allowed_dtypes=DTYPES)
    def test_out_variant(self, device, dtype, op):
        n = 0
        for sample in _take(op.sample_inputs("cpu", dtype), MAX_OUT_SAMPLES):
            n += 1
            expected = op(sample.input, *sample.args, **sample.kwargs)
            dev_sample = sample.transform(_to_device(device))
            if isinstance(expected, torch.Tensor):
                out = torch.empty((0,), dtype=expected.dtype, device=device)
                result = op(dev_sample.input, *dev_sample.args, out=out, **dev_sample.kwargs)
                self.assertIs(result, out, msg=f"{op.full_name}: out= did not return the out tensor")
                self.assertEqual(out.device, torch.device(device))
                self.assertEqual(out.shape, expected.shape, msg="out was not resized to the result's shape")
                self.assertEqual(out.cpu(), expected)
            else:
                expected = tuple(expected)
                out = tuple(torch.empty((0,), dtype=e.dtype, device=device) for e in expected)
                result = op(dev_sample.input, *dev_sample.args, out=out, **dev_sample.kwargs)
                self.assertEqual(len(result), len(out))
                for r, o, e in zip(result, out, expected):
                    self.assertIs(r, o, msg=f"{op.full_name}: out= did not return the out tensors")
                    self.assertEqual(o.device, torch.device(device))
                    self.assertEqual(o.shape, e.shape, msg="out was not resized to the result's shape")
                    self.assertEqual(o.cpu(), e)
        self.assertGreater(n, 0, f"{op.full_name} has no float32 samples")

    # ------------------------------------------------------------ noncontiguous
    @ops(SELECTED_OPS, allowed_dtypes=DTYPES)
    def test_noncontiguous_inputs(self, device, dtype, op):
        made_noncontiguous = 0
        for sample in _take(op.sample_inputs("cpu", dtype), MAX_SAMPLES):
            def to_noncontig(t):
                if isinstance(t, torch.Tensor):
                    return noncontiguous_like(t.to(device))
                return t

            dev_sample = sample.transform(to_noncontig)
            for cpu_t, dev_t in zip(_sample_tensors(sample), _sample_tensors(dev_sample)):
                self.assertEqual(dev_t.device, torch.device(device))
                # the copy must hold the same values, and really be strided
                self.assertEqual(dev_t.cpu(), cpu_t)
                if dev_t.numel() > 1:
                    self.assertFalse(dev_t.is_contiguous(), msg="noncontiguous_like gave a contiguous tensor")
                    made_noncontiguous += 1
            self._check_forward(op, sample, dev_sample, device)
        self.assertGreater(made_noncontiguous, 0, f"{op.full_name}: no sample had a multi-element tensor")


instantiate_device_type_tests(TestOpInfoMydev, globals(), only_for=("mydev",))

if __name__ == "__main__":
    run_tests()
