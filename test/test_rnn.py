"""Recurrent layers and cells on mydev against the CPU: the fused LSTM/GRU cell kernels
(csrc/native/RNN.cpp) in every layout, trained for 3 steps."""
import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import my_device

pytestmark = pytest.mark.usefixtures("kernel_threads")  # (the tests compare bits with the CPU's)

IN, HID, BATCH, SEQ = 5, 4, 3, 6

LAYOUTS = {
    "plain": {},
    "batch_first": {"batch_first": True},
    "bidirectional": {"bidirectional": True},
    "two_layers": {"num_layers": 2},
    "deep_bidir_batch_first": {"num_layers": 2, "bidirectional": True, "batch_first": True},
    "no_bias": {"bias": False},
}
MODULES = {
    "LSTM": lambda **kw: nn.LSTM(IN, HID, **kw),
    "GRU": lambda **kw: nn.GRU(IN, HID, **kw),
    "RNN_tanh": lambda **kw: nn.RNN(IN, HID, **kw),
    "RNN_relu": lambda **kw: nn.RNN(IN, HID, nonlinearity="relu", **kw),
}


def _initial_state(module, kind, batch, g):
    layers = module.num_layers * (2 if module.bidirectional else 1)
    out = module.proj_size if getattr(module, "proj_size", 0) else module.hidden_size
    h0 = torch.randn(layers, batch, out, generator=g)
    if kind == "LSTM":
        return h0, torch.randn(layers, batch, module.hidden_size, generator=g)
    return h0


def _to(state, device):
    if state is None:
        return None
    if isinstance(state, tuple):
        return tuple(s.to(device) for s in state)
    return state.to(device)


def _train(module, device, batches, packed=False, with_state=False, kind="LSTM"):
    module = copy.deepcopy(module).to(device)
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    outputs = []
    for x, lengths, state in batches:
        opt.zero_grad()
        x = x.to(device)
        if packed:
            x = pack_padded_sequence(x, lengths, batch_first=module.batch_first, enforce_sorted=False)
        out, hidden = module(x, _to(state, device) if with_state else None)
        if packed:
            out, _ = pad_packed_sequence(out, batch_first=module.batch_first)
        hidden = hidden if isinstance(hidden, tuple) else (hidden,)
        loss = out.pow(2).mean() + sum(h.sin().mean() for h in hidden)
        loss.backward()
        opt.step()
        outputs.append((out.detach().cpu(), loss.item()))
    return outputs, {n: p.detach().cpu() for n, p in module.named_parameters()}


def _batches(module, kind, g, steps=3):
    shape = (BATCH, SEQ, IN) if module.batch_first else (SEQ, BATCH, IN)
    return [(torch.randn(*shape, generator=g), torch.tensor([SEQ, 2, 4]), _initial_state(module, kind, BATCH, g))
            for _ in range(steps)]


def _check_like_cpu(module, kind, **kw):
    g = torch.Generator().manual_seed(0)
    batches = _batches(module, kind, g)
    my_device.reset_fallback_counts()
    dev_out, dev_params = _train(module, "mydev", batches, kind=kind, **kw)
    assert my_device.fallback_counts() == {}
    cpu_out, cpu_params = _train(module, "cpu", batches, kind=kind, **kw)
    for (d, dl), (c, cl) in zip(dev_out, cpu_out):
        torch.testing.assert_close(d, c)
        torch.testing.assert_close(dl, cl)
    for name in cpu_params:
        torch.testing.assert_close(dev_params[name], cpu_params[name], msg=name)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", MODULES)
def test_recurrent_layer_trains_like_cpu(kind, layout):
    torch.manual_seed(1)
    _check_like_cpu(MODULES[kind](**LAYOUTS[layout]), kind, with_state=layout in ("plain", "two_layers"))


