"""Autocast and GradScaler on mydev, against CPU autocast, CUDA's policy table and float32 runs."""
import copy
import os
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import my_device
from conftest import delayed

LOW = [torch.float16, torch.bfloat16]

# Ops whose AutocastCUDA kernel exists only because they are cuDNN entry points.
CUDA_ONLY = {"aten::cudnn_convolution", "aten::cudnn_convolution_transpose"}


def _autocast_ops(key):
    return {name for name in torch._C._dispatch_get_all_op_names()
            if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, key)}


def test_default_dtype_is_cudas():
    assert torch.get_autocast_dtype("mydev") == torch.get_autocast_dtype("cuda") == torch.float16
    with torch.autocast("mydev"):
        assert torch.is_autocast_enabled("mydev")
        assert not torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("mydev") == torch.float16
    assert not torch.is_autocast_enabled("mydev")


def test_policy_table_is_cudas():
    cuda_ops = _autocast_ops("AutocastCUDA")
    mydev_ops = _autocast_ops("AutocastPrivateUse1")
    assert len(cuda_ops) > 100
    assert mydev_ops == cuda_ops - CUDA_ONLY


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# (name, function, float32 CPU inputs). Run on mydev under autocast, each must give the autocast
# dtype and the values of the same function on CPU inputs cast to that dtype.
LOWER_PRECISION = [
    ("mm", torch.mm, (_x(4, 5), _x(5, 3, seed=1))),
    ("addmm", torch.addmm, (_x(3), _x(4, 5), _x(5, 3, seed=1))),
    ("bmm", torch.bmm, (_x(2, 4, 5), _x(2, 5, 3, seed=1))),
    ("baddbmm", torch.baddbmm, (_x(2, 4, 3), _x(2, 4, 5), _x(2, 5, 3, seed=1))),
    ("addbmm", torch.addbmm, (_x(4, 3), _x(2, 4, 5), _x(2, 5, 3, seed=1))),
    ("matmul", torch.matmul, (_x(2, 4, 5), _x(5, 3, seed=1))),
    ("linear", F.linear, (_x(4, 5), _x(3, 5, seed=1), _x(3, seed=2))),
    ("mv", torch.mv, (_x(4, 5), _x(5, seed=1))),
    ("addmv", torch.addmv, (_x(4), _x(4, 5), _x(5, seed=1))),
    ("addr", torch.addr, (_x(4, 5), _x(4), _x(5, seed=1))),
    ("einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), (_x(4, 5), _x(5, 3, seed=1))),
    ("linalg_vecdot", torch.linalg.vecdot, (_x(4, 5), _x(4, 5, seed=1))),
    ("linalg_multi_dot", lambda a, b, c: torch.linalg.multi_dot([a, b, c]), (_x(3, 4), _x(4, 5), _x(5, 2))),
    ("conv1d", F.conv1d, (_x(2, 3, 9), _x(4, 3, 3, seed=1))),
    ("conv2d", F.conv2d, (_x(2, 3, 6, 6), _x(4, 3, 3, 3, seed=1), _x(4, seed=2))),
    ("conv3d", F.conv3d, (_x(1, 2, 4, 4, 4), _x(3, 2, 2, 2, 2, seed=1))),
    ("conv_transpose2d", F.conv_transpose2d, (_x(2, 3, 5, 5), _x(3, 4, 3, 3, seed=1))),
    ("prelu", F.prelu, (_x(2, 3, 4), torch.tensor([0.25, 0.1, 0.3]))),
    ("scaled_dot_product_attention", F.scaled_dot_product_attention,
     (_x(1, 2, 4, 8), _x(1, 2, 4, 8, seed=1), _x(1, 2, 4, 8, seed=2))),
    # lstm_cell and gru_cell are not here: on mydev they fail with and without autocast, because their
    # composite kernels take the fused path PyTorch keeps for CUDA/XPU/PrivateUse1
    # (_thnn_fused_lstm_cell/_gru_cell), which has no CPU kernel to run as a host kernel.
    ("rnn_tanh_cell", lambda x, h, w_ih, w_hh: torch.rnn_tanh_cell(x, h, w_ih, w_hh),
     (_x(2, 3), _x(2, 4, seed=1), _x(4, 3, seed=3), _x(4, 4, seed=4))),
]
# Ops in CPU autocast's lower-precision list too (the lists the two devices share).
CPU_LOWER_PRECISION = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "linalg_vecdot", "conv1d",
                       "conv2d", "conv3d", "conv_transpose2d", "prelu", "scaled_dot_product_attention"}


