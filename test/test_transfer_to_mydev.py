"""`import my_device.transfer_to_mydev`: code written for CUDA runs on mydev. Each test runs in a fresh
interpreter, since the module patches torch for the rest of its process."""
import json

import pytest
import torch

# A script as written for CUDA: model, optimizer, .cuda(), device="cuda", torch.cuda.amp (autocast and
# GradScaler), torch.cuda.synchronize(), events, memory statistics, saving and loading. It prints what it
# saw; the same training then runs on CPU (CPU autocast in float16 and CPU GradScaler) for reference.
CUDA_SCRIPT = r'''
import io, json
import my_device.transfer_to_mydev
import torch
from torch import nn

def train(device, autocast, scaler):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model = model.cuda() if device == "cuda" else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=g)
    y = torch.randn(32, 4, generator=g)
    if device == "cuda":
        x, y = x.to(device="cuda"), y.cuda()
    losses = []
    for _ in range(3):
        with autocast():
            loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return model, losses

assert torch.cuda.is_available() and torch.cuda.device_count() == 2
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
model, losses = train("cuda", torch.cuda.amp.autocast, torch.cuda.amp.GradScaler())
end.record()
torch.cuda.synchronize()
_, cpu_losses = train("cpu", lambda: torch.autocast("cpu", dtype=torch.float16), torch.amp.GradScaler("cpu"))

buf = io.BytesIO()
torch.save(model.state_dict(), buf)
buf.seek(0)
loaded = torch.load(buf, map_location=torch.device("cuda", 1))
print(json.dumps({
    "param_devices": sorted({str(p.device) for p in model.parameters()}),
    "is_cuda": next(model.parameters()).is_cuda,
    "losses": losses, "cpu_losses": cpu_losses,
    "elapsed_ms": start.elapsed_time(end),
    "memory_allocated": torch.cuda.memory_allocated(),
    "mydev_memory_allocated": torch.mydev.memory_allocated(),
    "loaded_devices": sorted({str(t.device) for t in loaded.values()}),
    "loaded_equal": all(torch.equal(loaded[k].cpu(), v.cpu()) for k, v in model.state_dict().items()),
}))
'''


def test_cuda_script_runs_unchanged_on_mydev(python_subprocess):
    result = python_subprocess(CUDA_SCRIPT, env={"MYDEV_FALLBACK": "error"})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["param_devices"] == ["mydev:0"]
    assert out["is_cuda"] is True
    assert out["losses"] == out["cpu_losses"] or all(
        abs(a - b) < 1e-3 * max(1.0, abs(b)) for a, b in zip(out["losses"], out["cpu_losses"]))
    assert out["losses"][-1] < out["losses"][0]
    assert out["elapsed_ms"] > 0
    assert out["memory_allocated"] == out["mydev_memory_allocated"] > 0
    assert out["loaded_devices"] == ["mydev:1"] and out["loaded_equal"]