@pytest.mark.parametrize("kind", MODULES)
@pytest.mark.parametrize("batch_first", [False, True])
def test_packed_sequences_train_like_cpu(kind, batch_first):
    torch.manual_seed(2)
    module = MODULES[kind](num_layers=2, bidirectional=True, batch_first=batch_first)
    _check_like_cpu(module, kind, packed=True, with_state=True)


def test_lstm_projection_trains_like_cpu():
    torch.manual_seed(3)
    _check_like_cpu(nn.LSTM(IN, HID, proj_size=2, num_layers=2, bidirectional=True), "LSTM", with_state=True)


CELLS = {
    "LSTMCell": lambda bias: nn.LSTMCell(IN, HID, bias=bias),
    "GRUCell": lambda bias: nn.GRUCell(IN, HID, bias=bias),
    "RNNCell": lambda bias: nn.RNNCell(IN, HID, bias=bias),
}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("kind", CELLS)
def test_cell_trains_like_cpu(kind, with_state, bias):
    torch.manual_seed(4)
    cell = CELLS[kind](bias)
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(4, BATCH, IN, generator=g) for _ in range(3)]
    h0 = torch.randn(BATCH, HID, generator=g)
    c0 = torch.randn(BATCH, HID, generator=g)

    def train(device):
        m = copy.deepcopy(cell).to(device)
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)
        losses = []
        for x in xs:
            opt.zero_grad()
            state = None
            if with_state:
                state = (h0.to(device), c0.to(device)) if kind == "LSTMCell" else h0.to(device)
            loss = 0
            for step in x.to(device):
                state = m(step, state)
                h = state[0] if kind == "LSTMCell" else state
                loss = loss + h.pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, {n: p.detach().cpu() for n, p in m.named_parameters()}

    my_device.reset_fallback_counts()
    dev_losses, dev_params = train("mydev")
    assert my_device.fallback_counts() == {}
    cpu_losses, cpu_params = train("cpu")
    torch.testing.assert_close(dev_losses, cpu_losses)
    for name in cpu_params:
        torch.testing.assert_close(dev_params[name], cpu_params[name], msg=name)


def test_lstm_cell_gradient_of_cell_state_only():
    # Only cy receives a gradient: the backward op gets no grad_hy.
    torch.manual_seed(6)
    cell = nn.LSTMCell(IN, HID)
    x, h0, c0 = torch.randn(BATCH, IN), torch.randn(BATCH, HID), torch.randn(BATCH, HID)
    grads = {}
    for device in ("cpu", "mydev"):
        m = copy.deepcopy(cell).to(device)
        hx = (h0.detach().to(device).requires_grad_(), c0.detach().to(device).requires_grad_())
        _, c = m(x.to(device), hx)
        c.sum().backward()
        grads[device] = [hx[0].grad, hx[1].grad] + [p.grad for p in m.parameters()]
    for d, c in zip(grads["mydev"], grads["cpu"]):
        torch.testing.assert_close(d.cpu(), c)


@pytest.mark.parametrize("cell", [nn.LSTMCell, nn.GRUCell])
def test_cell_double_backward(cell):
    torch.manual_seed(7)
    m = cell(3, 2).double().to("mydev")
    x = torch.randn(2, 3, dtype=torch.float64, device="mydev", requires_grad=True)
    h = torch.randn(2, 2, dtype=torch.float64, device="mydev", requires_grad=True)
    state = (h, torch.randn(2, 2, dtype=torch.float64, device="mydev")) if cell is nn.LSTMCell else h

    def f(x, h):
        out = m(x, (h, state[1]) if cell is nn.LSTMCell else h)
        return out[0] + out[1] if cell is nn.LSTMCell else out

    assert torch.autograd.gradcheck(f, (x, h))
    assert torch.autograd.gradgradcheck(f, (x, h))


