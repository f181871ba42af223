"""Module conversion keeps Parameter objects, ties and optimizers across mydev, as on CUDA
(my_device/_module_conversion.py), and changes nothing for other devices."""
import copy
import warnings
import weakref

import pytest
import torch
from torch import nn

import my_device
from my_device import _module_conversion


def test_torch_still_excludes_privateuse1_from_shallow_copy():
    # The reason for my_device/_module_conversion.py. When this fails, torch counts
    # PrivateUse1 as a dense backend in TensorImpl::has_compatible_shallow_copy_type:
    # nn.Module._apply then assigns `.data` across mydev itself, and the workaround
    # must be re-examined (a `.data =` into a CPU TensorImpl cannot make a MyDevTensorImpl).
    cpu, dev = torch.zeros(2), torch.zeros(2, device="mydev")
    assert not torch._has_compatible_shallow_copy_type(cpu, dev)
    assert not torch._has_compatible_shallow_copy_type(dev, cpu)
    assert torch._has_compatible_shallow_copy_type(dev, dev.double())
    # Without the workaround, PyTorch's own _apply replaces the Parameter.
    lin = nn.Linear(2, 2)
    before = lin.weight
    _module_conversion._torch_apply(lin, lambda t: t.to("mydev"))
    assert lin.weight is not before and lin.weight.device.type == "mydev"


def test_installed():
    assert nn.Module._apply is _module_conversion._apply


def _tied():
    torch.manual_seed(0)
    a, b = nn.Linear(6, 6), nn.Linear(6, 6)
    b.weight = a.weight
    return nn.Sequential(a, nn.Tanh(), b)


@pytest.mark.parametrize("convert", [
    lambda m: m.to("mydev"), lambda m: m.mydev(), lambda m: m.to(torch.device("mydev", 0)),
], ids=["to", "mydev", "to-device"])
def test_tie_and_identity_kept(convert):
    m = _tied()
    params = list(m.parameters())
    w = m[0].weight
    assert convert(m) is m
    assert m[0].weight is w and m[2].weight is w
    assert w.device.type == "mydev" and isinstance(w, nn.Parameter) and w.requires_grad
    assert len(list(m.parameters())) == len(params) and all(p is q for p, q in zip(m.parameters(), params))
    assert all(p.device.type == "mydev" for p in params)
    # Back to the CPU, then a dtype change on mydev: still the same objects.
    m.to("cpu")
    assert m[0].weight is w and m[2].weight is w and w.device.type == "cpu"
    m.to("mydev").to(torch.float64)
    assert m[0].weight is w and w.dtype == torch.float64 and w.device.type == "mydev"
    assert all(p1 is p2 for p1, p2 in zip(m.parameters(), params))


def test_grad_moves_with_the_parameter():
    m = _tied()
    m(torch.randn(3, 6)).sum().backward()
    w, g = m[0].weight, m[0].weight.grad.clone()
    m.to("mydev")
    assert m[0].weight is w and w.grad.device.type == "mydev"
    torch.testing.assert_close(w.grad.cpu(), g)
    # A step of an optimizer over the moved module updates the tied weight once.
    before = w.detach().cpu().clone()
    torch.optim.SGD(m.parameters(), lr=1.0).step()
    torch.testing.assert_close(m[2].weight.detach().cpu(), before - g)


def _adamw_steps(model, device, steps, data, move_after_optimizer):
    model = copy.deepcopy(model)
    if move_after_optimizer:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model.to(device)
    else:
        model.to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x in data[:steps]:
        opt.zero_grad()
        loss = model(x.to(device)).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def test_optimizer_built_before_conversion_trains_tied_model():
    g = torch.Generator().manual_seed(3)
    data = [torch.randn(4, 6, generator=g)] * 5  # one batch: the loss must fall
    ref_losses, ref = _adamw_steps(_tied(), "cpu", 5, data, move_after_optimizer=False)
    losses, dev = _adamw_steps(_tied(), "mydev", 5, data, move_after_optimizer=True)
    assert dev[0].weight is dev[2].weight
    torch.testing.assert_close(losses, ref_losses)
    assert ref_losses[-1] < ref_losses[0]
    for (name, p), (_, q) in zip(ref.named_parameters(), dev.named_parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), msg=name)


def _gpt2():
    import transformers  # a test requirement (requirements.txt)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=32,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def test_gpt2_tie_trains_like_cpu():
    model = _gpt2()
    assert model.lm_head.weight is model.transformer.wte.weight
    g = torch.Generator().manual_seed(4)
    data = [torch.randint(0, 97, (2, 12), generator=g)] * 5  # one batch: the loss must fall

    def train(device):
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)  # built before the move
        m.to(device)
        assert m.lm_head.weight is m.transformer.wte.weight
        losses = []
        for ids in data:
            opt.zero_grad()
            ids = ids.to(device)
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, m

    cpu_losses, cpu_model = train("cpu")
    dev_losses, dev_model = train("mydev")
    torch.testing.assert_close(dev_losses, cpu_losses)
    assert cpu_losses[-1] < cpu_losses[0]
    for (name, p), (_, q) in zip(cpu_model.named_parameters(), dev_model.named_parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), msg=name)


