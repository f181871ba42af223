"""Sparse layouts on mydev: COO and compressed (CSR, CSC, BSR, BSC) tensors whose members live on the device.

Every aten op with a SparseCPU or SparseCsrCPU kernel runs as a host kernel
(csrc/native/Sparse.h): each result is compared with the same computation on CPU.
"""
import pytest
import torch

import my_device

HOST_KERNEL, OWN_KERNEL, EXCLUDED, SPARSE_HOST_KERNEL, QUANTIZED_HOST_KERNEL = my_device._C._host_kernel_coverage()


@pytest.fixture(autouse=True)
def no_copying_fallback(monkeypatch):
    monkeypatch.setenv("MYDEV_FALLBACK", "error")


def _dense(seed=0, shape=(5, 6)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x[x.abs() < 0.8] = 0  # about half the elements
    return x


def _members(t):
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.crow_indices(), t.col_indices(), t.values()]
    return [t.ccol_indices(), t.row_indices(), t.values()]


def _assert_same_sparse(actual, expected):
    assert actual.layout == expected.layout and actual.device.type == "mydev"
    assert all(m.device == actual.device for m in _members(actual))
    torch.testing.assert_close(actual.cpu().to_dense(), expected.to_dense(), rtol=0, atol=0)


def test_every_sparse_cpu_op_has_a_mydev_kernel():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for cpu_key, mydev_key in (("SparseCPU", "SparsePrivateUse1"), ("SparseCsrCPU", "SparseCsrPrivateUse1")):
        ops = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::") and has(n, cpu_key)]
        assert ops, cpu_key
        excluded = dict(EXCLUDED)  # (pinning: host memory only)
        assert [n for n in ops if not has(n, mydev_key) and n not in excluded] == []
    assert "aten::add.out" in SPARSE_HOST_KERNEL and "aten::_nnz" in SPARSE_HOST_KERNEL


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr,
                                    torch.sparse_bsc])
def test_layouts_move_to_and_from_mydev_and_convert_there(layout):
    x = _dense(shape=(4, 6))
    blocks = {"blocksize": (2, 2)} if layout in (torch.sparse_bsr, torch.sparse_bsc) else {}
    cpu = x.to_sparse(layout=layout, **blocks)
    moved = cpu.to("mydev")
    _assert_same_sparse(moved, cpu)
    # converted on the device, from a dense mydev tensor
    _assert_same_sparse(x.to("mydev").to_sparse(layout=layout, **blocks), cpu)
    assert torch.equal(moved.to_dense().cpu(), x)
    assert moved.to_dense().device.type == "mydev"


def test_coo_ops_match_cpu():
    a, b = _dense(1), _dense(2)
    sa, sb = a.to_sparse(), b.to_sparse()
    da, db = sa.to("mydev"), sb.to("mydev")
    _assert_same_sparse(da + db, sa + sb)
    _assert_same_sparse(da * db, sa * sb)
    _assert_same_sparse((da + db).coalesce(), (sa + sb).coalesce())
    assert (da + db).coalesce().is_coalesced()
    _assert_same_sparse(torch.sparse.sum(da, dim=0), torch.sparse.sum(sa, dim=0))
    w = torch.randn(6, 3)
    torch.testing.assert_close(torch.sparse.mm(da, w.to("mydev")).cpu(), torch.sparse.mm(sa, w))
    torch.testing.assert_close(torch.sparse.addmm(torch.ones(5, 3, device="mydev"), da, w.to("mydev")).cpu(),
                               torch.sparse.addmm(torch.ones(5, 3), sa, w))
    assert da._nnz() == sa._nnz() and da.sparse_dim() == 2 and da.dense_dim() == 0


def test_in_place_sparse_ops_update_the_mydev_tensor():
    a, b = _dense(3), _dense(4)
    da = a.to_sparse().to("mydev")
    before = id(da)
    da.add_(b.to_sparse().to("mydev"))  # the kernel gives da new indices and values
    assert id(da) == before
    _assert_same_sparse(da, a.to_sparse() + b.to_sparse())
    da.mul_(2)
    torch.testing.assert_close(da.to_dense().cpu(), 2 * (a + b))


def test_csr_ops_match_cpu():
    x = _dense(5)
    csr = x.to_sparse_csr()
    d = csr.to("mydev")
    m1, m2 = torch.randn(5, 4), torch.randn(4, 6)
    expected = torch.sparse.sampled_addmm(csr, m1, m2, beta=0.5, alpha=2.0)
    _assert_same_sparse(torch.sparse.sampled_addmm(d, m1.to("mydev"), m2.to("mydev"), beta=0.5, alpha=2.0), expected)
    v = torch.randn(6)
    torch.testing.assert_close((d @ v.to("mydev")).cpu(), csr @ v)
    _assert_same_sparse(d.to_sparse_coo(), csr.to_sparse_coo())


def test_gradients_through_sparse_match_cpu():
    x = _dense(6)
    w = torch.randn(6, 3)
    grads = {}
    for device in ("cpu", "mydev"):
        xd = x.detach().to(device).requires_grad_()
        wd = w.detach().to(device).requires_grad_()
        out = torch.sparse.mm(xd.to_sparse(), wd)
        out.pow(2).sum().backward()
        grads[device] = (xd.grad.cpu(), wd.grad.cpu())
    torch.testing.assert_close(grads["mydev"], grads["cpu"])


def test_sparse_arguments_on_another_device_are_rejected_and_nothing_is_lost():
    d = _dense(7).to_sparse().to("mydev")
    with pytest.raises(RuntimeError, match="device"):
        d + _dense(8).to_sparse()  # a CPU sparse tensor
    _assert_same_sparse(d, _dense(7).to_sparse())
    _assert_same_sparse(d + d, _dense(7).to_sparse() * 2)
