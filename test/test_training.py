"""Whole workloads on mydev against the same workloads on CPU: training, torch.compile, serialization."""
import copy
import io

import pytest
import torch
from torch import nn

import my_device


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3), nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    )


def _train(model, device, make_opt, steps, data):
    model = copy.deepcopy(model).to(device)
    opt = make_opt(model.parameters())
    losses = []
    for x, y in data[:steps]:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("optimizer", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=1e-2),
    lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
], ids=["sgd", "adam", "adamw-fused"])
def test_mlp_trains_like_cpu(optimizer):
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(5)]
    model = _mlp()
    cpu_losses, cpu_state = _train(model, "cpu", optimizer, 5, data)
    dev_losses, dev_state = _train(model, "mydev", optimizer, 5, data)
    torch.testing.assert_close(dev_losses, cpu_losses)
    assert cpu_losses[-1] < cpu_losses[0]
    for k in cpu_state:
        torch.testing.assert_close(dev_state[k], cpu_state[k], msg=k)


def test_cnn_trains_like_cpu():
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 5, (4,), generator=g)) for _ in range(3)]
    model = _cnn()
    opt = lambda p: torch.optim.SGD(p, lr=0.05)
    cpu_losses, cpu_state = _train(model, "cpu", opt, 3, data)
    dev_losses, dev_state = _train(model, "mydev", opt, 3, data)
    torch.testing.assert_close(dev_losses, cpu_losses, rtol=1e-5, atol=1e-5)
    for k in cpu_state:
        torch.testing.assert_close(dev_state[k], cpu_state[k], rtol=1e-4, atol=1e-5, msg=k)


def test_training_step_uses_no_copying_fallback():
    my_device.reset_fallback_counts()
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g))]
    _train(_mlp(), "mydev", lambda p: torch.optim.Adam(p, lr=1e-2), 1, data)
    _train(_cnn(), "mydev", lambda p: torch.optim.SGD(p, lr=0.1), 1,
           [(torch.randn(2, 3, 8, 8, generator=g), torch.randint(0, 5, (2,), generator=g))])
    assert my_device.fallback_counts() == {}


def test_dropout_is_reproducible_and_independent_of_cpu_generator():
    x = torch.ones(1000, device="mydev")
    torch.manual_seed(5)
    cpu_before = torch.get_rng_state()
    a = nn.functional.dropout(x, 0.5)
    assert torch.equal(torch.get_rng_state(), cpu_before)  # mydev draws never move the CPU generator
    torch.manual_seed(5)
    b = nn.functional.dropout(x, 0.5)
    torch.testing.assert_close(a.cpu(), b.cpu())           # same seed, same mask
    kept = a.cpu() != 0
    assert 350 < kept.sum().item() < 650
    torch.testing.assert_close(a.cpu()[kept], torch.full((int(kept.sum()),), 2.0))
    c = nn.functional.dropout(x, 0.5)
    assert not torch.equal(a.cpu(), c.cpu())               # the generator advanced
    torch.manual_seed(6)
    torch.rand(100, device="mydev")
    p = torch.rand(3)
    torch.manual_seed(6)
    q = torch.rand(3)
    torch.testing.assert_close(p, q)


def test_compile_eager_backend_and_fake_tensor():
    def fn(a, b):
        return torch.relu(a @ b + 1).sum(dim=0)

    a = torch.randn(4, 5, device="mydev")
    b = torch.randn(5, 3, device="mydev")
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(a, b).cpu(), fn(a.cpu(), b.cpu()))

    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fa = mode.from_tensor(a)
        fb = mode.from_tensor(b)
        out = fn(fa, fb)
    assert out.shape == (3,) and out.device == a.device


def test_save_load_keeps_view_sharing_and_map_location():
    base = torch.arange(12.0, device="mydev")
    state = {"base": base, "view": base[2:6], "other": torch.ones(2, device="mydev:1")}
    buf = io.BytesIO()
    torch.save(state, buf)

    buf.seek(0)
    loaded = torch.load(buf)
    assert loaded["base"].device == torch.device("mydev:0")
    assert loaded["other"].device == torch.device("mydev:1")
    assert my_device.impl_type_name(loaded["base"]) == "my_device::MyDevTensorImpl"
    assert torch._C._is_alias_of(loaded["base"], loaded["view"])
    loaded["view"].fill_(-1)
    assert loaded["base"][2].item() == -1.0
    torch.testing.assert_close(loaded["other"].cpu(), torch.ones(2))

    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert on_cpu["base"].device.type == "cpu"
    torch.testing.assert_close(on_cpu["base"], torch.arange(12.0))
    assert torch._C._is_alias_of(on_cpu["base"], on_cpu["view"])
