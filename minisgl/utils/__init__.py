from .device import DeviceKit, Event, Stream, resolve_device
from .events import EngineEvent, EventLog

__all__ = ["DeviceKit", "Event", "Stream", "resolve_device", "EngineEvent", "EventLog"]