def test_fused_cell_rejects_bad_input_and_device_keeps_working():
    gates = torch.randn(3, 8, device="mydev")
    cx = torch.randn(3, 2, device="mydev")
    with pytest.raises(RuntimeError, match="_thnn_fused_lstm_cell: the state must have shape"):
        torch.ops.aten._thnn_fused_lstm_cell(gates, gates, torch.randn(3, 3, device="mydev"))
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.ops.aten._thnn_fused_lstm_cell(gates, gates.double(), cx)
    with pytest.raises(RuntimeError, match="input_gates has shape"):
        torch.ops.aten._thnn_fused_gru_cell(torch.randn(3, 6, device="mydev"), torch.randn(3, 3, device="mydev"), cx)
    with pytest.raises(RuntimeError, match="both be given or both be None"):
        torch.ops.aten._thnn_fused_gru_cell(torch.randn(3, 6, device="mydev"), torch.randn(3, 6, device="mydev"), cx,
                                   torch.randn(6, device="mydev"))
    hy, cy, _ = torch.ops.aten._thnn_fused_lstm_cell(gates, gates, cx)
    i, f, g, o = (2 * gates.cpu()).chunk(4, 1)
    c_ref = f.sigmoid() * cx.cpu() + i.sigmoid() * g.tanh()
    torch.testing.assert_close(cy.cpu(), c_ref)
    torch.testing.assert_close(hy.cpu(), o.sigmoid() * c_ref.tanh())


@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_sequences_of_one_length_give_the_cpus_bits(bidirectional):
    # The CPU sends a packed batch whose sequences all have one length to oneDNN as a padded batch, and so does
    # mydev; packed sequences of several lengths take the cells on both (test_packed_sequences_train_like_cpu).
    torch.manual_seed(0)
    cpu = nn.LSTM(16, 32, num_layers=2, bidirectional=bidirectional)
    dev = copy.deepcopy(cpu).to("mydev")
    x = torch.randn(6, 4, 16, requires_grad=True)
    xd = x.detach().to("mydev").requires_grad_()
    outputs = []
    for module, inputs in ((cpu, x), (dev, xd)):
        out, (h, c) = module(pack_padded_sequence(inputs, [6, 6, 6, 6]))
        (out.data.sum() + 2 * h.sum() + c.sum()).backward()
        outputs.append([out.data, h, c, inputs.grad] + [p.grad for p in module.parameters()])
    for want, got in zip(*outputs):
        assert torch.equal(got.detach().cpu(), want.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("options", [{}, {"bidirectional": True, "batch_first": True}, {"bias": False, "num_layers": 3}])
def test_lstm_gives_the_cpus_bits(dtype, options):
    # The CPU runs nn.LSTM with oneDNN's fused LSTM (float32, and bfloat16 where the CPU has it);
    # mydev takes the same path (native/RNN.cpp), so forward, backward and gradients are bit for bit.
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has no bfloat16 oneDNN LSTM: the CPU takes ATen's cells")
    torch.manual_seed(0)
    cpu = nn.LSTM(16, 32, **{"num_layers": 2, **options}).to(dtype)
    dev = copy.deepcopy(cpu).to("mydev")
    x = torch.randn(3, 5, 16, dtype=dtype, requires_grad=True)
    xd = x.detach().to("mydev").requires_grad_()
    (o, (h, c)), (od, (hd, cd)) = cpu(x), dev(xd)
    (o.sum() + h.sum() + c.sum()).backward()
    (od.sum() + hd.sum() + cd.sum()).backward()
    for got, want in [(od, o), (hd, h), (cd, c), (xd.grad, x.grad)]:
        assert torch.equal(got.detach().cpu(), want.detach())
    for p, q in zip(dev.parameters(), cpu.parameters()):
        assert torch.equal(p.grad.cpu(), q.grad)
    with torch.no_grad():  # (oneDNN's inference primitive: the CPU kernel reads grad mode)
        for _ in range(2):  # the second call is queued
            assert torch.equal(dev(xd)[0].cpu(), cpu(x)[0])
