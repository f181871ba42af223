"""ModuleInfo conformance: every nn module of PyTorch's module_db behaves on mydev as on the CPU.

PyTorch's device-generic framework (instantiate_device_type_tests + @modules over
module_db), instantiated for mydev only. For each ModuleInfo, dtype and train/eval
mode, every ModuleInput is built on the CPU from one seed; the module is constructed
on the CPU and a copy is moved to mydev with `.to("mydev")`, so both start from the
same parameters. Then, against the CPU module on the same inputs:

- test_forward:        same outputs, every output on mydev; a sample the CPU rejects
                       must be rejected with the same exception type;
- test_backward:       gradients of a fixed random weighting of the outputs, w.r.t.
                       the inputs and every parameter, agree;
- test_noncontiguous:  non-contiguous mydev inputs give the CPU's result for the same
                       non-contiguous inputs;
- test_to_round_trip:  `.to("mydev")`, `.to(dtype)`, `.to("cpu")` keep the Parameter
                       objects, their values and the module's results;
- test_state_dict:     the mydev module's state_dict (live and through torch.save)
                       loads into a CPU module, a CPU state_dict into a mydev module,
                       and both then agree.

A module that draws random numbers for a sample (the CPU generator advanced:
FractionalMaxPool, dropout inside Transformer layers in training mode) is compared
by shapes and dtypes only. What runs: my_device/conformance/selection.py
(MYDEV_CONFORMANCE=full for every module and dtype, MYDEV_CONFORMANCE_MODULES to
narrow; a CI subset by default); skips and expected failures:
my_device/conformance/manifest.py (MODULE_ENTRIES), each with its reason.
"""
import copy
import io

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_modules import module_db, modules
from torch.testing._internal.common_utils import TestCase, noncontiguous_like, run_tests

import my_device  # noqa: F401
from my_device.conformance import frontends, manifest, selection

SEED = 1234
SELECTED = manifest.with_module_entries(selection.selected_modules(module_db))
DTYPES = selection.module_dtypes()
# What the mydev module's forward runs through (frontends.py); the CPU's is eager.
FRONTEND = selection.frontend(frontends.MODULE_FRONTENDS)


def _run_on_device(module, args, kwargs):
    return frontends.call_module(FRONTEND, module, args, kwargs)


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _map(x, fn):
    """x with every tensor t replaced by fn(t) (in lists, tuples, dicts, PackedSequences)."""
    if isinstance(x, torch.nn.utils.rnn.PackedSequence):
        return x.to(fn(x.data).device)
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_map(v, fn) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    return x


def _move(device, requires_grad=True, noncontiguous=False):
    def fn(t):
        out = t.detach().to(device)
        if noncontiguous and out.layout == torch.strided and out.numel() > 1:
            out = noncontiguous_like(out)  # on the device: .to() would make it contiguous again
        if requires_grad and t.requires_grad:
            out.requires_grad_()
        return out
    return fn


class _Case:
    """One ModuleInput: the CPU module and its mydev copy, and the inputs for both."""

    def __init__(self, module_info, module_input, dtype, training, device):
        ctor = module_input.constructor_input
        torch.manual_seed(SEED)
        self.cpu_module = module_info.module_cls(*ctor.args, **ctor.kwargs).to(dtype)
        self.cpu_module.train(training)
        self.module_input = module_input
        self.device = device
        self.dev_module = None
        if module_input.forward_input is not None:
            self.args, self.kwargs = module_input.forward_input.args, module_input.forward_input.kwargs
        self.is_lazy = module_info.is_lazy
        if not self.is_lazy:  # a lazy module has no parameters to copy until its first call
            self.dev_module = copy.deepcopy(self.cpu_module).to(device)

    def inputs(self, device, noncontiguous=False, requires_grad=True):
        fn = _move(device, requires_grad, noncontiguous)
        return _map(self.args, fn), _map(self.kwargs, fn)

    def modules(self):
        if self.dev_module is None:
            self.dev_module = copy.deepcopy(self.cpu_module).to(self.device)
        return self.cpu_module, self.dev_module


