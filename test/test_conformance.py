"""OpInfo conformance: mydev agrees with the CPU on PyTorch's own operator samples.

PyTorch's device-generic framework (instantiate_device_type_tests + @ops over
op_db), instantiated for the mydev (PrivateUse1) device only. For each OpInfo
and dtype, every sample input, run on the CPU and on mydev:

- test_forward:        same result, every output on mydev; a sample the CPU
                       rejects must be rejected with the same exception type;
- test_out:            out= given wrong-sized mydev tensors: the same objects are
                       returned, resized to the result, holding the CPU result;
- test_inplace:        the in-place variant returns its mydev input, updated as on
                       the CPU;
- test_noncontiguous:  non-contiguous mydev inputs give what the CPU gives for the
                       same non-contiguous inputs (the layout can change the
                       CPU's own algorithm, as in scaled_dot_product_attention);
- test_backward:       gradients of a fixed random weighting of the outputs agree;
- test_no_copying_fallback: forward and backward never use the copying fallback.

Random ops cannot match the CPU value for value (mydev has its own generator).
An op is taken as random for a sample when its CPU run advanced the CPU
generator, or reseeded it and gave another result for another seed (see
_cpu_run), or when its OpInfo declares uninitialised output; then only shapes,
dtypes and devices are compared. A sample that looked deterministic on the CPU
but differs on mydev is also compared that way if the mydev run drew from
mydev's generator (a random op whose small sample gave the CPU the same result
under every seed tried). Every other result must match the CPU's.

What runs: my_device/conformance/selection.py (CI subset by default,
MYDEV_CONFORMANCE=full for everything); expected failures and skips:
my_device/conformance/manifest.py, carried by the OpInfos as their own
DecorateInfos (manifest.with_entries). The generated class is
TestConformancePRIVATEUSE1; test names end in _mydev_<dtype>.
"""
import torch
from torch.testing._internal.common_device_type import (
    OpDTypes,
    PrivateUse1TestBase,
    instantiate_device_type_tests,
    ops,
)
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase, noncontiguous_like, run_tests

import my_device
from my_device.conformance import frontends, manifest, selection

ALLOWLIST = selection.op_allowlist(op_db)
PrivateUse1TestBase.set_test_configs(op_allowlist=ALLOWLIST)
DTYPES = selection.dtypes()
SEED = 1234
# What mydev's side of test_forward and test_backward runs through (frontends.py);
# the CPU's side is always eager.
FRONTEND = selection.frontend()

# The op lists of the tests, already narrowed to the allowlist: @ops refuses a
# list the allowlist empties, so a test with nothing to run is removed instead.
SELECTED = manifest.with_entries([op for op in op_db if ALLOWLIST is None or op.full_name in ALLOWLIST])
OUT_OPS = [op for op in SELECTED if op.supports_out]
INPLACE_OPS = [op for op in SELECTED if op.inplace_variant is not None]
AUTOGRAD_OPS = [op for op in SELECTED if op.supports_autograd]