def test_other_devices_unchanged():
    # CPU to CPU (dtype): PyTorch's .data assignment, as before.
    m = _tied()
    w = m[0].weight
    m.double()
    assert m[0].weight is w and w.dtype == torch.float64
    # CPU to meta: PyTorch makes new Parameters for every device (CUDA too); so does mydev.
    for device in ("meta",):
        m = _tied()
        w = m[0].weight
        m.to(device)
        assert m[0].weight is not w and m[0].weight.device.type == device
    # mydev to meta: not a pair CUDA keeps either.
    m = _tied().to("mydev")
    w = m[0].weight
    m.to("meta")
    assert m[0].weight is not w
    assert not torch.__future__.get_swap_module_params_on_conversion()


def test_user_swap_setting_is_respected():
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        m = _tied()
        w = m[0].weight
        m.to("mydev")
        assert m[0].weight is w and m[2].weight is w
        assert torch.__future__.get_swap_module_params_on_conversion()
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)


def test_buffers_and_rnn_flat_weights():
    m = nn.Sequential(nn.BatchNorm1d(4), nn.LSTM(4, 3))
    lstm_weight = m[1].weight_ih_l0
    m.to("mydev")
    assert m[0].running_mean.device.type == "mydev"
    assert m[1].weight_ih_l0 is lstm_weight and m[1]._flat_weights[0] is lstm_weight


def test_parameter_with_weakref_keeps_pytorch_behaviour():
    m = _tied()
    w = m[0].weight
    ref = weakref.ref(w)
    with pytest.warns(UserWarning, match="replaces it with a new Parameter"):
        m.to("mydev")
    assert ref() is w
    assert m[0].weight.device.type == "mydev" and m[0].weight is not w


def test_failed_conversion_leaves_module_and_device_usable():
    m = _tied()
    w = m[0].weight
    with pytest.raises(RuntimeError):
        m.to("mydev:99")
    assert m[0].weight is w and w.device.type == "cpu"
    assert not torch.__future__.get_swap_module_params_on_conversion()
    m.to("mydev")
    assert m[0].weight is w and w.device.type == "mydev"
    with torch.no_grad():
        out = m(torch.ones(2, 6, device="mydev")).cpu()
        torch.testing.assert_close(out, m.cpu()(torch.ones(2, 6)))
    assert m[0].weight is w


def test_bert_decoder_weight_and_bias_stay_tied():
    import transformers  # a test requirement (requirements.txt)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(config)
    head = model.cls.predictions
    tied = (head.decoder.weight, model.bert.embeddings.word_embeddings.weight), (head.decoder.bias, head.bias)
    assert all(a is b for a, b in tied)
    params = list(model.parameters())
    model.to("mydev")
    assert head.decoder.weight is tied[0][0] and model.bert.embeddings.word_embeddings.weight is tied[0][0]
    assert head.decoder.bias is tied[1][0] and head.bias is tied[1][0]
    assert all(p is q for p, q in zip(model.parameters(), params)) and head.bias.device.type == "mydev"


def test_parameters_held_elsewhere_convert_as_torch_does():
    # A scripted copy of the module holds the Parameters' tensors: they cannot be swapped, so the
    # conversion falls back to PyTorch's own behaviour (new Parameters) with a warning, as before.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(model)
    x = torch.randn(2, 4)
    expected = model(x)
    with pytest.warns(UserWarning, match="referenced elsewhere"):
        moved = model.to("mydev")
    torch.testing.assert_close(moved(x.to("mydev")).cpu(), expected)
    torch.testing.assert_close(scripted(x), expected)


@pytest.mark.parametrize("source", ["scripted", "loaded"])
def test_script_modules_move_to_mydev_and_back(source):
    """A scripted or torch.jit.load-ed module moves with .to("mydev") and .cpu() as with .cuda(): its C++
    module's attributes are replaced (PyTorch's `.data =` cannot cross to mydev's TensorImpl, and its
    fallback asserts the plain tensors of a loaded module are Parameters)."""
    import io

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).eval()
    x = torch.randn(5, 3)
    module = torch.jit.script(net)
    if source == "loaded":
        buffer = io.BytesIO()
        torch.jit.save(module, buffer)
        buffer.seek(0)
        module = torch.jit.load(buffer)
    moved = module.to("mydev")
    assert moved is module
    assert all(t.device.type == "mydev" for t in [*module.parameters(), *module.buffers()])
    torch.testing.assert_close(module(x.to("mydev")).cpu(), net(x))
    back = module.cpu()
    assert all(t.device.type == "cpu" for t in back.parameters())
    torch.testing.assert_close(back(x), net(x))


def test_script_module_moved_to_mydev_trains_like_cpu():
    """Moved parameters keep requires_grad and their gradients, as .cuda() keeps them."""
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    module = torch.jit.script(copy.deepcopy(net))
    module(x).sum().backward()
    module.to("mydev")
    assert all(p.requires_grad and p.grad is not None and p.grad.device.type == "mydev" for p in module.parameters())
    net(x).sum().backward()
    for p, q in zip(module.parameters(), net.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad)
    module.zero_grad()
    net.zero_grad()
    module(x.to("mydev")).pow(2).sum().backward()
    net(x).pow(2).sum().backward()
    for p, q in zip(module.parameters(), net.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad)
