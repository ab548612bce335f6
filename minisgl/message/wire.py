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
from .api_server import AbortMsg, StatsQuery, StatsReply, TokenizeMsg, UserReply
from .field_types import mistyped_fields

MESSAGE_TYPES: Dict[str, type] = {
    cls.__name__: cls
    for cls in (
        UserMsg,
        AbortBackendMsg,
        DetokenizeMsg,
        TokenizeMsg,
        AbortMsg,
        StatsQuery,
        StatsReply,
        UserReply,
    )
}
TENSOR_DTYPES = {"int32": torch.int32, "int64": torch.int64}


def encode_batch(msgs: List[Any]) -> bytes:
    """One frame holding `msgs`, in order."""
    return json.dumps([encode_value(m) for m in msgs], separators=(",", ":")).encode()


def decode_batch(frame: bytes) -> List[Any]:
    """The messages of one frame, in order, or a ValueError saying what is wrong with it.

    A frame comes from another process, and a bad one must fail here, with a message, rather than
    as an AttributeError deep inside the scheduler's loop.

    Receives: `frame`, the bytes of one socket message: normally `encode_batch`'s output, but
        whatever a peer sent.
    Returns: the list of messages, each revived (`revive` as json.loads's `object_hook`).
    Leaves: nothing changed.
    Uses: `json.loads` with `object_hook=revive` (ch12), `MESSAGE_TYPES`.
    Checked: every message comes back equal through `encode_batch`, in order; each bad frame is
        refused with a ValueError whose text says which rule it breaks: "JSON" for bytes that are
        not UTF-8 JSON (UTF-16 or UTF-32 JSON included, a UTF-8 byte-order mark, and a byte that
        is not UTF-8 inside a JSON string: a frame is UTF-8), "array" for JSON that is not an
        array (a plain object too), "not a message" for an item that is not one (an instance of a
        class in MESSAGE_TYPES: a bare SamplingParams or tensor is not); revive's own refusals,
        whatever they are (an unknown type, wrong fields, an unknown dtype, a bad temperature,
        SamplingParams' TypeError for a field it does not know), pass through as they are.
    """
    try:
        # Decoded here, not by json.loads: given bytes, it also reads UTF-16 and UTF-32, and a
        # frame (encode_batch's output) is UTF-8 and nothing else.
        items = json.loads(frame.decode("utf-8"), object_hook=revive)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"a message frame must be JSON: {e}") from None
    if not isinstance(items, list):
        raise ValueError(f"a message frame must be a JSON array, got {type(items).__name__}")
    # A message is an instance of a class in MESSAGE_TYPES, that class itself: a SamplingParams or a
    # tensor is a message's field, and the receiving loop dispatches on the message's class.
    bad = next((m for m in items if MESSAGE_TYPES.get(type(m).__name__) is not type(m)), None)
    if bad is not None:
        raise ValueError(f"a message frame holds {bad!r}, which is not a message")
    return items


def encode_value(value: Any) -> Any:
    """A message, or any value inside one, as plain JSON values (dicts, lists, numbers, strings).

    Receives: `value`: a message (a dataclass of MESSAGE_TYPES), a 1-D int32/int64 tensor, a
        SamplingParams, a list, tuple or dict of those, or a plain JSON value.
    Returns: the JSON form: a message as a dict of its encoded fields plus `"__msg__": <class
        name>`; a tensor as `{"__tensor__": [ids], "dtype": "int32"}`; SamplingParams as
        `{"__sampling__": {fields}}`; lists, tuples and dicts element by element; anything else
        as it is.
    Leaves: `value` unchanged, and every dict or list inside it (the caller's).
    Uses: `dataclasses.fields` (a message's fields, each encoded by this function in turn),
        `dataclasses.asdict` (only for SamplingParams, whose fields are plain values: on a message
        it would turn the nested SamplingParams into an untagged dict and its tensors into
        tensors), `MESSAGE_TYPES`, `TENSOR_DTYPES`.
    Checked: every message type comes back equal through `decode_batch` (tensors with their dtype,
        sampling parameters as SamplingParams); a tuple's items are encoded like a list's; a
        dataclass that is not a message (its class is not the one MESSAGE_TYPES holds under its
        name: a look-alike, a subclass of a message) is refused with a TypeError naming its
        class, a tensor that is not 1-D (0-D included) with one saying "1-D", one of another
        dtype (float32, int16, uint8, bool) with one naming its dtype.
    """
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in TENSOR_DTYPES or value.dim() != 1:
            raise TypeError(
                f"only 1-D int32/int64 tensors travel in messages, got {value.dim()}-D {dtype}"
            )
        return {"__tensor__": value.tolist(), "dtype": dtype}
    if isinstance(value, SamplingParams):
        return {"__sampling__": dataclasses.asdict(value)}
    if dataclasses.is_dataclass(value):
        name = type(value).__name__
        if MESSAGE_TYPES.get(name) is not type(value):  # the class itself, not one named like it
            raise TypeError(f"{name} (from {type(value).__module__}) is not a message type")
        fields = {f.name: encode_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"__msg__": name, **fields}
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    if isinstance(value, dict):
        return {k: encode_value(v) for k, v in value.items()}
    return value


