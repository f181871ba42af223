"""Concurrency and leaks: many threads on both devices, and long training loops."""
import threading

import torch
from torch import nn


def test_eight_threads_two_devices_match_cpu():
    errors = []

    def worker(tid: int):
        try:
            device = f"mydev:{tid % 2}"
            g = torch.Generator().manual_seed(tid)
            x_cpu = torch.randn(64, generator=g)
            w_cpu = torch.randn(64, 64, generator=g)
            x, w = x_cpu.to(device), w_cpu.to(device)
            for i in range(1000):
                op = i % 4
                if op == 0:
                    x, x_cpu = x * 0.5 + 1, x_cpu * 0.5 + 1
                elif op == 1:
                    x, x_cpu = torch.tanh(w @ x), torch.tanh(w_cpu @ x_cpu)
                elif op == 2:
                    x, x_cpu = x - x.mean(), x_cpu - x_cpu.mean()
                else:
                    x, x_cpu = torch.relu(x).add_(0.1), torch.relu(x_cpu).add_(0.1)
            assert x.device == torch.device(device)
            torch.testing.assert_close(x.cpu(), x_cpu, rtol=1e-4, atol=1e-5)
        except Exception as e:  # surfaced in the main thread below
            errors.append((tid, repr(e)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_ten_thousand_steps_leave_no_leak():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to("mydev")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8, device="mydev")
    y = torch.randint(0, 2, (4,), device="mydev")

    def step():
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step()  # grads and optimizer state now exist; what remains is per-step temporaries
    torch.mydev.synchronize()
    baseline = torch.mydev.memory_allocated()
    reserved = torch.mydev.memory_reserved()
    for _ in range(10_000):
        step()
    torch.mydev.synchronize()
    assert torch.mydev.memory_allocated() == baseline
    assert torch.mydev.memory_reserved() == reserved  # everything came from the cache
