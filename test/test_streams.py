"""Streams and events on mydev through torch.mydev, torch.Stream/torch.Event and torch.accelerator."""
import pytest
import torch


def test_current_and_default_stream():
    s0 = torch.mydev.current_stream()
    assert s0 == torch.mydev.default_stream()
    assert s0.stream_id == 0 and s0.device == torch.device("mydev:0")
    assert torch.mydev.current_stream(1).device_index == 1


def test_stream_context_sets_and_restores():
    s = torch.mydev.Stream()
    assert s != torch.mydev.default_stream()
    x = torch.randn(100)
    with torch.mydev.stream(s):
        assert torch.mydev.current_stream() == s
        y = torch.as_tensor(x).to("mydev") * 3
    assert torch.mydev.current_stream() == torch.mydev.default_stream()
    s.synchronize()
    torch.testing.assert_close(y.cpu(), x * 3)


def test_stream_on_other_device_switches_device_in_context():
    s = torch.mydev.Stream(device=1)
    with torch.mydev.stream(s):
        assert torch.mydev.current_device() == 1
        assert torch.mydev.current_stream(1) == s
        z = torch.ones(3, device="mydev")
    assert z.device.index == 1
    assert torch.mydev.current_device() == 0


def test_priorities():
    least, greatest = torch.mydev.streams._C._stream_priority_range()
    assert (least, greatest) == (0, -1)
    assert torch.mydev.Stream(priority=-1).priority == -1
    assert torch.mydev.Stream(priority=0).priority == 0


def test_torch_stream_and_accelerator():
    s = torch.Stream(device="mydev")
    with s:
        assert torch.accelerator.current_stream() == s
    assert torch.accelerator.current_stream().stream_id == 0
    assert s.query()
    s.synchronize()


def test_events_order_and_time():
    a = torch.randn(256, 256, device="mydev")
    start = torch.mydev.Event(enable_timing=True)
    end = torch.mydev.Event(enable_timing=True)
    start.record()
    b = a @ a
    end.record()
    end.synchronize()
    assert start.query() and end.query()
    assert start.elapsed_time(end) >= 0
    torch.testing.assert_close(b.cpu(), a.cpu() @ a.cpu(), rtol=1e-4, atol=1e-4)


def test_elapsed_time_without_timing_raises_value_error():
    e1, e2 = torch.mydev.Event(), torch.mydev.Event()
    e1.record()
    e2.record()
    with pytest.raises(ValueError, match="enable_timing"):
        e1.elapsed_time(e2)
    t1, t2 = torch.Event(device="mydev", enable_timing=True), torch.Event(device="mydev", enable_timing=True)
    t1.record()
    t2.record()
    t2.synchronize()  # as on CUDA, both events must have completed
    assert t1.elapsed_time(t2) >= 0


def test_wait_stream_wait_event_record_stream():
    s1, s2 = torch.mydev.Stream(), torch.mydev.Stream()
    x = torch.randn(1000)
    with torch.mydev.stream(s1):
        d = x.to("mydev") + 1
        ev = s1.record_event()
    s2.wait_event(ev)
    s2.wait_stream(s1)
    with torch.mydev.stream(s2):
        e = d * 2
        d.record_stream(s2)
    torch.mydev.synchronize()
    torch.testing.assert_close(e.cpu(), (x + 1) * 2)


def test_torch_event_subclass_limitation():
    # torch 2.13's torch.Event.elapsed_time and torch.Stream.record_event reject
    # subclasses, so my_device.mydev.Event/Stream override them. When this test
    # fails, PyTorch accepts subclasses: delete the overrides in streams.py.
    class Sub(torch.Event):
        pass

    a, b = Sub(device="mydev", enable_timing=True), Sub(device="mydev", enable_timing=True)
    a.record()
    b.record()
    with pytest.raises(RuntimeError, match="expected other to be a torch.Event"):
        torch.Event.elapsed_time(a, b)
    with pytest.raises(RuntimeError, match="expected event to be a torch.Event"):
        torch.Stream(device="mydev").record_event(a)


def test_mydev_events_work_with_streams():
    s = torch.mydev.Stream()
    e = torch.mydev.Event(enable_timing=True)
    assert s.record_event(e) is e
    f = s.record_event()
    assert isinstance(f, torch.mydev.Event)
    f.synchronize()
    with pytest.raises(ValueError, match="enable_timing"):
        e.elapsed_time(f)
    g = s.record_event(torch.mydev.Event(enable_timing=True))
    g.synchronize()
    assert e.elapsed_time(g) >= 0