class TestModuleConformance(TestCase):
    exact_dtype = True

    def _cases(self, module_info, dtype, training, device, requires_grad=False):
        torch.manual_seed(SEED)
        inputs = module_info.module_inputs_func(module_info, device="cpu", dtype=dtype,
                                                requires_grad=requires_grad, training=training)
        return [_Case(module_info, mi, dtype, training, device) for mi in inputs if mi.forward_input is not None]

    def _on_device(self, out, device):
        for t in _tensors(out):
            self.assertEqual(t.device.type, torch.device(device).type, msg=f"output on {t.device}")
        return _map(out, lambda t: t.detach().cpu())

    def _forward_both(self, case, what, noncontiguous=False):
        """(cpu result, mydev result on the CPU, random) or None when the CPU rejects the input."""
        cpu_module = case.cpu_module
        args, kwargs = case.inputs("cpu", noncontiguous, requires_grad=False)
        torch.manual_seed(SEED)
        before = torch.get_rng_state()
        try:
            expected = cpu_module(*args, **kwargs)
        except Exception as cpu_error:
            _, dev_module = case.modules()
            dargs, dkwargs = case.inputs(case.device, noncontiguous, requires_grad=False)
            want = type(cpu_error) if FRONTEND == "eager" else Exception  # (compilers wrap errors)
            with self.assertRaises(want, msg=f"{what}: the CPU raised {cpu_error!r}, mydev did not"):
                _run_on_device(dev_module, dargs, dkwargs)
            return None
        random = not torch.equal(torch.get_rng_state(), before)
        _, dev_module = case.modules()
        dargs, dkwargs = case.inputs(case.device, noncontiguous, requires_grad=False)
        torch.manual_seed(SEED)
        actual = self._on_device(_run_on_device(dev_module, dargs, dkwargs), case.device)
        torch.mydev.synchronize()
        return _map(expected, lambda t: t.detach()), actual, random

    def _agree(self, actual, expected, random, what, **tolerance):
        if random:
            a, e = _tensors(actual), _tensors(expected)
            self.assertEqual(len(a), len(e), msg=what)
            for x, y in zip(a, e):
                self.assertEqual((x.shape, x.dtype), (y.shape, y.dtype), msg=f"{what} (random)")
        else:
            self.assertEqual(actual, expected, msg=f"{what} differs from CPU", **tolerance)

    # ------------------------------------------------------------------ forward
    @modules(SELECTED, allowed_dtypes=DTYPES)
    def test_forward(self, device, dtype, module_info, training):
        ran = 0
        for i, case in enumerate(self._cases(module_info, dtype, training, device)):
            what = f"{module_info.name} input {i} ({case.module_input.desc!r})"
            res = self._forward_both(case, what)
            if res is not None:
                self._agree(res[1], res[0], res[2], what)
                ran += 1
        if ran == 0:
            self.skipTest("the CPU rejects every sample")

    # ------------------------------------------------------------ noncontiguous
    @modules(SELECTED, allowed_dtypes=DTYPES)
    def test_noncontiguous(self, device, dtype, module_info, training):
        ran = 0
        for i, case in enumerate(self._cases(module_info, dtype, training, device)):
            if not any(t.numel() > 1 for t in _tensors([case.args, case.kwargs])):
                continue
            what = f"{module_info.name} input {i} ({case.module_input.desc!r}) non-contiguous"
            res = self._forward_both(case, what, noncontiguous=True)
            if res is not None:
                self._agree(res[1], res[0], res[2], what)
                ran += 1
        if ran == 0:
            self.skipTest("the CPU rejects every sample")

    # ----------------------------------------------------------------- backward
    def _grads(self, module, args, kwargs, seed, on_device=False):
        leaves = [t for t in _tensors([args, kwargs]) if t.requires_grad]
        params = [p for p in module.parameters() if p.requires_grad]
        torch.manual_seed(SEED)
        out = _run_on_device(module, args, kwargs) if on_device else module(*args, **kwargs)
        outs = [o for o in _tensors(out) if o.requires_grad]
        if not outs or not (leaves or params):
            return None
        gen = torch.Generator().manual_seed(seed)
        weights = [torch.randn(o.shape, dtype=o.dtype, generator=gen).to(o.device) for o in outs]
        return torch.autograd.grad(outs, leaves + params, grad_outputs=weights, allow_unused=True)

    @modules(SELECTED, allowed_dtypes=DTYPES)
    def test_backward(self, device, dtype, module_info, training):
        checked = 0
        for i, case in enumerate(self._cases(module_info, dtype, training, device, requires_grad=True)):
            what = f"{module_info.name} input {i} ({case.module_input.desc!r}) grad"
            args, kwargs = case.inputs("cpu")
            before = torch.get_rng_state()
            try:
                expected = self._grads(case.cpu_module, args, kwargs, SEED + i)
            except Exception as cpu_error:
                _, dev_module = case.modules()
                dargs, dkwargs = case.inputs(device)
                want = type(cpu_error) if FRONTEND == "eager" else Exception
                with self.assertRaises(want, msg=f"{what}: the CPU raised {cpu_error!r}, mydev did not"):
                    self._grads(dev_module, dargs, dkwargs, SEED + i, on_device=True)
                continue
            if expected is None:
                continue
            random = not torch.equal(torch.get_rng_state(), before)
            _, dev_module = case.modules()
            dargs, dkwargs = case.inputs(device)
            actual = self._grads(dev_module, dargs, dkwargs, SEED + i, on_device=True)
            self.assertIsNotNone(actual, msg=f"{what}: no differentiable output on mydev")
            for k, (a, e) in enumerate(zip(actual, expected)):
                self.assertEqual(a is None, e is None, msg=f"{what} {k}: defined on one device only")
            actual = [None if a is None else self._on_device(a, device) for a in actual]
            # Parameter gradients sum over the batch and (in attention, recurrent
            # layers) over many products, in an order that may differ from the
            # CPU's by a few float32 ulps per term: float32 gets a looser bound.
            tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {}
            self._agree(actual, list(expected), random, what, **tolerance)
            checked += 1
        if checked == 0:
            self.skipTest("no sample with a differentiable output")

    # ---------------------------------------------------------- .to round trips
    @modules(SELECTED, allowed_dtypes=DTYPES)
    def test_to_round_trip(self, device, dtype, module_info, training):
        ran = 0
        for i, case in enumerate(self._cases(module_info, dtype, training, device)):
            what = f"{module_info.name} input {i} ({case.module_input.desc!r})"
            res = self._forward_both(case, what)  # also materialises lazy modules
            if res is None:
                continue
            cpu_module, dev_module = case.modules()
            params = list(dev_module.parameters())
            other = torch.float32 if dtype == torch.float64 else torch.float64
            dev_module.to(device).to(other).to(dtype).to("cpu")
            self.assertEqual(len(params), len(list(dev_module.parameters())))
            for p, q in zip(params, dev_module.parameters()):
                self.assertIs(p, q, msg=f"{what}: .to() replaced a Parameter")
                self.assertEqual(q.device.type, "cpu")
            for (name, a), (_, b) in zip(dev_module.state_dict().items(), cpu_module.state_dict().items()):
                if other == torch.float32 and a.is_floating_point():
                    continue  # went through float32: compared by the forward below
                self.assertEqual(a, b, msg=f"{what}: {name} after the round trip")
            dev_module.to(device)
            self.assertTrue(all(p.device.type == torch.device(device).type for p in dev_module.parameters()))
            if other == torch.float64:  # float32 -> float64 -> float32 is exact
                res2 = self._forward_both(case, what + " after round trips")
                self._agree(res2[1], res2[0], res2[2], what + " after round trips")
            ran += 1
        if ran == 0:
            self.skipTest("the CPU rejects every sample")

    # -------------------------------------------------------------- state_dict
    @modules(SELECTED, allowed_dtypes=DTYPES)
    def test_state_dict(self, device, dtype, module_info, training):
        ran = 0
        for i, case in enumerate(self._cases(module_info, dtype, training, device)):
            what = f"{module_info.name} input {i} ({case.module_input.desc!r}) state_dict"
            if self._forward_both(case, what) is None:
                continue
            cpu_module, dev_module = case.modules()
            state = dev_module.state_dict()
            for name, t in state.items():
                self.assertEqual(t.device.type, torch.device(device).type, msg=f"{what}: {name}")
            buf = io.BytesIO()
            torch.save(state, buf)
            buf.seek(0)
            saved = torch.load(buf, map_location="cpu")
            fresh_cpu = copy.deepcopy(cpu_module)
            fresh_cpu.load_state_dict(saved)
            for (name, a), (_, b) in zip(fresh_cpu.state_dict().items(), cpu_module.state_dict().items()):
                self.assertEqual(a, b, msg=f"{what}: {name} after torch.save/load")
            fresh_dev = copy.deepcopy(dev_module)
            fresh_dev.load_state_dict(cpu_module.state_dict())
            for (name, a), (_, b) in zip(fresh_dev.state_dict().items(), cpu_module.state_dict().items()):
                self.assertEqual(a.device.type, torch.device(device).type, msg=f"{what}: {name}")
                self.assertEqual(a.cpu(), b, msg=f"{what}: {name} loaded from the CPU")
            ran += 1
        if ran == 0:
            self.skipTest("the CPU rejects every sample")


instantiate_device_type_tests(TestModuleConformance, globals(), only_for=("mydev",))

if __name__ == "__main__":
    run_tests()