def _to(args, device, dtype=None):
    return tuple(a.to(device=device, dtype=dtype) for a in args)


def _low_tolerance(dtype):
    return dict(atol=1e-2, rtol=1e-2) if dtype == torch.float16 else dict(atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("dtype", LOW, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name,fn,args", LOWER_PRECISION, ids=[c[0] for c in LOWER_PRECISION])
def test_lower_precision_ops(name, fn, args, dtype):
    with torch.autocast("mydev", dtype=dtype):
        out = fn(*_to(args, "mydev"))
    assert out.dtype == dtype
    # The op ran in the autocast dtype: same result as the CPU op on inputs cast by hand.
    expected = fn(*_to(args, "cpu", dtype))
    torch.testing.assert_close(out.cpu(), expected, **_low_tolerance(dtype))
    if name in CPU_LOWER_PRECISION:
        with torch.autocast("cpu", dtype=dtype):
            assert fn(*args).dtype == out.dtype


def _h(*shape, seed=0):
    # Positive inputs, so log/rsqrt/pow stay finite.
    return _x(*shape, seed=seed).abs() + 0.5


# (name, function, inputs); inputs are made float16/bfloat16 and each op must return float32.
FP32 = [
    ("exp", torch.exp, (_x(4, 5),)),
    ("log", torch.log, (_h(4, 5),)),
    ("log1p", torch.log1p, (_h(4, 5),)),
    ("rsqrt", torch.rsqrt, (_h(4, 5),)),
    ("reciprocal", torch.reciprocal, (_h(4, 5),)),
    ("acos", torch.acos, (_x(4, 5).clamp(-0.9, 0.9),)),
    ("tan", torch.tan, (_x(4, 5),)),
    ("pow.Tensor_Scalar", lambda a: torch.pow(a, 2.5), (_h(4, 5),)),
    ("pow.Tensor_Tensor", torch.pow, (_h(4, 5), _x(4, 5, seed=1))),
    ("softplus", F.softplus, (_x(4, 5),)),
    ("layer_norm", lambda a, w: F.layer_norm(a, (5,), w), (_x(4, 5), _h(5, seed=1))),
    ("group_norm", lambda a: F.group_norm(a, 2), (_x(2, 4, 3),)),
    ("rms_norm", lambda a: F.rms_norm(a, (5,)), (_x(4, 5),)),
    ("cosine_similarity", F.cosine_similarity, (_x(4, 5), _x(4, 5, seed=1))),
    ("mse_loss", F.mse_loss, (_x(4, 5), _x(4, 5, seed=1))),
    ("l1_loss", F.l1_loss, (_x(4, 5), _x(4, 5, seed=1))),
    ("smooth_l1_loss", F.smooth_l1_loss, (_x(4, 5), _x(4, 5, seed=1))),
    ("huber_loss", F.huber_loss, (_x(4, 5), _x(4, 5, seed=1))),
    ("kl_div", lambda a, b: F.kl_div(a, b, reduction="batchmean"), (_x(4, 5), _h(4, 5, seed=1))),
    ("nll_loss", lambda a: F.nll_loss(a, torch.tensor([0, 2, 1, 4], device=a.device)), (_x(4, 5),)),
    ("binary_cross_entropy_with_logits", F.binary_cross_entropy_with_logits, (_x(4, 5), _h(4, 5).clamp(max=1))),
    ("cdist", torch.cdist, (_x(3, 5), _x(4, 5, seed=1))),
    ("dist", torch.dist, (_x(3, 5), _x(3, 5, seed=1))),
    ("logsumexp", lambda a: torch.logsumexp(a, 1), (_x(4, 5),)),
    ("upsample_bilinear2d", lambda a: F.interpolate(a, scale_factor=2, mode="bilinear"), (_x(1, 2, 3, 3),)),
    ("upsample_nearest2d", lambda a: F.interpolate(a, scale_factor=2, mode="nearest"), (_x(1, 2, 3, 3),)),
    # fp32_set_opt_dtype: float32 unless the caller asked for an output dtype
    ("softmax", lambda a: torch.softmax(a, 1), (_x(4, 5),)),
    ("log_softmax", lambda a: torch.log_softmax(a, 1), (_x(4, 5),)),
    ("sum", torch.sum, (_x(4, 5),)),
    ("sum.dim_IntList", lambda a: a.sum(1), (_x(4, 5),)),
    ("prod", lambda a: a.prod(1), (_x(4, 5),)),
    ("cumsum", lambda a: a.cumsum(1), (_x(4, 5),)),
    ("linalg_vector_norm", torch.linalg.vector_norm, (_x(4, 5),)),
    # fp32_append_dtype
    ("norm.Scalar", lambda a: a.norm(), (_x(4, 5),)),
    ("norm.ScalarOpt_dim", lambda a: a.norm(2, 1), (_x(4, 5),)),
]
CPU_FP32 = {"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "nll_loss",
            "binary_cross_entropy_with_logits", "cdist"}


@pytest.mark.parametrize("dtype", LOW, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name,fn,args", FP32, ids=[c[0] for c in FP32])
def test_fp32_ops(name, fn, args, dtype):
    low = _to(args, "mydev", dtype)
    with torch.autocast("mydev", dtype=dtype):
        out = fn(*low)
    assert out.dtype == torch.float32
    # Computed in float32 from the low-precision values: as the CPU op on them upcast by hand.
    expected = fn(*(a.float() for a in _to(args, "cpu", dtype)))
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
    if name in CPU_FP32:
        with torch.autocast("cpu", dtype=dtype):
            assert fn(*_to(args, "cpu", dtype)).dtype == out.dtype


def _cuda_lists():
    """CUDA's autocast op lists, read from the installed torch's ATen/autocast_mode.h (the macros
    csrc/amp/Autocast.cpp registers): {"AT_FORALL_FP32": {"exp", "pow.Scalar", ...}, ...}."""
    import os.path
    header = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "autocast_mode.h")
    text = open(header).read()
    lists = {}
    for macro, body in re.findall(r"#define (AT_FORALL_\w+)\(_\)(.*?)\n\n", text, re.S):
        names = set()
        for args in re.findall(r"_\(([^()]*(?:\([^()]*\)[^()]*)*)\)", body):
            parts = [p.replace("\\", "").strip() for p in args.split(",")]  # drop line continuations
            if parts[0].startswith("ADD_NS("):  # (ADD_NS(norm), "norm.Scalar", ...)
                names.add(parts[1].strip('"'))
            else:
                names.add(parts[0] if len(parts) == 1 else f"{parts[0]}.{parts[1]}")
        lists[macro] = names
    return lists


def test_sample_tables_follow_cudas_lists():
    # The expectations of the tests above come from CUDA's table, not from this file.
    lists = _cuda_lists()
    lower = lists["AT_FORALL_LOWER_PRECISION_FP"]
    fp32 = (lists["AT_FORALL_FP32"] | lists["AT_FORALL_FP32_SET_OPT_DTYPE"]
            | lists["AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE"])
    bases = lambda names: {n.split(".")[0] for n in names}
    for name, _, _ in LOWER_PRECISION:
        assert name in lower or name in bases(lower), name
    for name, _, _ in FP32:
        assert name in fp32 or (name in bases(fp32) and "." not in name), name
    assert {"addcmul", "atan2", "cross", "dot", "scatter_add"} <= lists["AT_FORALL_PROMOTE"]
    assert len(lower) > 20 and len(fp32) > 50
    # and the ops registered for mydev are exactly these lists (plus the refused binary_cross_entropy)
    listed = {f"aten::{n}" for n in lower | fp32 | lists["AT_FORALL_PROMOTE"]}
    assert listed == _autocast_ops("AutocastPrivateUse1") - {"aten::binary_cross_entropy"}


@pytest.mark.parametrize("dtype", LOW, ids=["float16", "bfloat16"])
def test_set_opt_dtype_keeps_an_explicit_dtype(dtype):
    x = _x(4, 5).to("mydev", dtype)
    with torch.autocast("mydev", dtype=dtype):
        assert torch.softmax(x, 1, dtype=torch.float64).dtype == torch.float64
        assert x.sum(dtype=dtype).dtype == dtype
        # float64 inputs are never touched by autocast
        assert torch.exp(x.double()).dtype == torch.float64


@pytest.mark.parametrize("dtype", LOW, ids=["float16", "bfloat16"])
def test_promote_ops(dtype):
    a, b, c = (_x(4, 3, seed=s).to("mydev") for s in range(3))
    with torch.autocast("mydev", dtype=dtype):
        # Mixed float32 / low inputs run in float32, all-low inputs stay low.
        assert torch.addcmul(a, b.to(dtype), c.to(dtype)).dtype == torch.float32
        assert torch.addcmul(a.to(dtype), b.to(dtype), c.to(dtype)).dtype == dtype
        assert torch.atan2(a, b.to(dtype)).dtype == torch.float32
        assert torch.cross(a, b.to(dtype), dim=1).dtype == torch.float32
        # dot requires equal dtypes; under autocast the low one is promoted.
        d = torch.dot(a[0].to(dtype), b[0])
        assert d.dtype == torch.float32
        idx = torch.tensor([0, 2], device="mydev")
        s = a.scatter_add(0, idx.view(2, 1).expand(2, 3), b[:2].to(dtype))
        assert s.dtype == torch.float32
    torch.testing.assert_close(d.cpu(), torch.dot(a[0].cpu().to(dtype).float(), b[0].cpu()))
    with pytest.raises(RuntimeError, match="expected both vectors to have same dtype"):
        torch.dot(a[0].to(dtype), b[0])  # outside autocast: no promotion


@pytest.mark.parametrize("dtype", LOW, ids=["float16", "bfloat16"])
def test_ops_without_policy_keep_input_dtype(dtype):
    x = _x(4, 5).to("mydev")
    with torch.autocast("mydev", dtype=dtype):
        assert torch.relu(x).dtype == torch.float32
        assert (x + 1).dtype == torch.float32
        assert torch.relu(x.to(dtype)).dtype == dtype
        # CPU tensors are CPU autocast's business, disabled here.
        assert torch.mm(x.cpu(), x.cpu().t()).dtype == torch.float32
        with torch.autocast("mydev", enabled=False):
            assert torch.mm(x, x.t()).dtype == torch.float32


def test_binary_cross_entropy_is_refused_as_on_cuda():
    p = torch.rand(4, device="mydev")
    t = torch.rand(4, device="mydev")
    with torch.autocast("mydev"):
        with pytest.raises(RuntimeError, match="binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast"):
            F.binary_cross_entropy(p, t)
        # the device and autocast keep working after the error
        assert torch.mm(p.view(2, 2), t.view(2, 2)).dtype == torch.float16
    torch.testing.assert_close(F.binary_cross_entropy(p, t).cpu(), F.binary_cross_entropy(p.cpu(), t.cpu()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_autocast_takes_the_floating_dtypes_cuda_takes(dtype):
    # CUDA's autocast accepts any floating dtype (it checks only bfloat16 support); autocast asks a
    # PrivateUse1 device for its list instead, and without them warned and disabled itself.
    x = _x(2, 2).half().to("mydev")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("mydev", dtype=dtype):
            assert torch.is_autocast_enabled("mydev")
            assert torch.mm(x, x).dtype == dtype


def test_unsupported_dtype_disables_autocast_with_a_warning():
    with pytest.warns(UserWarning, match="mydev"):
        with torch.autocast("mydev", dtype=torch.int32):
            assert not torch.is_autocast_enabled("mydev")
            x = _x(2, 2).to("mydev")
            assert torch.mm(x, x).dtype == torch.float32


@pytest.mark.parametrize("dtype", LOW, ids=["float16", "bfloat16"])
def test_custom_ops(dtype):
    x, w, b = _x(3, 4).to("mydev"), _x(5, 4, seed=1).to("mydev"), _x(5, seed=2).to("mydev")
    with torch.autocast("mydev", dtype=dtype):
        y = my_device.ops.fused_linear_gelu(x, w, b)  # a linear: autocast dtype
        n = my_device.ops.rms_norm(x.to(dtype), w[0])  # a norm: float32
        s_mixed = my_device.ops.swiglu(x.to(dtype), x)  # promote
        s_low = my_device.ops.swiglu(x.to(dtype), x.to(dtype))
    assert (y.dtype, n.dtype, s_mixed.dtype, s_low.dtype) == (dtype, torch.float32, torch.float32, dtype)
    xc, wc, bc = x.cpu(), w.cpu(), b.cpu()
    torch.testing.assert_close(y.cpu(), my_device.ops.fused_linear_gelu(xc.to(dtype), wc.to(dtype), bc.to(dtype)))
    torch.testing.assert_close(n.cpu(), my_device.ops.rms_norm(xc.to(dtype).float(), wc[0]))
    # Outside autocast, mixed dtypes are an error of the op itself.
    with pytest.raises(RuntimeError, match="same dtype"):
        my_device.ops.swiglu(x.to(dtype), x)


def test_custom_ops_autograd_under_autocast():
    x = _x(3, 4).to("mydev").requires_grad_()
    w = _x(5, 4, seed=1).to("mydev").requires_grad_()
    with torch.autocast("mydev", dtype=torch.bfloat16):
        y = my_device.ops.fused_linear_gelu(x, w, None)
    y.float().sum().backward()
    # Gradients come back in the leaves' dtype, through the autocast cast.
    assert x.grad.dtype == w.grad.dtype == torch.float32
    xc = x.detach().cpu().requires_grad_()
    wc = w.detach().cpu().requires_grad_()
    my_device.ops.fused_linear_gelu(xc.bfloat16(), wc.bfloat16(), None).float().sum().backward()
    torch.testing.assert_close(x.grad.cpu(), xc.grad)
    torch.testing.assert_close(w.grad.cpu(), wc.grad)


def test_mydev_amp_module_mirrors_cuda_amp():
    assert set(torch.cuda.amp.__all__) <= set(torch.mydev.amp.__all__)
    x = _x(3, 3).to("mydev")
    with torch.mydev.amp.autocast():
        assert torch.mm(x, x).dtype == torch.float16
    with torch.mydev.amp.autocast(dtype=torch.bfloat16):
        assert torch.mm(x, x).dtype == torch.bfloat16

    @torch.mydev.amp.autocast()
    def decorated(a):
        return a @ a

    assert decorated(x).dtype == torch.float16
    scaler = torch.mydev.amp.GradScaler(init_scale=8.0)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler._device == "mydev"
    assert scaler.get_scale() == 8.0
    assert not torch.mydev.amp.amp_definitely_not_available()

    class Double(torch.autograd.Function):
        @staticmethod
        @torch.mydev.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, a):
            ctx.was_enabled = torch.is_autocast_enabled("mydev")
            return a * 2

        @staticmethod
        @torch.mydev.amp.custom_bwd
        def backward(ctx, g):
            return g * 2

    a = x.to(torch.float16).requires_grad_()
    with torch.mydev.amp.autocast():
        out = Double.apply(a)
    assert out.dtype == torch.float32  # cast_inputs ran forward in float32, autocast off
    out.sum().backward()
    assert a.grad.dtype == torch.float16


def _mlp():
    # Only ops whose policy CPU autocast shares (linear; gelu and mse_loss's inputs), so that the two
    # devices compute in the same dtypes.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 4))


def _data(steps):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)) for _ in range(steps)]


