"""Messages as bytes, for the sockets between the server's processes.

A frame holds a batch: a JSON array of messages. A message is a JSON object of its fields plus
`"__msg__": <class name>`; a token tensor is `{"__tensor__": [ids], "dtype": "int32"}`, sampling
parameters `{"__sampling__": {fields}}`. JSON (the standard library's) rather than pickle: a frame
can be read by a person, written by another language, and decoding it cannot run code.

    decode_batch(encode_batch(msgs)) == msgs   (tensors compared by value)
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List

import torch

from minisgl.core import SamplingParams

from . import AbortBackendMsg, DetokenizeMsg, UserMsg
from .frontend import AbortMsg, StatsQuery, StatsReply, TokenizeMsg, UserReply

MESSAGE_TYPES: Dict[str, type] = {cls.__name__: cls for cls in (
    UserMsg, AbortBackendMsg, DetokenizeMsg, TokenizeMsg, AbortMsg, StatsQuery, StatsReply, UserReply)}
TENSOR_DTYPES = {"int32": torch.int32, "int64": torch.int64}


def encode_batch(msgs: List[Any]) -> bytes:
    """One frame holding `msgs`, in order."""
    return json.dumps([_encode_value(m) for m in msgs], separators=(",", ":")).encode()


def decode_batch(frame: bytes) -> List[Any]:
    """The messages of one frame; ValueError naming the problem for a frame that is not one."""
    try:
        items = json.loads(frame, object_hook=_revive)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"a message frame must be JSON: {e}") from None
    if not isinstance(items, list):
        raise ValueError(f"a message frame must be a JSON array, got {type(items).__name__}")
    bad = next((m for m in items if type(m).__name__ not in MESSAGE_TYPES), None)
    if bad is not None:
        raise ValueError(f"a message frame holds {bad!r}, which is not a message")
    return items


def _encode_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in TENSOR_DTYPES or value.dim() != 1:
            raise TypeError(f"only 1-D int32/int64 tensors travel in messages, got {value.dim()}-D {dtype}")
        return {"__tensor__": value.tolist(), "dtype": dtype}
    if isinstance(value, SamplingParams):
        return {"__sampling__": dataclasses.asdict(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if name not in MESSAGE_TYPES:
            raise TypeError(f"{name} is not a message type")
        fields = {f.name: _encode_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"__msg__": name, **fields}
    if isinstance(value, (list, tuple)):
        return [_encode_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode_value(v) for k, v in value.items()}
    return value


def _revive(obj: Dict[str, Any]) -> Any:
    """json's object_hook: called on every decoded object, innermost first."""
    if "__tensor__" in obj:
        dtype = TENSOR_DTYPES.get(obj.get("dtype"))
        if dtype is None:
            raise ValueError(f"a tensor in a message has dtype {obj.get('dtype')!r}")
        return torch.tensor(obj["__tensor__"], dtype=dtype)
    if "__sampling__" in obj:
        return SamplingParams(**obj["__sampling__"])  # validates its fields
    if "__msg__" in obj:
        name = obj.pop("__msg__")
        cls = MESSAGE_TYPES.get(name)
        if cls is None:
            raise ValueError(f"unknown message type {name!r}")
        try:
            return cls(**obj)
        except TypeError as e:
            raise ValueError(f"a {name} with the wrong fields: {e}") from None
    return obj
