"""Lazy tensors on mydev (my_device.lazy): traced graphs run as mydev programs; against eager mydev."""
import copy

import pytest
import torch
import torch._lazy
from torch import nn

import my_device
import my_device.lazy as ml

from test_compiler import _models

ml.init()


def test_a_traced_graph_runs_on_device_data():
    torch.manual_seed(3)
    expected = torch.randn(3, device="mydev") + 1
    torch.manual_seed(3)
    y = torch.randn(3, device="lazy") + 1
    torch._lazy.mark_step()
    data = ml.device_data(y)
    assert data is not None and data.device.type == "mydev"
    torch.testing.assert_close(data, expected)
    torch.testing.assert_close(y.to("mydev"), expected)
    assert "aten::add" in ml.last_graph()


def test_moves_between_lazy_mydev_and_cpu():
    a = torch.arange(6.0, device="mydev").reshape(2, 3)
    lazy = a.to("lazy") * 2
    torch.testing.assert_close(lazy.to("mydev"), a * 2)
    torch.testing.assert_close(lazy.cpu(), (a * 2).cpu())
    torch.testing.assert_close(torch.ones(2).to("lazy").to("mydev"), torch.ones(2, device="mydev"))


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_training_matches_eager_and_steady_state_compiles_nothing(name):
    model, make_input = _models()[name]
    lazy_model = copy.deepcopy(model).to("lazy")
    eager = model.to("mydev")
    opt_e = torch.optim.SGD(eager.parameters(), lr=1e-2, momentum=0.9)
    opt_l = torch.optim.SGD(lazy_model.parameters(), lr=1e-2, momentum=0.9)
    my_device.reset_fallback_counts()
    for step in range(5):
        x = make_input()
        for m, opt, dev in ((eager, opt_e, "mydev"), (lazy_model, opt_l, "lazy")):
            opt.zero_grad()
            (m(x.to(dev)) ** 2).mean().backward()
            opt.step()
        torch._lazy.mark_step()
        if step == 1:
            before = ml.metrics()
    after = ml.metrics()
    for p, q in zip(lazy_model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.to("mydev"), q, rtol=1e-4, atol=1e-5)
    assert after["graphs_compiled"] == before["graphs_compiled"]  # steps 3-5 reuse the programs
    views = [op for op in my_device.fallback_counts()
             if any(v in op for v in ("view", "as_strided", "expand", "permute", "transpose", "slice", "select"))]
    assert views == []
    # one graph per step, nothing falls back (the transformer's safe softmax traces: csrc/lazy/Decompositions.cpp)
    assert after["executions"] - before["executions"] == 3
    assert after["fallback_ops"] == before["fallback_ops"]


def test_bad_shape_raises_at_trace_time_and_loses_nothing():
    keep = torch.ones(2, 2, device="lazy") * 3
    with pytest.raises(RuntimeError, match="cannot be multiplied|size mismatch|shapes"):
        torch.randn(3, 4, device="lazy") @ torch.randn(5, 6, device="lazy")
    torch._lazy.mark_step()
    torch.testing.assert_close(keep.to("mydev"), torch.full((2, 2), 3.0, device="mydev"))


def test_metrics_report_the_work():
    m = ml.metrics()
    for key in ("graphs_compiled", "cache_hits", "executions", "fallback_ops", "transfer_bytes"):
        assert key in m
    before = m["transfer_bytes"]
    torch.ones(256).to("lazy").add_(1)
    torch._lazy.mark_step()
    assert ml.metrics()["transfer_bytes"] >= before + 256 * 4
