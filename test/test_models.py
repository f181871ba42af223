"""Real models on mydev against the same models on CPU, with MYDEV_FALLBACK=error (no op may fall back to
the copying CPU fallback): GPT-2, BERT and Llama (2 layers, from tiny configs, no dropout) from
`transformers`, and a torchvision-style ResNet basic block written here. Forward results, three training
steps, greedy `generate`, autocast bfloat16 training and GradScaler float16 training."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformers  # noqa: E402  (a test requirement: requirements.txt installs it)

VOCAB, SEQ, BATCH = 64, 12, 2


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def _bert():
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.BertForMaskedLM(cfg)


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(cfg)


class BasicBlock(nn.Module):
    """torchvision's ResNet basic block: two 3x3 convolutions with batch norm, and a strided 1x1
    projection on the shortcut when the shape changes."""

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNetBlockClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.block1 = BasicBlock(8, 8)
        self.block2 = BasicBlock(8, 16, stride=2)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = self.block2(self.block1(self.stem(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


MODELS = {"gpt2": _gpt2, "bert": _bert, "llama": _llama, "resnet_block": ResNetBlockClassifier}


@pytest.fixture(autouse=True)
def no_fallback(monkeypatch):
    monkeypatch.setenv("MYDEV_FALLBACK", "error")


def _build(name):
    torch.manual_seed(0)
    return MODELS[name]()


def _batch(name, step=0):
    g = torch.Generator().manual_seed(100 + step)
    if name == "resnet_block":
        return {"x": torch.randn(4, 3, 8, 8, generator=g), "y": torch.randint(0, 5, (4,), generator=g)}
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -3:] = 0  # a padded row: exercises the attention mask
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _loss(model, name, batch, device):
    batch = {k: v.to(device) for k, v in batch.items()}
    if name == "resnet_block":
        return F.cross_entropy(model(batch["x"]), batch["y"])
    return model(**batch).loss


def _output(model, name, batch, device):
    batch = {k: v.to(device) for k, v in batch.items()}
    if name == "resnet_block":
        return model(batch["x"])
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def _to(model, device):
    """A copy of `model` on `device`; Module.to() keeps tied weights tied on mydev, as on CUDA
    (my_device/_module_conversion.py)."""
    return copy.deepcopy(model).to(device)


def test_tied_weights_stay_tied_on_mydev():
    for name, tied in [("gpt2", ("lm_head", "transformer.wte")), ("bert", ("cls.predictions.decoder", "bert.embeddings.word_embeddings"))]:
        model = _to(_build(name), "mydev")
        a, b = (model.get_submodule(m).weight for m in tied)
        assert a is b and a.device.type == "mydev", name


@pytest.mark.parametrize("name", MODELS)
def test_forward_matches_cpu(name):
    model = _build(name).eval()
    with torch.no_grad():
        expected = _output(model, name, _batch(name), "cpu")
        got = _output(_to(model, "mydev"), name, _batch(name), "mydev")
    assert got.device.type == "mydev"
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-4)


def _train(model, name, device, steps=3, autocast_dtype=None, scaler=None, lr=1e-2):
    model = _to(model, device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        with torch.autocast(device, dtype=autocast_dtype or torch.float16, enabled=autocast_dtype is not None):
            loss = _loss(model, name, _batch(name), device)  # one batch: the loss must fall
        opt.zero_grad()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", MODELS)
def test_training_matches_cpu(name):
    model = _build(name)
    cpu_losses, cpu_state = _train(model, name, "cpu")
    dev_losses, dev_state = _train(model, name, "mydev")
    torch.testing.assert_close(dev_losses, cpu_losses, atol=1e-5, rtol=1e-4)
    assert cpu_losses[-1] < cpu_losses[0]
    for k in cpu_state:
        torch.testing.assert_close(dev_state[k], cpu_state[k], atol=1e-4, rtol=1e-3, msg=k)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_generate_matches_cpu(name):
    model = _build(name).eval()
    prompt = _batch(name)["input_ids"][:1, :5]
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs)
    dev = _to(model, "mydev")
    got = dev.generate(prompt.to("mydev"), attention_mask=torch.ones_like(prompt).to("mydev"), **kwargs)
    assert got.device.type == "mydev" and got.shape == (1, 11)
    assert got.cpu().tolist() == expected.tolist()


@pytest.mark.parametrize("name", MODELS)
def test_mixed_precision_training_follows_float32(name):
    # bfloat16 autocast, and float16 autocast with GradScaler, track the float32 run's losses; autocast
    # policies differ between CPU and mydev (mydev's are CUDA's), so the reference is float32.
    model = _build(name)
    ref_losses, _ = _train(model, name, "cpu", lr=1e-3)
    bf16_losses, bf16_state = _train(model, name, "mydev", autocast_dtype=torch.bfloat16, lr=1e-3)
    scaler = torch.amp.GradScaler("mydev")
    fp16_losses, fp16_state = _train(model, name, "mydev", autocast_dtype=torch.float16, scaler=scaler, lr=1e-3)
    for dtype in (torch.bfloat16, torch.float16):  # the models did compute in the low dtype
        with torch.no_grad(), torch.autocast("mydev", dtype=dtype):
            assert _output(_to(model, "mydev"), name, _batch(name), "mydev").dtype == dtype
    torch.testing.assert_close(bf16_losses, ref_losses, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(fp16_losses, ref_losses, atol=5e-3, rtol=5e-3)
    assert scaler.get_scale() == 65536.0  # no overflow: every step was taken
    for state in (bf16_state, fp16_state):
        for k, v in state.items():
            assert v.dtype == model.state_dict()[k].dtype and bool(torch.isfinite(v.float()).all()), k


def test_hugging_face_loaders_reach_mydev_as_documented(tmp_path):
    # docs/models.md: device_map="auto" places on the CPU (accelerate knows no mydev), a named mydev device_map
    # places on mydev; safetensors refuses the device name, and loading onto the CPU then moving works.
    import safetensors.torch

    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=16)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    want = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).state_dict()
    for device_map, device in (("auto", "cpu"), ("mydev", "mydev:0"), ({"": "mydev:1"}, "mydev:1")):
        model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, device_map=device_map)
        for name, value in model.state_dict().items():
            assert str(value.device) == device, (device_map, name)
            torch.testing.assert_close(value.cpu(), want[name], rtol=0, atol=0)
    path = str(tmp_path / "model.safetensors")
    with pytest.raises(Exception, match="device mydev is invalid"):
        safetensors.torch.load_file(path, device="mydev")
    moved = {k: v.to("mydev") for k, v in safetensors.torch.load_file(path).items()}
    assert moved and all(v.device.type == "mydev" for v in moved.values())