REDIRECTIONS = r'''
import io, json, zipfile
import torch

# A checkpoint as saved on a CUDA machine: its storage's location tag is "cuda:1".
buf = io.BytesIO()
torch.save({"w": torch.arange(4.0)}, buf)
src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
out = io.BytesIO()
with zipfile.ZipFile(out, "w") as dst:
    for info in src.infolist():
        data = src.read(info)
        if info.filename.endswith("data.pkl"):
            assert b"X\x03\x00\x00\x00cpu" in data
            data = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:1")
        dst.writestr(info, data)
cuda_checkpoint = out.getvalue()
try:
    torch.load(io.BytesIO(cuda_checkpoint))
    raise AssertionError("a CUDA checkpoint loaded without CUDA")
except RuntimeError as e:
    assert "CUDA" in str(e)

import my_device.transfer_to_mydev as t
facts = {}
facts["checkpoint"] = str(torch.load(io.BytesIO(cuda_checkpoint))["w"].device)
facts["checkpoint_cpu"] = str(torch.load(io.BytesIO(cuda_checkpoint), map_location="cpu")["w"].device)
facts["checkpoint_dict"] = str(torch.load(io.BytesIO(cuda_checkpoint), map_location={"cuda:1": "cuda:0"})["w"].device)
facts["zeros"] = str(torch.zeros(2, device="cuda:1").device)
facts["tensor"] = str(torch.tensor([1.0], device=torch.device("cuda")).device)
facts["arange"] = str(torch.arange(3, device="cuda").device)
facts["randn_like"] = str(torch.randn_like(torch.zeros(2), device="cuda:1").device)
x = torch.ones(2)
facts["to_str"] = str(x.to("cuda:1").device)
facts["to_device"] = str(x.to(torch.device("cuda", 1), torch.float16).device)
facts["to_kw"] = str(x.to(device="cuda").device)
facts["cuda_int"] = str(x.cuda(1).device)
facts["new_zeros"] = str(x.new_zeros(3, device="cuda:1").device)
facts["module_to"] = str(next(torch.nn.Linear(2, 2).to("cuda:1").parameters()).device)
facts["module_cuda"] = str(next(torch.nn.Linear(2, 2).cuda().parameters()).device)
facts["is_cuda_cpu"] = x.is_cuda
facts["pinned"] = x.pin_memory().is_pinned()
g = torch.Generator(device="cuda")
facts["generator"] = str(g.device)
facts["generator_isinstance"] = isinstance(g, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
torch.cuda.manual_seed(5)
a = torch.randn(3, device="cuda")
state = torch.cuda.get_rng_state()
b = torch.randn(3, device="cuda")
torch.cuda.set_rng_state(state)
facts["rng"] = torch.equal(b.cpu(), torch.randn(3, device="cuda").cpu()) and not torch.equal(a.cpu(), b.cpu())
torch.cuda.set_device(1)
facts["current_device"] = torch.cuda.current_device()
facts["default_device_after_set"] = str(torch.empty(1, device="cuda").device)
torch.cuda.set_device(0)
with torch.cuda.device("cuda:1"):
    facts["device_context"] = torch.cuda.current_device()
kept = torch.empty(1024, device="cuda:1")
facts["memory_by_name"] = torch.cuda.memory_allocated("cuda:1") == torch.mydev.memory_allocated(1) > 0
torch.cuda.synchronize(torch.device("cuda", 1))
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    facts["stream"] = torch.cuda.current_stream() == s and isinstance(s, torch.mydev.Stream)
s.synchronize()
facts["props"] = torch.cuda.get_device_name() == torch.mydev.get_device_name()
facts["bf16"] = torch.cuda.is_bf16_supported()
with torch.autocast("cuda"):
    facts["autocast"] = str((torch.ones(2, 2, device="cuda") @ torch.ones(2, 2, device="cuda")).dtype)
with torch.autocast(device_type="cuda"):
    facts["autocast_state"] = [torch.is_autocast_enabled(), torch.is_autocast_enabled("cuda"),
                               str(torch.get_autocast_dtype("cuda")), torch.is_autocast_enabled("cpu")]
facts["autocast_state_after"] = torch.is_autocast_enabled()
facts["to_empty"] = str(next(torch.nn.Linear(2, 2, device="meta").to_empty(device="cuda:1").parameters()).device)
torch.set_default_device("cuda:1")
facts["default_device"] = str(torch.ones(1).device)
torch.set_default_device(None)
with torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16):
    facts["amp_autocast"] = str((torch.ones(2, 2, device="cuda") @ torch.ones(2, 2, device="cuda")).dtype)
from torch.cuda.amp import GradScaler, autocast
facts["scaler"] = GradScaler()._device + "," + torch.amp.GradScaler()._device + "," + torch.amp.GradScaler("cuda")._device
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=4,
                                     pin_memory=True, pin_memory_device="cuda")
facts["loader_pinned"] = all(b[0].is_pinned() for b in loader)
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("error")  # CUDA's autocast takes float32 without a word
    with torch.autocast("cuda", dtype=torch.float32):
        facts["autocast_float32"] = [torch.is_autocast_enabled("cuda"),
                                     str((torch.ones(2, 2, device="cuda").half() @ torch.ones(2, 2, device="cuda").half()).dtype)]
facts["cuda_names"] = [torch.cuda.is_current_stream_capturing(), torch.cuda.OutOfMemoryError is torch.OutOfMemoryError,
                       torch.cuda.get_per_process_memory_fraction(), torch.cuda.can_device_access_peer(0, 1),
                       torch.cuda.memory_stats_as_nested_dict("cuda:1")["allocated_bytes"]["all"]["current"]
                       == torch.mydev.memory_allocated(1)]
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    (torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda")).sum().item()
facts["profiled_device_time"] = sum(e.self_device_time_total for e in prof.key_averages() if e.key == "aten::mm") > 0
with torch.autograd.profiler.profile(use_cuda=True) as legacy:
    (torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda")).sum().item()
facts["legacy_profiled_device_time"] = sum(e.self_device_time_total for e in legacy.key_averages()
                                           if e.key == "aten::mm") > 0
import torch.distributed as dist
facts["nccl_available"] = dist.is_nccl_available()
store = dist.HashStore()
dist.init_process_group("cpu:gloo,cuda:nccl", store=store, rank=0, world_size=1)
facts["backend"] = str(dist.get_backend_config())
group = dist.new_group(backend="nccl")
facts["new_group"] = dist.get_backend(group)
x = torch.ones(3, device="cuda")
dist.all_reduce(x, group=group)
facts["all_reduce"] = x.tolist()
dist.destroy_process_group()
torch.cuda.empty_cache()
# A CUDA graph as CUDA code writes it: a warmed-up step captured on a side stream, replayed.
static = torch.zeros(8, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    (static * 2 + 1).relu()
torch.cuda.current_stream().wait_stream(side)
cuda_graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(cuda_graph):
    graph_out = (static * 2 + 1).relu()
static.copy_(torch.arange(8.0))
cuda_graph.replay()
facts["cuda_graph"] = [type(cuda_graph).__name__, graph_out.device.type, graph_out.tolist()]
facts["redirections"] = sorted(t.redirections())
facts["not_redirected"] = t.not_redirected()
print(json.dumps(facts))
'''