def revive(obj: Dict[str, Any]) -> Any:
    """Turn one decoded JSON object back into what `encode_value` made it from.

    json.loads calls it on every object it decodes, innermost first, so the fields of a message are
    already revived when the message itself is.

    Receives: `obj`, a dict just decoded from JSON.
    Returns: a tensor for a `"__tensor__"` dict (of its dtype: a 1-D tensor of the ids, one id
        included, which must be a flat list of integers that fit in it), a SamplingParams for
        a `"__sampling__"` dict (validated: bad values raise), a message for a `"__msg__"` dict
        naming a class of MESSAGE_TYPES (no other name: not SamplingParams, nor anything else
        minisgl.message imports; a name that is not a string names no class) whose fields are
        its class's (one with a default may be left out), each of its declared type; any other
        dict as it is (a chat message, the scheduler's stats).
    Leaves: `obj` unchanged, whatever its tag, and every dict inside it (json.loads's, or a
        caller's that may keep it).
    Uses: `MESSAGE_TYPES`, `TENSOR_DTYPES`, `SamplingParams` (ch01), `mistyped_fields(message)`
        (given: each field of a built message whose value is not of its declared type).
    Checked: every message comes back equal; each refusal is a ValueError that names what is
        wrong: `unknown message type 'Shutdown'` (the name as repr writes it, in quotes; an empty
        name too, `unknown message type ''`, and a list, `unknown message type ['AbortMsg']`),
        the class and the field for a message with the wrong fields (one its class does not
        have, one it lacks, or one of the wrong type: `AbortMsg` ... `pid`; a known class, so
        never `unknown message type`), the
        dtype as repr writes it (`'float16'`, quoted) for a tensor whose dtype is unknown,
        missing (`None`) or not a string, the ids as repr writes them for ids that are not a
        flat list of integers (`[1.5]`, `[True]`, `[[1, 2]]`, `5`) or do not fit in the dtype
        (`[2**40]` as int32, `[2**70]` as int64; `[2**40]` fits in int64, and `[]` is a
        tensor of no ids),
        the value for sampling parameters that are not an object (`[1]`); SamplingParams' own
        errors go through as they are (a ValueError naming the field, a TypeError for a field
        it does not know).
    """
    if "__tensor__" in obj:
        ids, name = obj["__tensor__"], obj.get("dtype")
        # a missing dtype is None; a list is unhashable: neither may fail as a lookup's error
        dtype = TENSOR_DTYPES.get(name) if isinstance(name, str) else None
        if dtype is None:
            raise ValueError(
                f"a tensor in a message has dtype {name!r}, expected one of {sorted(TENSOR_DTYPES)}"
            )
        # torch.tensor would truncate 1.5, count true as 1 and build a 2-D tensor from nested
        # lists, none of which encode_value ever writes
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise ValueError(f"a tensor in a message is a flat list of integer ids, got {ids!r}")
        # torch.tensor's overflow errors (int32: RuntimeError, int64: ValueError) show no ids
        info = torch.iinfo(dtype)
        if not all(info.min <= i <= info.max for i in ids):
            raise ValueError(f"a tensor in a message has ids {ids!r} that do not fit in {name}")
        return torch.tensor(ids, dtype=dtype)
    if "__sampling__" in obj:
        fields = obj["__sampling__"]
        if not isinstance(fields, dict):  # SamplingParams(**[1]) is a TypeError naming nothing
            raise ValueError(f"sampling parameters in a message are an object, got {fields!r}")
        return SamplingParams(**fields)  # validates its fields
    if "__msg__" in obj:
        name = obj["__msg__"]
        cls = MESSAGE_TYPES.get(name) if isinstance(name, str) else None  # a list is unhashable
        if cls is None:
            raise ValueError(f"unknown message type {name!r}")
        fields = {k: v for k, v in obj.items() if k != "__msg__"}  # `obj` is the caller's
        try:
            message = cls(**fields)  # refuses a field the class lacks, or one missing
        except TypeError as e:
            raise ValueError(f"a {name} with the wrong fields: {e}") from None
        wrong = mistyped_fields(message)  # a dataclass checks no type itself
        if wrong:
            raise ValueError(f"a {name} with the wrong fields: {', '.join(wrong)}")
        return message
    return obj
