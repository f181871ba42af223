"""Operator coverage: every aten op with a CPU kernel has a mydev kernel, and training needs no fallback."""
import pytest
import torch

import my_device

HOST_KERNEL, OWN_KERNEL, EXCLUDED, SPARSE_HOST_KERNEL, QUANTIZED_HOST_KERNEL = my_device._C._host_kernel_coverage()


def _aten_ops_with_cpu_kernel():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return [n for n in torch._C._dispatch_get_all_op_names()
            if n.startswith("aten::") and has(n, "CPU")]


def _schema(full_name):
    name, _, overload = full_name.partition(".")
    return torch._C._get_schema(name, overload)


def test_every_cpu_op_has_a_mydev_kernel_or_a_reason():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    excluded = dict(EXCLUDED)
    missing = [n for n in _aten_ops_with_cpu_kernel() if not has(n, "PrivateUse1") and n not in excluded]
    assert missing == []
    assert all(reason for reason in excluded.values())
    assert not any(has(n, "PrivateUse1") for n in excluded)
    assert len(HOST_KERNEL) > 900  # the generic registration ran, and ran after the static ones:
    assert "aten::add.Tensor" in OWN_KERNEL and "aten::add.out" in HOST_KERNEL


def test_composite_implicit_ops_keep_their_decomposition():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in ("aten::linear", "aten::matmul", "aten::softmax.int", "aten::dropout"):
        assert has(name, "CompositeImplicitAutograd")
        assert not has(name, "PrivateUse1"), name


@pytest.mark.parametrize("fn", [torch.nn.functional.silu, torch.nn.functional.mish])
def test_ops_with_a_cpu_kernel_and_a_decomposition_use_the_cpu_kernel(fn):
    # silu_backward and mish_backward have a CPU (and CUDA) kernel besides their
    # decomposition; mydev uses the kernel, so half gradients round as on the
    # CPU, and second derivatives still come from their Autograd kernel.
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::silu_backward", "PrivateUse1")
    x = torch.randn(64, dtype=torch.float16, requires_grad=True)
    d = x.detach().to("mydev").requires_grad_()
    fn(x).sum().backward()
    fn(d).sum().backward()
    assert torch.equal(d.grad.cpu(), x.grad)
    x64 = torch.randn(3, 4, dtype=torch.float64, device="mydev", requires_grad=True)
    assert torch.autograd.gradgradcheck(fn, (x64,))


def test_host_kernels_never_serve_view_ops():
    # A host kernel can map a view of an input back, but view ops need their
    # own kernel (Views.cpp) or a decomposition; none may come here by accident.
    views = [n for n in HOST_KERNEL
             if any(r.alias_info is not None and not r.alias_info.is_write for r in _schema(n).returns)]
    assert views == []


def test_generic_kernels_match_cpu_without_fallback(monkeypatch):
    # Ops that the old hand-written lists did not cover.
    monkeypatch.setenv("MYDEV_FALLBACK", "error")
    a, b = torch.randn(4, 5), torch.rand(4, 5) + 0.5
    cases = [
        lambda a, b: torch.logaddexp(a, b),
        lambda a, b: torch.special.entr(b),
        lambda a, b: torch.linalg.inv(a[:, :4] + 4 * torch.eye(4, device=a.device)),
        lambda a, b: torch.nn.functional.interpolate(a[None, None], scale_factor=2, mode="bicubic"),
        lambda a, b: torch.cdist(a, b),
        lambda a, b: torch.fft.rfft(a),
        lambda a, b: torch.histc(b, bins=4),
    ]
    for f in cases:
        torch.testing.assert_close(f(a.to("mydev"), b.to("mydev")).cpu(), f(a, b))