def test_each_redirection(python_subprocess):
    result = python_subprocess(REDIRECTIONS)
    assert result.returncode == 0, result.stderr
    f = json.loads(result.stdout.strip().splitlines()[-1])
    assert f["checkpoint"] == "mydev:1"
    assert f["checkpoint_cpu"] == "cpu"
    assert f["checkpoint_dict"] == "mydev:0"
    for key, device in [("zeros", "mydev:1"), ("tensor", "mydev:0"), ("arange", "mydev:0"),
                        ("randn_like", "mydev:1"), ("to_str", "mydev:1"), ("to_device", "mydev:1"),
                        ("to_kw", "mydev:0"), ("cuda_int", "mydev:1"), ("new_zeros", "mydev:1"),
                        ("module_to", "mydev:1"), ("module_cuda", "mydev:0"), ("generator", "mydev:0"),
                        ("default_device_after_set", "mydev:1")]:
        assert f[key] == device, key
    assert f["is_cuda_cpu"] is False
    for key in ["pinned", "generator_isinstance", "rng", "stream", "props", "bf16", "loader_pinned"]:
        assert f[key] is True, key
    assert f["current_device"] == 1 and f["device_context"] == 1 and f["memory_by_name"] is True
    assert f["autocast"] == "torch.float16" and f["amp_autocast"] == "torch.bfloat16"
    assert f["scaler"] == "mydev,mydev,mydev"
    assert f["autocast_state"] == [True, True, "torch.float16", False] and f["autocast_state_after"] is False
    assert f["to_empty"] == "mydev:1" and f["default_device"] == "mydev:1"
    assert f["autocast_float32"] == [True, "torch.float32"]
    assert f["cuda_names"] == [False, True, 1.0, True, True]
    assert f["profiled_device_time"] is True and f["legacy_profiled_device_time"] is True
    assert f["nccl_available"] is True and f["backend"] == "cpu:gloo,mydev:mccl" and f["new_group"] == "mccl"
    assert f["all_reduce"] == [1.0, 1.0, 1.0]
    assert "torch.cuda.synchronize" in f["redirections"] and "torch.cuda.memory_allocated" in f["redirections"]
    # CUDA-only APIs are left alone (documented in docs/transfer-to-mydev.md).
    assert "torch.cuda.nvtx" in f["not_redirected"] and "torch.cuda.jiterator" in f["not_redirected"]
    assert f["cuda_graph"] == ["MyDevGraph", "mydev", [2.0 * i + 1 for i in range(8)]]
    for name in ("graph", "CUDAGraph", "make_graphed_callables", "graph_pool_handle", "MemPool", "use_mem_pool"):
        assert f"torch.cuda.{name}" in f["redirections"], name