def test_autocast_training_matches_cpu_autocast():
    model = _mlp()
    results = {}
    for device in ("cpu", "mydev"):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        losses = []
        for x, y in _data(3):
            with torch.autocast(device, dtype=torch.bfloat16):
                out = m(x.to(device))
                assert out.dtype == torch.bfloat16
                loss = F.mse_loss(out, y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        results[device] = (losses, [p.detach().cpu() for p in m.parameters()])
    torch.testing.assert_close(results["mydev"][0], results["cpu"][0])
    for pd, pc in zip(results["mydev"][1], results["cpu"][1]):
        torch.testing.assert_close(pd, pc)


# --- GradScaler -------------------------------------------------------------------------------------


def _grads(dtype):
    g = _x(6, 5).to(dtype)
    return [g, _x(5, 7, seed=1).to(dtype).t(), _x(3, seed=2).to(dtype)]  # one of them non-contiguous


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bad", [None, float("inf"), float("nan")], ids=["finite", "inf", "nan"])
def test_unscale_kernel_matches_cpu(dtype, bad):
    cpu = _grads(dtype)
    if bad is not None:
        cpu[1][2, 3] = bad
    dev = [g.to("mydev") for g in cpu]
    inv_scale = torch.tensor([0.125])
    results = []
    for grads, device in ((cpu, "cpu"), (dev, "mydev")):
        found_inf = torch.zeros((), device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale.to(device))
        results.append((found_inf.cpu(), [g.cpu() for g in grads]))
    (cpu_found, cpu_grads), (dev_found, dev_grads) = results
    assert dev_found.item() == cpu_found.item() == (0.0 if bad is None else 1.0)
    for d, c in zip(dev_grads, cpu_grads):
        torch.testing.assert_close(d, c, equal_nan=True, atol=0, rtol=0)


def test_update_scale_matches_cpu():
    states = {d: (torch.full((), 1024.0, device=d), torch.zeros((), dtype=torch.int32, device=d))
              for d in ("cpu", "mydev")}
    for found in [0, 0, 0, 1, 0, 0, 1, 1, 0]:
        for device, (scale, tracker) in states.items():
            torch._amp_update_scale_(scale, tracker, torch.full((), float(found), device=device), 2.0, 0.5, 2)
        (cs, ct), (ds, dt) = states["cpu"], states["mydev"]
        assert (ds.item(), dt.item()) == (cs.item(), ct.item())
    assert states["cpu"][0].item() != 1024.0  # the sequence both grew and backed off the scale


def test_scale_does_not_grow_to_inf():
    scale = torch.full((), 3e38, device="mydev")
    tracker = torch.zeros((), dtype=torch.int32, device="mydev")
    torch._amp_update_scale_(scale, tracker, torch.zeros((), device="mydev"), 2.0, 0.5, 1)
    assert scale.item() == pytest.approx(3e38) and tracker.item() == 0


def test_amp_kernels_are_queued():
    grads = [torch.ones(4, device="mydev") * 8]
    found_inf = torch.zeros((), device="mydev")
    scale = torch.full((), 8.0, device="mydev")
    tracker = torch.zeros((), dtype=torch.int32, device="mydev")
    torch.mydev.synchronize()
    torch.mydev.set_sync_debug_mode("error")
    try:
        with delayed(torch.mydev.current_stream()) as stream:
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, scale.reciprocal())
            torch._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 1)
            # Both returned before the device ran them (with MYDEV_LAUNCH_BLOCKING=1, after).
            assert stream.query() == (os.environ.get("MYDEV_LAUNCH_BLOCKING") == "1")
    finally:
        torch.mydev.set_sync_debug_mode("default")
    assert grads[0].cpu().tolist() == [1.0] * 4
    assert (scale.item(), tracker.item(), found_inf.item()) == (16.0, 0, 0.0)


