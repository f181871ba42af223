"""nn.DataParallel over mydev devices (my_device/_data_parallel.py), against the CPU and one device."""
import copy
import warnings

import pytest
import torch
from torch import nn
from torch.nn.parallel import comm


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def _train(model, steps=3):
    device = next(model.parameters()).device
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_data_parallel_on_one_device_trains_as_the_cpu_module():
    cpu = _model()
    want = _train(cpu)
    module = _model().to("mydev:0")
    got = _train(nn.DataParallel(module, device_ids=[0]))
    torch.testing.assert_close(got, want)
    for p, q in zip(module.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach())
    for b, c in zip(module.buffers(), cpu.buffers()):
        torch.testing.assert_close(b.cpu(), c)


def test_two_devices_equal_one_without_batch_statistics():
    # (With BatchNorm each replica would normalise its half of the batch, on CUDA too.)
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    one = copy.deepcopy(base).to("mydev:0")
    two = copy.deepcopy(base).to("mydev:0")
    want = _train(copy.deepcopy(base))
    torch.testing.assert_close(_train(nn.DataParallel(one, device_ids=[0])), want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (torch's reduce_add warns of missing NCCL on every call)
        torch.testing.assert_close(_train(nn.DataParallel(two, device_ids=[0, 1])), want)
    for p, q in zip(two.parameters(), one.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu())


def test_comm_functions_follow_cuda_semantics():
    x = torch.arange(12.0).reshape(6, 2)
    d = x.to("mydev:0")
    copies = comm.broadcast(d, [0, 1])
    assert copies[0] is d and copies[1].device == torch.device("mydev:1")
    torch.testing.assert_close(copies[1].cpu(), x)
    parts = comm.scatter(d, [0, 1], chunk_sizes=[2, 4])
    assert [p.device.index for p in parts] == [0, 1] and parts[0].data_ptr() == d.data_ptr()
    torch.testing.assert_close(torch.cat([p.cpu() for p in parts]), x)
    with pytest.raises(RuntimeError, match="Expected chunk sizes to sum to 6"):
        comm.scatter(d, [0, 1], chunk_sizes=[2, 2])
    gathered = comm.gather(parts, 0, destination=1)
    assert gathered.device == torch.device("mydev:1")
    torch.testing.assert_close(gathered.cpu(), x)
    assert comm.gather(parts, 0, destination=-1).device.type == "cpu"
    coalesced = comm.broadcast_coalesced([d, d.long()], [0, 1])
    assert coalesced[0][0] is d and [t.device.index for t in coalesced[1]] == [1, 1]
    assert coalesced[1][1].dtype == torch.int64
    torch.testing.assert_close(coalesced[1][1].cpu(), x.long())
    total = comm.reduce_add([d, copies[1]], destination=1)
    assert total.device == torch.device("mydev:1")
    torch.testing.assert_close(total.cpu(), 2 * x)


def test_cpu_torch_still_lacks_the_comm_bindings():
    # my_device/_data_parallel.py stands in for these; once a CPU build has them for
    # every device, the module can go.
    assert not hasattr(torch._C, "_scatter") and not hasattr(torch._C, "_broadcast_coalesced")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_replicas_run_in_the_callers_autocast_region(dtype):
    # Each replica computes in the caller's autocast dtype, as the module on one device does.
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to("mydev")
    x = torch.randn(6, 8, device="mydev")
    with torch.autocast("mydev", dtype=dtype):
        want = module(x)
        got = nn.DataParallel(module, device_ids=[0, 1])(x)
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=0)


def test_torch_replicas_still_run_outside_mydev_autocast():
    # my_device/_data_parallel.py reopens the caller's mydev autocast region in each replica; once torch's
    # parallel_apply does so by itself, the wrapper can go.
    from my_device import _patches
    from torch.nn.parallel.data_parallel import parallel_apply

    module = nn.Linear(4, 4).to("mydev")
    with torch.autocast("mydev", dtype=torch.bfloat16):
        (out,) = _patches.original(parallel_apply)([module], [(torch.randn(2, 4, device="mydev"),)], None, [0])
    assert out.dtype == torch.float32