def test_generic_random_ops_draw_from_the_mydev_generator():
    def draw():
        x = torch.empty(1000, device="mydev")
        return torch.cat([x.log_normal_(), x.clone().geometric_(0.3), torch.poisson(x.abs())]).cpu()

    torch.manual_seed(1)  # (seeds mydev too, so mydev is seeded after it)
    torch.mydev.manual_seed(7)
    cpu_state = torch.get_rng_state()
    first = draw()
    assert torch.equal(torch.get_rng_state(), cpu_state), "a mydev random op advanced the CPU generator"
    torch.manual_seed(123)  # a different CPU generator state must not matter
    torch.mydev.manual_seed(7)
    torch.testing.assert_close(draw(), first, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sdpa_picks_the_cpu_backend_and_matches_it_bit_for_bit(dtype):
    # mydev's _fused_sdp_choice_stub slot holds the CPU's choice, so SDPA runs
    # the CPU's fused flash kernel (as a host kernel) instead of the math path.
    q, k, v = (torch.randn(2, 3, 6, 8, dtype=dtype) for _ in range(3))
    grad = torch.randn(2, 3, 6, 8, dtype=dtype)
    results = {}
    for device in ("cpu", "mydev"):
        ins = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
        out = torch.nn.functional.scaled_dot_product_attention(*ins, is_causal=True)
        assert type(out.grad_fn).__name__ == "ScaledDotProductFlashAttentionForCpuBackward0"
        out.backward(grad.to(device))
        results[device] = [out.detach().cpu()] + [t.grad.cpu() for t in ins]
    for a, b in zip(results["mydev"], results["cpu"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_composite_ops_that_run_as_host_kernels_behave_as_on_cpu():
    # addr_ tells in-place from out= by reference address; run as a host kernel
    # it rejects a 0-d self as the CPU does, and leaves self alone.
    assert "aten::addr_" in HOST_KERNEL and "aten::mode.values" in HOST_KERNEL
    s = torch.tensor(2.0, device="mydev")
    a, b = torch.randn(3, device="mydev"), torch.randn(4, device="mydev")
    with pytest.raises(RuntimeError, match="2D tensor expected, got 0D tensor for input"):
        s.addr_(a, b)
    assert s.shape == () and s.item() == 2.0
    full = torch.ones(3, 4, device="mydev")
    torch.testing.assert_close(full.addr_(a, b).cpu(), torch.ones(3, 4).addr_(a.cpu(), b.cpu()))
    # mode's out= variant checks the device type against a fixed list of its own
    x = torch.tensor([[1.0, 2.0, 2.0, 3.0], [5.0, 5.0, 4.0, 4.0]])
    values, indices = torch.empty(0, device="mydev"), torch.empty(0, dtype=torch.long, device="mydev")
    result = torch.mode(x.to("mydev"), out=(values, indices))
    assert result.values is values and result.indices is indices
    expected = torch.mode(x)
    assert torch.equal(values.cpu(), expected.values) and torch.equal(indices.cpu(), expected.indices)


def test_conjugation_state_survives_host_kernels():
    # conj_physical_ calls its DispatchStub with the tensor's own device type,
    # so it runs as a composite on host tensors (svd's out= variant uses it).
    x = torch.randn(3, 4, dtype=torch.complex64)
    d = x.to("mydev")
    d.conj_physical_()
    assert torch.equal(d.cpu(), x.conj_physical())
    u, s, vh = (torch.empty(0, dtype=t, device="mydev") for t in (torch.complex64, torch.float32, torch.complex64))
    torch.svd(x.to("mydev"), out=(u, s, vh))
    torch.testing.assert_close((u * s.to(u.dtype)) @ vh.mH, x.to("mydev"))
    # linalg_lu_solve's out= kernel hands back its output with the conjugate
    # bit flipped (left=False); the mydev output must carry that bit too.
    a, b = torch.randn(3, 3, dtype=torch.complex64), torch.randn(4, 3, dtype=torch.complex64)
    lu, piv = torch.linalg.lu_factor(a)
    expected = torch.empty(0, dtype=torch.complex64)
    torch.linalg.lu_solve(lu, piv, b, left=False, out=expected)
    out = torch.empty(0, dtype=torch.complex64, device="mydev")
    torch.linalg.lu_solve(lu.to("mydev"), piv.to("mydev"), b.to("mydev"), left=False, out=out)
    assert out.is_conj() == expected.is_conj()
    assert torch.equal(out.cpu(), expected)


def test_autograd_zero_tensors_live_on_mydev_without_fallback(monkeypatch):
    # sgn's derivative for real inputs is _efficientzerotensor: sizes, no bytes
    monkeypatch.setenv("MYDEV_FALLBACK", "error")
    z = torch._efficientzerotensor((2, 3), dtype=torch.float16, device="mydev")
    assert z._is_zerotensor() and z.device.type == "mydev" and z.dtype == torch.float16
    assert z.untyped_storage().nbytes() == 0
    torch.testing.assert_close((z + torch.ones(2, 3, dtype=torch.float16, device="mydev")).cpu(),
                               torch.ones(2, 3, dtype=torch.float16))
    x = torch.randn(5, device="mydev", requires_grad=True)
    (torch.sgn(x) * 3 + x).sum().backward()
    assert torch.equal(x.grad.cpu(), torch.ones(5))


@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_training_step_needs_no_fallback(model_name, monkeypatch):
    torch.manual_seed(0)
    if model_name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                    torch.nn.Dropout(0.1), torch.nn.Linear(32, 4))
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    else:
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                    torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3), torch.nn.AdaptiveAvgPool2d(1),
                                    torch.nn.Flatten(), torch.nn.Linear(8, 4))
        x, y = torch.randn(4, 3, 12, 12), torch.randint(0, 4, (4,))
    model.eval()  # dropout off, so both devices compute the same function
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    results = {}
    for device in ("cpu", "mydev"):
        model.load_state_dict(ref)
        m = model.to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        my_device.reset_fallback_counts()
        monkeypatch.setenv("MYDEV_FALLBACK", "error")
        for _ in range(2):
            loss = torch.nn.functional.cross_entropy(m(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        monkeypatch.delenv("MYDEV_FALLBACK")
        results[device] = (loss.item(), {k: v.detach().cpu().clone() for k, v in m.state_dict().items()})
        assert my_device.fallback_counts() == {}
    assert results["mydev"][0] == pytest.approx(results["cpu"][0], rel=1e-5)
    torch.testing.assert_close(results["mydev"][1], results["cpu"][1])
