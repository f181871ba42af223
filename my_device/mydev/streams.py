"""Streams and events on mydev, mirroring torch.cuda.streams.

A stream is an in-order queue of device work; events mark points in a stream
so other streams or the host can wait for them. Both subclass the device-generic
torch.Stream / torch.Event, so their methods (wait_stream, wait_event,
record_event, query, synchronize, elapsed_time) are PyTorch's own."""
from typing import Optional

import torch

from .. import _C

__all__ = ["Stream", "Event", "current_stream", "default_stream", "set_stream", "stream", "StreamContext"]


class Stream(torch.Stream):
    """A mydev stream on `device` (default: the current device). Lower `priority`
    numbers run first when streams compete, as on CUDA (0 or -1): while a stream has
    queued work it can run, lower-priority streams on its device start no new kernel."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        from . import _get_device_index, _lazy_init

        _lazy_init()
        index = _get_device_index(device, optional=True)
        return super().__new__(cls, device=torch.device("mydev", index), priority=priority)

    @property
    def priority(self) -> int:
        return _C._stream_priority(self.stream_id, self.device_index)

    # torch.Stream.record_event only accepts an exact torch.Event (torch 2.13),
    # so a my_device.mydev.Event is recorded from its own side.
    # test_streams.py::test_torch_event_subclass_limitation notices when that changes.
    def record_event(self, event: Optional[torch.Event] = None) -> torch.Event:
        if event is None:
            event = Event()
        event.record(self)
        return event

    def __repr__(self):
        return f"<my_device.mydev.Stream device=mydev:{self.device_index} stream_id={self.stream_id}>"


class Event(torch.Event):
    """A mydev event. `enable_timing=True` is needed for elapsed_time()."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(cls, device="mydev", enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    # torch.Event.elapsed_time only accepts an exact torch.Event on either side
    # (torch 2.13); event_id is the runtime's event handle, so ask the runtime.
    # test_streams.py::test_torch_event_subclass_limitation notices when that changes.
    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds between this event and `end_event`, both recorded and complete."""
        return _C._event_elapsed_time(self.event_id, end_event.event_id)


def _wrap(stream_tuple) -> Stream:
    stream_id, device_index, device_type = stream_tuple
    return Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


def current_stream(device=None) -> Stream:
    """The stream this thread queues work on for `device`."""
    from . import _get_device_index, _lazy_init

    _lazy_init()
    return _wrap(_C._current_stream(_get_device_index(device, optional=True)))


def default_stream(device=None) -> Stream:
    from . import _get_device_index, _lazy_init

    _lazy_init()
    return _wrap(_C._default_stream(_get_device_index(device, optional=True)))


def set_stream(stream: torch.Stream) -> None:
    """Makes `stream` the current stream of its device on this thread."""
    if stream is None:
        return
    _C._set_stream(stream.stream_id, stream.device_index)


class StreamContext:
    """Makes a stream current (and its device current) for a block, restoring both after."""

    def __init__(self, stream: Optional[torch.Stream]):
        self.stream = stream
        self.prev_device = -1
        self.prev_streams = ()

    def __enter__(self):
        if self.stream is None:
            return self.stream
        self.prev_device = _C._exchange_device(self.stream.device_index)
        self.prev_streams = (current_stream(self.stream.device_index), current_stream(self.prev_device))
        set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.stream is None:
            return False
        for s in self.prev_streams:
            set_stream(s)
        _C._set_device(self.prev_device)
        return False


def stream(stream: Optional[torch.Stream]) -> StreamContext:
    """Context manager: run the block's device work on `stream`."""
    return StreamContext(stream)