def test_unmapped_device_arguments_are_untouched(python_subprocess):
    result = python_subprocess(r'''
import torch
import my_device.transfer_to_mydev
assert torch.zeros(1, device="cpu").device.type == "cpu"
assert str(torch.zeros(1, device="mydev:1").device) == "mydev:1"
assert torch.ones(1).to(torch.float64).dtype == torch.float64
assert torch.device("cpu").type == "cpu" and torch.device("mydev", 1).index == 1
try:
    torch.zeros(1, device="cuda:7")
except RuntimeError as e:
    print("error:", e)
''')
    assert result.returncode == 0, result.stderr
    assert "error:" in result.stdout and "mydev" in result.stdout


# Written for CUDA: the model moves with torch.device("cuda"), the data is built under the
# `with torch.device("cuda"):` factory context, and the script compares devices as CUDA code does.
# The same function runs with torch.device("cpu") for reference.
DEVICE_SCRIPT = r"""
import json, os, pickle, sys, tempfile
import torch
from torch import nn

real_device = torch.device
cuda_pickled = pickle.dumps(torch.device("cuda", 1))   # as pickled on a CUDA machine
cuda_made_before = torch.device("cuda", 1)              # a device object built before the import
# torch.device's constructor cannot be patched (why the module replaces the name `torch.device`).
try:
    real_device.__new__ = lambda *a: None
    raise AssertionError("torch.device became patchable: transfer_to_mydev could patch it in place")
except TypeError:
    pass
# TorchScript needs source files: one annotated before the import, one after.
src = tempfile.mkdtemp()
sys.path.insert(0, src)
with open(os.path.join(src, "scripted_before.py"), "w") as f:
    f.write("import torch\ndef kind(d: torch.device) -> str:\n    return d.type\n"
            "def draw(g: torch.Generator) -> torch.Tensor:\n    return torch.rand(2, generator=g)\n")
import scripted_before

import my_device.transfer_to_mydev

with open(os.path.join(src, "scripted_after.py"), "w") as f:
    f.write("from typing import Optional\nimport torch\n"
            "def pick(d: Optional[torch.device]) -> torch.device:\n"
            "    return d if d is not None else torch.device('cpu')\n"
            "def make(d: torch.device) -> torch.Tensor:\n    return torch.zeros(2, device=d)\n")
import scripted_after


def train(device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with device:
        x = torch.linspace(-1, 1, 32 * 8).reshape(32, 8)
        y = torch.sin(3 * x[:, :4]) + torch.ones(4)
        data_device = str(x.device)
    losses = []
    for _ in range(4):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses, data_device


model, losses, data_device = train(torch.device("cuda"))
cpu_model, cpu_losses, _ = train(torch.device("cpu"))
param = next(model.parameters())


@torch.compile(backend="aot_eager", fullgraph=True)
def compiled(x):
    return x.to(torch.device("cuda", 1)) * 2 + torch.ones(3, device=torch.device("cuda", 1))


compiled_out = compiled(torch.arange(3.0))


@torch.compile   # Inductor, torch.compile's default backend
def inductor_compiled(x):
    return torch.relu(x.to(torch.device("cuda")) - 1).to(torch.device("cpu"))


inductor_out = inductor_compiled(torch.arange(4.0))
# Why transfer_to_mydev computes Inductor's cache key itself: Inductor's own reads the redirected
# torch.cuda.get_device_properties as a ROCm device's.
import torch._inductor.codecache
try:
    torch._inductor.codecache.CacheBase.get_system._torch_original()
    inductor_own_key = "ok"
except AttributeError as e:
    inductor_own_key = str(e)
s = torch.cuda.Stream(device="cuda:1")
with torch.cuda.stream(s):
    on_stream = torch.ones(3, device="cuda:1") * 2
s.synchronize()
try:
    torch.device("cuda:x")
    bad = None
except RuntimeError as e:
    bad = str(e)
d = torch.device("cuda", 1)
print(json.dumps({
    "devices": [str(torch.device("cuda")), str(torch.device("cuda", 1)), str(torch.device("cuda:1")),
                str(torch.device(type="cuda", index=1)), str(torch.device("cpu")), str(torch.device("mydev", 1))],
    "param_device": str(param.device), "data_device": data_device,
    "default_after": str(torch.get_default_device()),
    "equal_device": param.device == torch.device("cuda", 0), "is_cuda": param.is_cuda,
    "losses": losses, "cpu_losses": cpu_losses,
    "params_close": all(torch.allclose(p.cpu(), q, atol=1e-5)
                        for p, q in zip(model.parameters(), cpu_model.parameters())),
    "isinstance": [isinstance(d, torch.device), isinstance("cuda", torch.device),
                   isinstance(cuda_made_before, torch.device), issubclass(type(d), torch.device),
                   type(d) == torch.device, type(d) in (torch.device,), type(d) is real_device],
    "pickle": [str(pickle.loads(pickle.dumps(d))), str(pickle.loads(pickle.dumps(torch.device("cpu")))),
               str(pickle.loads(cuda_pickled))],
    "made_before": [str(cuda_made_before), str(torch.zeros(1, device=cuda_made_before).device)],
    "script": [torch.jit.script(scripted_before.kind)(torch.device("cuda", 1)),
               str(torch.jit.script(scripted_after.pick)(None)),
               str(torch.jit.script(scripted_after.pick)(torch.device("cuda", 1))),
               str(torch.jit.script(scripted_after.make)(torch.device("cuda", 1)).device),
               torch.equal(torch.jit.script(scripted_before.draw)(torch.Generator().manual_seed(3)),
                           torch.rand(2, generator=torch.Generator().manual_seed(3)))],
    "compiled": [str(compiled_out.device), compiled_out.cpu().tolist()],
    "inductor": [str(inductor_out.device), inductor_out.tolist(), inductor_own_key],
    "stream": [s.device_index, isinstance(s, torch.cuda.Stream),
               isinstance(torch.cuda.current_stream(), torch.cuda.Stream),
               isinstance(s, torch.mydev.Stream), on_stream.cpu().tolist()],
    "bad": bad,
}))
"""