def _tensors(x):
    """All tensors in a (nested) tensor / list / tuple / dict, in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _sample_tensors(sample):
    return _tensors([sample.input, sample.args, sample.kwargs])


def _normalize(out):
    # return_types structseqs (torch.max(x, dim)) compare as plain tuples
    if isinstance(out, tuple) and type(out) is not tuple:
        return tuple(out)
    return out


def _on(device, sample, tensor_fn=None):
    """The sample with its tensors (and any device= argument) moved to `device`."""
    def move(t):
        if isinstance(t, torch.Tensor):
            t = t.detach().to(device)
            return tensor_fn(t) if tensor_fn else t
        return t  # transform() hands dtypes over too

    moved = sample.transform(move)
    if isinstance(moved.kwargs.get("device"), (str, torch.device)):  # factory functions
        moved.kwargs = {**moved.kwargs, "device": device}
    return moved


def _noncontiguous(t):
    """A non-contiguous copy of a strided tensor (sparse ones have no strides to vary)."""
    return noncontiguous_like(t) if t.layout == torch.strided else t


def _call(op, sample):
    return op(sample.input, *sample.args, **sample.kwargs)


def _call_through_frontend(op, sample):
    return frontends.call(FRONTEND, op, sample)


def _frontend_tolerance(expected):
    """assertEqual's tolerance: the test framework's own for eager mydev, which runs the CPU's kernels. A
    graph frontend's compiler may reorder floating-point work (a fused reduction sums in another order), so
    through one, float32 results agree within 1e-5 relative (about 80 ulp) instead of 1.3e-6."""
    if FRONTEND == "eager" or any(t.dtype != torch.float32 for t in _tensors(expected)):
        return {}
    return {"rtol": 1e-5, "atol": 1e-5}


def _same(a, b):
    """Bitwise-equal tensors (NaN equal to NaN)."""
    a, b = _tensors(a), _tensors(b)
    if len(a) != len(b):
        return False
    try:
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
    except AssertionError:
        return False
    return True


def _cpu_run(run, sample):
    """run(sample) under SEED, and whether its result is random.

    It is if the run drew from the CPU generator, or if it reseeded the generator
    (OpInfos of random ops call torch.manual_seed(42) inside freeze_rng_state,
    which hides their draws) and gives another result when that seed changes
    (tried with three other seeds)."""
    real_manual_seed = torch.manual_seed
    reseeded, shift = [], [0]

    def spy(seed):
        reseeded.append(seed)
        return real_manual_seed(seed + shift[0])

    torch.manual_seed = spy
    try:
        real_manual_seed(SEED)
        state = torch.get_rng_state()
        result = run(sample)
        random = not torch.equal(torch.get_rng_state(), state)
        # (a copy: an in-place op returns its input, which a rerun overwrites)
        kept = [t.clone() for t in _tensors(result)] if reseeded and not random else None
        for shift[0] in (1, 2, 3) if kept is not None else ():
            # several seeds: a small sample can draw the same result under two
            if not _same(run(sample), kept):
                random = True
                break
    finally:
        torch.manual_seed = real_manual_seed
    return result, random


def _mydev_drew():
    """Whether a mydev generator was used since the last torch.manual_seed (which zeroes their offsets)."""
    return any(gen.get_offset() != 0 for gen in torch.mydev.default_generators)


def _mydev_run(run, sample):
    """run(sample) under SEED, and whether it drew from a mydev generator.

    OpInfos of random ops run inside freeze_rng_state, which puts the
    accelerator's generator state back on exit, so the draws are looked for
    just before that restore too."""
    drew = [False]
    real_set_rng_state = torch.mydev.set_rng_state

    def watch(*args, **kwargs):
        drew[0] = drew[0] or _mydev_drew()
        return real_set_rng_state(*args, **kwargs)

    torch.mydev.set_rng_state = watch
    try:
        torch.manual_seed(SEED)
        result = run(sample)
        # A queued kernel's failure is reported at the next synchronisation:
        # here, so that it counts against this sample, not the next test's.
        torch.mydev.synchronize()
    finally:
        torch.mydev.set_rng_state = real_set_rng_state
    return result, drew[0] or _mydev_drew()


def _expects_device(sample):
    # A factory sample with no tensor and no device= argument (arange(2)) has
    # no way to ask for mydev: its CPU result is right.
    return bool(_sample_tensors(sample)) or "device" in sample.kwargs


class TestConformance(TestCase):
    exact_dtype = True

    def _to_cpu_checked(self, out, device):
        """Moves (nested) outputs to the CPU, asserting every tensor was on `device` (unless None)."""
        if isinstance(out, torch.Tensor):
            if device is not None:
                self.assertEqual(out.device, torch.device(device), msg=f"output on {out.device}, expected {device}")
            return out.detach().cpu()
        if isinstance(out, list):
            return [self._to_cpu_checked(o, device) for o in out]
        if isinstance(out, tuple):  # structseqs become plain tuples
            return tuple(self._to_cpu_checked(o, device) for o in out)
        return out

    def _assert_same_meta(self, actual, expected, msg):
        a, e = _tensors(actual), _tensors(expected)
        self.assertEqual(len(a), len(e), msg=msg)
        for x, y in zip(a, e):
            self.assertEqual((x.shape, x.dtype), (y.shape, y.dtype), msg=msg)

    def _assert_agree(self, actual, expected, random, mydev_drew, what):
        """Values must agree, unless the op is random for this sample: then shapes and dtypes."""
        if not random:
            try:
                self.assertEqual(_normalize(actual), _normalize(expected), msg=f"{what} differs from CPU",
                                 **_frontend_tolerance(expected))
                return
            except AssertionError:
                if not mydev_drew:
                    raise
        self._assert_same_meta(actual, expected, msg=f"{what} (random op)")

    def _agree(self, op, run, cpu_sample, dev_sample, device, what, dev_run=None):
        """Runs `run(sample)` on both samples (`dev_run` on mydev's, if given) and asserts the results
        agree (see the module doc).

        Returns False when the CPU rejected the sample (and mydev did too: with the same exception
        type, or any exception through a frontend other than eager, whose compilers wrap errors)."""
        dev_run = dev_run or run
        try:
            expected, drew_random = _cpu_run(run, cpu_sample)
        except Exception as cpu_error:
            want = type(cpu_error) if dev_run is run or FRONTEND == "eager" else Exception
            with self.assertRaises(want, msg=f"{what}: the CPU raised {cpu_error!r}, mydev did not"):
                dev_run(dev_sample)
            return False
        actual, mydev_drew = _mydev_run(dev_run, dev_sample)
        actual = self._to_cpu_checked(actual, device if _expects_device(dev_sample) else None)
        self._assert_agree(actual, expected, drew_random or op.has_nondeterministic_output, mydev_drew, what)
        return True

    def _samples(self, op, dtype, requires_grad=False):
        return op.sample_inputs("cpu", dtype, requires_grad=requires_grad)

    # ------------------------------------------------------------------ forward
    @ops(SELECTED, allowed_dtypes=DTYPES)
    def test_forward(self, device, dtype, op):
        ran = 0
        for i, sample in enumerate(self._samples(op, dtype)):
            ran += self._agree(op, lambda s: _call(op, s), sample, _on(device, sample), device,
                               f"{op.full_name} sample {i} ({sample.name!r})",
                               dev_run=lambda s: _call_through_frontend(op, s))
        if ran == 0:
            self.skipTest("the CPU rejects every sample")

    # ---------------------------------------------------------------------- out=
    @ops(OUT_OPS, allowed_dtypes=DTYPES)
    def test_out(self, device, dtype, op):
        def run(s, out_device):
            # out= tensors of the right dtypes but no elements: the op must resize them
            expected = _call(op, s)
            if isinstance(expected, torch.Tensor):
                out = torch.empty((0,), dtype=expected.dtype, device=out_device)
                self.assertIs(op(s.input, *s.args, out=out, **s.kwargs), out, msg="out= did not return out")
                return out
            out = tuple(torch.empty((0,), dtype=e.dtype, device=out_device) for e in expected)
            result = op(s.input, *s.args, out=out, **s.kwargs)
            self.assertEqual(len(result), len(out))
            for r, o in zip(result, out):
                self.assertIs(r, o, msg="out= did not return the out tensors")
            return out

        ran = 0
        for i, sample in enumerate(self._samples(op, dtype)):
            what = f"{op.full_name} sample {i} ({sample.name!r}) out="
            try:
                expected, drew_random = _cpu_run(lambda s: run(s, "cpu"), sample)
            except Exception:
                continue  # no out= form for this sample (test_forward compares the errors)
            actual, mydev_drew = _mydev_run(lambda s: run(s, device), _on(device, sample))
            actual = self._to_cpu_checked(actual, device)
            self._assert_agree(actual, expected, drew_random or op.has_nondeterministic_output, mydev_drew, what)
            ran += 1
        if ran == 0:
            self.skipTest("the CPU accepts out= for no sample")

    # ------------------------------------------------------------------ inplace
    @ops(INPLACE_OPS, allowed_dtypes=DTYPES)
    def test_inplace(self, device, dtype, op):
        inplace = op.inplace_variant

        def run(s):
            # a fresh copy of self each time: the check may run the CPU side twice
            s = s.transform(lambda t: t.clone() if isinstance(t, torch.Tensor) else t)
            before = s.input
            result = inplace(s.input, *s.args, **s.kwargs)
            if isinstance(before, torch.Tensor):
                self.assertIs(result, before, msg=f"{op.full_name}: in-place variant did not return self")
            return s.input

        ran = 0
        for i, sample in enumerate(self._samples(op, dtype)):
            ran += self._agree(op, run, sample, _on(device, sample), device,
                               f"{op.full_name} sample {i} ({sample.name!r}) in-place")
        if ran == 0:
            self.skipTest("the CPU rejects every sample in place")

    # ------------------------------------------------------------ noncontiguous
    @ops(SELECTED, allowed_dtypes=DTYPES)
    def test_noncontiguous(self, device, dtype, op):
        made_noncontiguous = 0
        for i, sample in enumerate(self._samples(op, dtype)):
            dev = _on(device, sample, _noncontiguous)
            for cpu_t, dev_t in zip(_sample_tensors(sample), _sample_tensors(dev)):
                self.assertEqual(dev_t.cpu(), cpu_t)  # the strided copy holds the same values
                made_noncontiguous += dev_t.layout == torch.strided and dev_t.numel() > 1 and not dev_t.is_contiguous()
            self._agree(op, lambda s: _call(op, s), _on("cpu", sample, _noncontiguous), dev, device,
                        f"{op.full_name} sample {i} ({sample.name!r}) non-contiguous")
        if made_noncontiguous == 0:
            self.skipTest("no sample has a multi-element tensor input")

    # ----------------------------------------------------------------- backward
    def _grads(self, op, sample, device, seed):
        """Gradients w.r.t. the sample's requires_grad tensors of sum(w * out), w fixed by `seed`."""
        leaves = []

        def make_leaf(t):
            if t.requires_grad:
                t = t.clone().requires_grad_()
                leaves.append(t)
            return t

        def move(t):
            if isinstance(t, torch.Tensor):
                return make_leaf(t.detach().to(device).requires_grad_(t.requires_grad))
            return t

        s = sample.transform(move)
        torch.manual_seed(SEED)
        out = sample.output_process_fn_grad(_call(op, s) if device == "cpu" else _call_through_frontend(op, s))
        outs = [o for o in _tensors(out) if o.requires_grad and (o.dtype.is_floating_point or o.dtype.is_complex)]
        if not outs or not leaves:
            return None
        gen = torch.Generator().manual_seed(seed)
        weights = [torch.randn(o.shape, dtype=o.dtype, generator=gen).to(device) for o in outs]
        return torch.autograd.grad(outs, leaves, grad_outputs=weights, allow_unused=True)

    @ops(AUTOGRAD_OPS, dtypes=OpDTypes.supported_backward, allowed_dtypes=DTYPES)
    def test_backward(self, device, dtype, op):
        checked = 0
        for i, sample in enumerate(self._samples(op, dtype, requires_grad=True)):
            what = f"{op.full_name} sample {i} ({sample.name!r}) grad"
            try:
                expected, random = _cpu_run(lambda s: self._grads(op, s, "cpu", seed=SEED + i), sample)
            except Exception as cpu_error:
                want = type(cpu_error) if FRONTEND == "eager" else Exception
                with self.assertRaises(want, msg=f"{what}: the CPU raised {cpu_error!r}, mydev did not"):
                    self._grads(op, sample, device, seed=SEED + i)
                continue
            if expected is None:
                continue  # no differentiable output or input in this sample
            random = random or op.has_nondeterministic_output
            actual, mydev_drew = _mydev_run(lambda s: self._grads(op, s, device, seed=SEED + i), sample)
            self.assertIsNotNone(actual, msg=f"{what}: no differentiable output on {device}")
            self.assertEqual(len(actual), len(expected))
            for k, (a, e) in enumerate(zip(actual, expected)):
                self.assertEqual(a is None, e is None, msg=f"{what} {k}: defined on one device only")
            actual = [None if a is None else self._to_cpu_checked(a, device) for a in actual]
            self._assert_agree(actual, list(expected), random, mydev_drew, what)
            checked += 1
        if checked == 0:
            self.skipTest("no sample with a differentiable output")

    # ----------------------------------------------------------------- fallback
    @ops(SELECTED, allowed_dtypes=DTYPES)
    def test_no_copying_fallback(self, device, dtype, op):
        requires_grad = op.supports_autograd and dtype in op.supported_backward_dtypes(device)
        used = {}
        for sample in self._samples(op, dtype, requires_grad=requires_grad):
            with my_device.track_fallbacks() as fb:
                try:
                    if requires_grad:
                        self._grads(op, sample, device, seed=SEED)
                    else:
                        _call(op, _on(device, sample))
                except Exception:
                    pass  # a sample the op rejects: test_forward compares the errors
            for name, calls in fb.counts().items():
                used[name] = used.get(name, 0) + calls
        self.assertEqual(used, {}, msg=f"{op.full_name} used the copying CPU fallback")


for _test, _ops in (("test_out", OUT_OPS), ("test_inplace", INPLACE_OPS), ("test_backward", AUTOGRAD_OPS)):
    if not _ops:
        delattr(TestConformance, _test)

instantiate_device_type_tests(TestConformance, globals(), only_for=("mydev",))

if __name__ == "__main__":
    run_tests()
