"""The optimizers' in-place foreach ops on mydev against the CPU, over PyTorch's own foreach OpInfos.

On mydev each in-place foreach call is one queued kernel for the whole list
(csrc/native/hostkernel/Plan.h, Kind::InPlaceList), where its composite
kernel runs one op per tensor on the CPU: these check that the results, and
the errors, are the same.
"""
import pytest
import torch
from torch.testing._internal import common_methods_invocations as cmi

DBS = ("foreach_unary_op_db", "foreach_binary_op_db", "foreach_pointwise_op_db", "foreach_other_op_db")
IN_PLACE = [op for name in DBS for op in getattr(cmi, name) if op.inplace_variant is not None]


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.detach().to(device, copy=True)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(e, device) for e in x)
    return x


def _samples(op, dtype):
    # Up to 3 samples, of 3 tensors each (lists of different shapes included).
    return list(op.sample_inputs("cpu", dtype, num_input_tensors=[3]))[:3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("op", IN_PLACE, ids=[op.name for op in IN_PLACE])
def test_in_place_foreach_op_like_cpu(op, dtype):
    samples = _samples(op, dtype)
    assert samples, op.name
    for sample in samples:
        cpu_in = _to(sample.input, "cpu")
        cpu_args, kwargs = _to(sample.args, "cpu"), sample.kwargs
        try:
            op.inplace_variant(cpu_in, *cpu_args, **kwargs)
        except (RuntimeError, ValueError, TypeError) as e:
            # The CPU rejects this sample: mydev must reject it the same way, at the call.
            dev_in = _to(sample.input, "mydev")
            with pytest.raises(type(e)):
                op.inplace_variant(dev_in, *_to(sample.args, "mydev"), **kwargs)
                torch.mydev.synchronize()
            continue
        dev_in = _to(sample.input, "mydev")
        op.inplace_variant(dev_in, *_to(sample.args, "mydev"), **kwargs)
        for got, want in zip(dev_in, cpu_in):
            torch.testing.assert_close(got.cpu(), want, equal_nan=True)
