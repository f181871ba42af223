"""Pinned host memory and transfers from and to it."""
import torch
from torch.utils.data import DataLoader, TensorDataset


def test_pin_memory_and_is_pinned():
    x = torch.randn(10)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned() and p.device.type == "cpu"
    torch.testing.assert_close(p, x)
    s = torch.randn(4).untyped_storage().pin_memory()
    assert s.is_pinned()
    assert torch.empty(5, pin_memory=True).is_pinned()


def test_non_blocking_copies_through_pinned_memory():
    x = torch.randn(1 << 16).pin_memory()
    d = x.to("mydev", non_blocking=True)
    back = torch.empty_like(x).pin_memory()
    back.copy_(d * 2, non_blocking=True)
    torch.mydev.synchronize()
    torch.testing.assert_close(back, x * 2)


def test_dataloader_pin_memory():
    data = TensorDataset(torch.arange(20.0).reshape(10, 2), torch.arange(10))
    loader = DataLoader(data, batch_size=4, pin_memory=True)
    seen = []
    for xb, yb in loader:
        assert xb.is_pinned() and yb.is_pinned()
        seen.append(xb.to("mydev", non_blocking=True).sum().item())
    assert seen == [t.sum().item() for t in torch.arange(20.0).reshape(10, 2).split(4)]