def test_torch_device_cuda_is_mydev(python_subprocess):
    result = python_subprocess(DEVICE_SCRIPT, env={"MYDEV_FALLBACK": "error"})
    assert result.returncode == 0, result.stderr
    f = json.loads(result.stdout.strip().splitlines()[-1])
    assert f["devices"] == ["mydev", "mydev:1", "mydev:1", "mydev:1", "cpu", "mydev:1"]
    # the training script ran on mydev (model moved by a device object, data made in the device context)
    assert f["param_device"] == "mydev:0" and f["data_device"] == "mydev:0" and f["default_after"] == "cpu"
    assert f["equal_device"] is True and f["is_cuda"] is True
    assert all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(f["losses"], f["cpu_losses"])), f
    assert f["losses"][-1] < f["losses"][0] and f["params_close"] is True
    # the replacement stands for the C type in type checks; devices are the C type's instances
    assert f["isinstance"] == [True, False, True, True, True, True, True]
    assert f["pickle"] == ["mydev:1", "cpu", "mydev:1"]
    # a CUDA device object built before the import stays one; device arguments still redirect it
    assert f["made_before"] == ["cuda:1", "mydev:1"]
    assert f["script"] == ["mydev", "cpu", "mydev:1", "mydev:1", True]
    assert f["compiled"] == ["mydev:1", [1.0, 3.0, 5.0]]
    # When the last item fails, Inductor reads mydev's properties itself and the get_system patch can go.
    assert f["inductor"] == ["cpu", [0.0, 0.0, 1.0, 2.0], "'_DeviceProperties' object has no attribute 'gcnArchName'"]
    assert f["stream"] == [1, True, True, True, [2.0, 2.0, 2.0]]
    assert f["bad"] == "Invalid device string: 'cuda:x'"


