from .events import EngineEvent, EventLog
from .streams import DeviceKit, Event, Stream, resolve_device

__all__ = ["DeviceKit", "Event", "Stream", "resolve_device", "EngineEvent", "EventLog"]