@pytest.mark.parametrize("kernel", ["aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"])
def test_amp_kernel_failure_is_reported_at_the_next_synchronisation(kernel):
    # As a CUDA kernel's: not by the call but by the next synchronisation, naming the op (by the call
    # with MYDEV_LAUNCH_BLOCKING=1); the device keeps working.
    g, found, scale = torch.ones(3, device="mydev"), torch.zeros((), device="mydev"), torch.ones((), device="mydev")
    tracker = torch.zeros((), dtype=torch.int32, device="mydev")

    def launch():
        if kernel.endswith("unscale_"):
            torch._amp_foreach_non_finite_check_and_unscale_([g], found, scale)
        else:
            torch._amp_update_scale_(scale, tracker, found, 2.0, 0.5, 1)

    torch.mydev.synchronize()
    my_device._C._test_inject_kernel_failure(kernel)
    failure = pytest.raises(RuntimeError, match=f"{kernel}: injected failure")
    if os.environ.get("MYDEV_LAUNCH_BLOCKING") == "1":
        with failure:
            launch()
    else:
        launch()
        with failure:
            torch.mydev.synchronize()
    launch()
    assert (g.cpu().tolist(), scale.item()) == ([1.0] * 3, 1.0 if kernel.endswith("unscale_") else 2.0)