# TorchScript code written for CUDA: the compiler folds device="cuda" into constants and x.cuda() into an
# interpreter op, which the eager redirections never see. The module saved *before* the import keeps
# "cuda" in its serialized code, as a checkpoint made on a CUDA machine does.
TORCHSCRIPT_SCRIPT = r'''
import io, json, os, sys, tempfile
import torch

src = tempfile.mkdtemp()
sys.path.insert(0, src)
with open(os.path.join(src, "cuda_code.py"), "w") as f:
    f.write("""
import torch

def helper(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.device("cuda", 1)) * 2

def step(x: torch.Tensor, n: int):
    a = x.to("cuda")
    b = torch.zeros(3, device="cuda:0") + torch.arange(3.0, device=torch.device("cuda"))
    c = x.cuda()
    if n > 0:
        c = c + torch.ones(3, device="cuda")
    d = torch.device("cuda", 1)
    return a * b + c, helper(x), d, x.is_cuda, a.is_cuda, a.device.type == "cuda", a.device == torch.device("cuda", 0)

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + torch.ones(3, device="cuda")

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x.cuda())
        for i in range(2):
            y = y + helper(x).to(torch.device("cuda"))
        return y.to("cpu")

def bad(x: torch.Tensor) -> torch.Tensor:
    return x.to("cuda:7")

def move(x: torch.Tensor, dev: str):
    return x.to(dev) + torch.ones(3, device=dev), torch.device(dev)
""")
import cuda_code

# Scripted and saved before the import: its code says "cuda" (the saved code is read back below).
torch.manual_seed(0)
saved_before = io.BytesIO()
torch.jit.save(torch.jit.script(cuda_code.Model()), saved_before)
saved_path = os.path.join(src, "model.pt")
with open(saved_path, "wb") as f:
    f.write(saved_before.getvalue())

import my_device.transfer_to_mydev

x = torch.tensor([1.0, -2.0, 3.0])
out = {}
step = torch.jit.script(cuda_code.step)
r, h, d, x_is_cuda, a_is_cuda, type_is_cuda, eq_cuda = step(x, 1)
out["step"] = [str(r.device), r.cpu().tolist(), str(h.device), h.cpu().tolist(), str(d),
               x_is_cuda, a_is_cuda, type_is_cuda, eq_cuda]
out["step_cpu"] = [(x * torch.arange(3.0) + x + 1).tolist(), (x * 2).tolist()]

torch.manual_seed(0)
model = cuda_code.Model()
scripted = torch.jit.script(model).cuda()
cpu_model = cuda_code.Model()
cpu_model.load_state_dict(model.state_dict())
expected = (cpu_model.block.lin(x) + 1 + 2 * (2 * x)).tolist()
out["module"] = [scripted(x).tolist(), expected, str(next(scripted.parameters()).device)]

# a device string that is an argument, only known when the code runs
move = torch.jit.script(cuda_code.move)
out["move"] = [[str(t.device), t.cpu().tolist(), str(d)] for t, d in (move(x, "cuda:1"), move(x, "cpu"))]

traced = torch.jit.trace(cuda_code.helper, (x,))
out["trace"] = [str(traced(x).device), traced(x).cpu().tolist()]

for name, source in [("buffer", io.BytesIO(saved_before.getvalue())), ("file", saved_path)]:
    loaded = torch.jit.load(source, map_location="cuda")
    assert '"cuda"' in loaded.code or "cuda" in loaded.code, loaded.code
    cpu_copy = cuda_code.Model()
    cpu_copy.load_state_dict(loaded.state_dict())
    out["load_" + name] = [loaded(x).tolist(), (cpu_copy.block.lin(x) + 1 + 4 * x).tolist()]
on_mydev = torch.jit.load(io.BytesIO(saved_before.getvalue()), map_location="cuda:1")
out["map_location"] = sorted({str(p.device) for p in on_mydev.parameters()})
with torch.cuda.device(1):   # the code's "cuda" and x.cuda() name the current device
    out["map_location_run"] = on_mydev(x).tolist() == out["load_buffer"][0]

try:
    torch.jit.script(cuda_code.bad)(x)
    out["bad"] = None
except RuntimeError as e:
    out["bad"] = str(e)
out["after_bad"] = (torch.ones(2, device="cuda") + 1).cpu().tolist()
out["redirections"] = [k for k in my_device.transfer_to_mydev.redirections() if k.startswith("torch.jit")]
print(json.dumps(out))
'''


