"""Where mydev's backward runs: on the thread that calls backward(), as CPU's does (csrc/core/AutogradThread.cpp)."""
import os
import subprocess
import sys
import threading

import torch
from torch import nn


def _backward_thread_and_grads(device):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)).to(device)
    x = torch.randn(4, 8).to(device).requires_grad_()
    seen = []
    x.register_hook(lambda g: seen.append(threading.get_ident()))
    m(x).square().sum().backward()
    return seen[0], [p.grad.cpu() for p in m.parameters()] + [x.grad.cpu()]


def test_backward_runs_on_calling_thread_with_cpu_gradients():
    ident, grads = _backward_thread_and_grads("mydev")
    assert ident == threading.get_ident()
    _, expected = _backward_thread_and_grads("cpu")
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)


def test_new_thread_runs_its_backward_itself():
    out = {}

    def work():
        out["ident"], out["grads"] = _backward_thread_and_grads("mydev")
        out["me"] = threading.get_ident()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out["ident"] == out["me"]


def test_engine_still_sends_privateuse1_nodes_to_its_device_thread():
    # The workaround exists because the engine gives a backend no per-device
    # opt-out. With PyTorch's default restored, mydev's nodes must still run on
    # the engine's device thread; when this fails, PyTorch changed that and
    # AutogradThread.cpp can go.
    with torch.autograd.set_multithreading_enabled(True):
        ident, grads = _backward_thread_and_grads("mydev")
    assert ident != threading.get_ident()
    _, expected = _backward_thread_and_grads("cpu")
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)


def test_side_stream_forward_backward_matches_cpu():
    torch.manual_seed(0)
    a = torch.randn(64, 64)
    ad = a.to("mydev").requires_grad_()
    s = torch.mydev.Stream()
    with torch.mydev.stream(s):
        y = (ad.tanh() @ ad).sum()
        y.backward()
    s.synchronize()
    ac = a.clone().requires_grad_()
    (ac.tanh() @ ac).sum().backward()
    torch.testing.assert_close(ad.grad.cpu(), ac.grad, rtol=1e-4, atol=1e-4)


def test_env_keeps_pytorch_default():
    code = ("import threading, torch, my_device; from torch import nn\n"
            "x = torch.randn(3, device='mydev', requires_grad=True); seen = []\n"
            "x.register_hook(lambda g: seen.append(threading.get_ident()))\n"
            "(x * 2).sum().backward()\n"
            "print(seen[0] != threading.get_ident(), x.grad.cpu().tolist())\n")
    env = dict(os.environ, MYDEV_AUTOGRAD_DEVICE_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "[2.0,", "2.0,", "2.0]"]