def test_amp_kernel_argument_errors():
    g = torch.ones(3, device="mydev")
    found = torch.zeros((), device="mydev")
    inv = torch.ones((), device="mydev")
    cases = [
        (lambda: torch._amp_foreach_non_finite_check_and_unscale_([g], found.int(), inv), "found_inf must be a float"),
        (lambda: torch._amp_foreach_non_finite_check_and_unscale_([g], found, inv.cpu()), "inv_scale must be a mydev"),
        (lambda: torch._amp_foreach_non_finite_check_and_unscale_([g], found, torch.ones(2, device="mydev")),
         "inv_scale must be a 1-element tensor"),
        (lambda: torch._amp_foreach_non_finite_check_and_unscale_([g.to("mydev:1")], found, inv),
         "one of scaled_grads is on mydev:1"),
        (lambda: torch._amp_foreach_non_finite_check_and_unscale_([g.long()], found, inv), "expected float32"),
        (lambda: torch._amp_update_scale_(inv.clone(), found.clone(), found, 2.0, 0.5, 1),
         "growth_tracker must be an int tensor"),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()
    # Nothing was queued by the failed calls, and the device keeps working.
    torch.mydev.synchronize()
    assert g.cpu().tolist() == [1.0] * 3 and found.item() == 0.0
    torch._amp_foreach_non_finite_check_and_unscale_([g], found, inv * 0.5)
    assert g.cpu().tolist() == [0.5] * 3


def _scaled_step(model, opt, scaler, x, y, device, dtype, poison=False):
    with torch.autocast(device, dtype=dtype):
        loss = F.mse_loss(model(x), y)
    if poison:  # an overflow in the backward pass: every gradient becomes inf or NaN
        loss = loss * float("inf")
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    return loss


def test_grad_scaler_waits_only_where_cuda_does():
    model = _mlp().to("mydev")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("mydev")
    x, y = (t.to("mydev") for t in _data(1)[0])
    _scaled_step(model, opt, scaler, x, y, "mydev", torch.float16)  # first-call initialisation
    torch.mydev.synchronize()
    torch.mydev.set_sync_debug_mode("error")
    try:
        with torch.autocast("mydev", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        # step() reads found_inf on the host (`.item()`), on CUDA too: the iteration's one wait.
        with pytest.raises(RuntimeError, match="called a synchronizing mydev operation"):
            scaler.step(opt)
        torch.mydev.set_sync_debug_mode("default")
        scaler.step(opt)
        torch.mydev.set_sync_debug_mode("error")
        scaler.update()
    finally:
        torch.mydev.set_sync_debug_mode("default")
    assert scaler.get_scale() == 65536.0


def test_fp16_training_with_grad_scaler_matches_float32():
    steps, poisoned = 6, 2
    data = _data(steps)
    model = _mlp()

    # float32 reference on CPU, without the poisoned step (GradScaler must skip it).
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for i, (x, y) in enumerate(data):
        if i == poisoned:
            continue
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()

    runs = {}
    for device in ("cpu", "mydev"):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        scaler = torch.amp.GradScaler(device, init_scale=2.0**12, growth_interval=2)
        scales, losses = [], []
        for i, (x, y) in enumerate(data):
            before = [p.detach().clone() for p in m.parameters()]
            loss = _scaled_step(m, opt, scaler, x.to(device), y.to(device), device, torch.float16, i == poisoned)
            if i == poisoned:  # skipped: parameters untouched
                for b, p in zip(before, m.parameters()):
                    assert torch.equal(b.cpu(), p.detach().cpu())
            scales.append(scaler.get_scale())
            losses.append(loss.item())
        runs[device] = (scales, losses, [p.detach().cpu() for p in m.parameters()])
    # Scale history: grows every 2 good steps, halves at the inf step; the same as CPU's GradScaler.
    assert runs["mydev"][0] == runs["cpu"][0] == [4096.0, 8192.0, 4096.0, 4096.0, 8192.0, 8192.0]
    torch.testing.assert_close(runs["mydev"][1], runs["cpu"][1], equal_nan=True)
    for pd, pc, pr in zip(runs["mydev"][2], runs["cpu"][2], ref.parameters()):
        assert pd.dtype == torch.float32
        torch.testing.assert_close(pd, pc)
        torch.testing.assert_close(pd, pr.detach(), atol=5e-3, rtol=5e-3)


def test_autocast_inside_torch_compile_matches_eager():
    # Dynamo records the autocast region and aot_autograd traces through the AutocastPrivateUse1 kernels,
    # so the compiled graph runs the casts eager autocast does.
    model = _mlp().to("mydev")
    x = _data(1)[0][0].to("mydev")

    def step(x):
        with torch.autocast("mydev", dtype=torch.bfloat16):
            out = model(x)
        return out.float().square().mean()

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="mydev")
    results = []
    for fn in (step, compiled):
        model.zero_grad()
        loss = fn(x)
        loss.backward()
        results.append((loss.detach().cpu(), [p.grad.cpu() for p in model.parameters()]))
    (eager_loss, eager_grads), (compiled_loss, compiled_grads) = results
    torch.testing.assert_close(compiled_loss, eager_loss)
    for c, e in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(c, e)
    torch._dynamo.reset()


def test_grad_scaler_with_a_model_on_two_devices():
    # One found_inf per device; update() gathers them on the scale's device. An inf on mydev:1 alone
    # skips the step for both devices' parameters.
    torch.manual_seed(0)
    first, second = nn.Linear(4, 8), nn.Linear(8, 2)
    x = _x(3, 4)
    runs = {}
    for devices in (("cpu", "cpu"), ("mydev:0", "mydev:1")):
        a, b = copy.deepcopy(first).to(devices[0]), copy.deepcopy(second).to(devices[1])
        opt = torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1)
        scaler = torch.amp.GradScaler(torch.device(devices[0]).type, init_scale=1024.0)
        scales = []
        for i in range(3):
            with torch.autocast(torch.device(devices[0]).type, dtype=torch.float16):
                out = b(a(x.to(devices[0])).to(devices[1]))
            loss = out.float().square().mean()
            if i == 1:  # only the second layer's weight gradient overflows
                loss = loss + b.weight.float().sum() * float("inf")
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        runs[devices[0]] = (scales, [p.detach().cpu() for p in [*a.parameters(), *b.parameters()]])
    assert runs["mydev:0"][0] == runs["cpu"][0] == [1024.0, 512.0, 512.0]
    for d, c in zip(runs["mydev:0"][1], runs["cpu"][1]):
        torch.testing.assert_close(d, c)
