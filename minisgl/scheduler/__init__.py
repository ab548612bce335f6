from .cache import CacheManager, pages_for
from .config import SchedulerConfig
from .decode import DecodeManager
from .io import QueueIO, SchedulerIO
from .prefill import ChunkedReq, PendingReq, PrefillAdder, PrefillManager
from .scheduler import ForwardData, Scheduler
from .table import TableManager

__all__ = [
    "CacheManager",
    "pages_for",
    "SchedulerConfig",
    "DecodeManager",
    "QueueIO",
    "SchedulerIO",
    "ChunkedReq",
    "PendingReq",
    "PrefillAdder",
    "PrefillManager",
    "ForwardData",
    "Scheduler",
    "TableManager",
]