def test_torchscript_code_naming_cuda_runs_on_mydev(python_subprocess):
    result = python_subprocess(TORCHSCRIPT_SCRIPT, env={"MYDEV_FALLBACK": "error"})
    assert result.returncode == 0, result.stderr
    f = json.loads(result.stdout.strip().splitlines()[-1])
    device, values, helper_device, helper_values, d, x_is_cuda, a_is_cuda, type_is_cuda, eq_cuda = f["step"]
    assert device == "mydev:0" and helper_device == "mydev:1" and d == "mydev:1"
    assert values == f["step_cpu"][0] and helper_values == f["step_cpu"][1]
    # as in eager code after the import: is_cuda is true on mydev, the device's type says "mydev", and
    # torch.device("cuda") is mydev's
    assert [x_is_cuda, a_is_cuda, type_is_cuda, eq_cuda] == [False, True, False, True]
    got, expected, param_device = f["module"]
    assert param_device == "mydev:0"
    assert all(abs(a - b) < 1e-6 for a, b in zip(got, expected)), f["module"]
    assert f["trace"] == ["mydev:1", [2.0, -4.0, 6.0]]
    assert f["move"] == [["mydev:1", [2.0, -1.0, 4.0], "mydev:1"], ["cpu", [2.0, -1.0, 4.0], "cpu"]]
    for key in ("load_buffer", "load_file"):
        got, expected = f[key]
        assert all(abs(a - b) < 1e-6 for a, b in zip(got, expected)), (key, f[key])
    assert f["map_location"] == ["mydev:1"] and f["map_location_run"] is True
    assert "mydev" in f["bad"] and "cuda:7" in f["bad"], f["bad"]
    assert f["after_bad"] == [2.0, 2.0]
    assert sorted(f["redirections"]) == ["torch.jit.load", "torch.jit.script", "torch.jit.trace",
                                         "torch.jit.trace_module"]


TRAINER_SCRIPT = r'''
import json, sys, tempfile
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

def losses(on_cpu, batch, precision="float32"):
    torch.manual_seed(0)
    # (no dropout: the CPU's and mydev's generators draw different masks)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": t, "labels": t.clone()} for t in tokens]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=4, per_device_train_batch_size=batch,
                             logging_steps=1, report_to=[], use_cpu=on_cpu, save_strategy="no", seed=0,
                             dataloader_num_workers=0, bf16=precision == "bfloat16",
                             fp16=precision == "float16", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return {"n_gpu": args.n_gpu, "device": str(args.device), "device_type": next(model.parameters()).device.type,
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}

out = {"cpu": losses(True, 4), "cpu8": losses(True, 8)}
import my_device.transfer_to_mydev
for precision in ("float32", "bfloat16", "float16"):
    out[precision] = losses(False, 4, precision)
print(json.dumps(out))
'''


@pytest.mark.parametrize("devices", [1, 2])
def test_transformers_trainer_trains_on_mydev_as_on_the_cpu(python_subprocess, devices):
    # A CUDA script's Trainer: with one device it trains on it, with two it wraps the model in nn.DataParallel
    # (a per-device batch of 4 is a step of 8); float32 losses equal the CPU's, the mixed precisions' are
    # near them (autocast's lists are CUDA's, not the CPU's; under DataParallel transformers opens no
    # autocast region, on CUDA too, so they are float32's there). fp16 needed accelerate to accept mydev.
    result = python_subprocess(TRAINER_SCRIPT, env={"MYDEV_DEVICE_COUNT": str(devices)}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    want = out["cpu"]["losses"] if devices == 1 else out["cpu8"]["losses"]
    for precision in ("float32", "bfloat16", "float16"):
        run = out[precision]
        assert run["n_gpu"] == devices and run["device"] == "mydev:0" and run["device_type"] == "mydev", run
        tolerance = dict(rtol=0, atol=0) if precision == "float32" and devices == 1 else dict(rtol=1e-3, atol=0)
        torch.testing.assert_close(run["losses"], want, **tolerance, msg=precision)
    if devices == 1:
        assert out["bfloat16"]["losses"] != out["float32"]["losses"] != out["float16"]["losses"]


def test_accelerate_still_refuses_fp16_on_mydev():
    # transfer_to_mydev adds mydev to the device list in accelerate's Accelerator.__init__; once accelerate's own
    # list names mydev (or the list moves), the patch does nothing and can go.
    from accelerate import accelerator

    init = getattr(accelerator.Accelerator.__init__, "_torch_original", accelerator.Accelerator.__init__)
    lists = [c for c in init.__code__.co_consts if isinstance(c, tuple) and "cuda" in c and "npu" in c]
    assert len(lists) == 1 and "mydev" not in lists[0]
