"""Chapter 12: the server's messages as bytes (minisgl/message/wire.py). Every message survives the
trip; a frame is plain JSON a person can read; decoding refuses what is not a message, naming it,
and checks sampling parameters again."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortBackendMsg,
    AbortMsg,
    DetokenizeMsg,
    StatsQuery,
    StatsReply,
    TokenizeMsg,
    UserMsg,
    UserReply,
)
from minisgl.message.wire import MESSAGE_TYPES, decode_batch, encode_batch, encode_value, revive
from refusals import raised, refused_as_wanted, refuses

# as the server builds them: the fields the client sent are the ones set
SET = ["ignore_eos", "max_tokens", "temperature", "top_k", "top_p"]
PARAMS = SamplingParams(
    temperature=0.7, top_k=5, top_p=0.9, max_tokens=4, ignore_eos=True, fields_set=SET
)
MESSAGES = [
    UserMsg(uid=3, input_ids=torch.tensor([5, 6, 7], dtype=torch.int32), sampling_params=PARAMS),
    AbortBackendMsg(uid=3),
    DetokenizeMsg(uid=3, next_token=9, finished=True),
    DetokenizeMsg(uid=4, next_token=-1, finished=True, error="the prompt is empty"),
    TokenizeMsg(
        uid=5,
        sampling_params=SamplingParams(),
        messages=[{"role": "user", "content": "Héllo 🌹"}],
        fill_context=True,
    ),
    TokenizeMsg(uid=6, sampling_params=SamplingParams(), input_ids=[1, 2]),
    AbortMsg(uid=5),
    StatsQuery(uid=7),
    StatsReply(uid=7, stats={"slots_free": 8, "idle_integrity": None}),
    UserReply(
        uid=5, text="né", token_ids=[1, 2], finished=True, finish_reason="stop", prompt_tokens=3
    ),
]


class TracedAbortMsg(AbortMsg):
    """A subclass of a message: the receiver looks its name up in MESSAGE_TYPES and refuses it, so
    the sender must refuse it first."""


def same(a, b) -> bool:
    """Messages equal field by field, tensors by value and dtype."""
    if type(a) is not type(b):
        return False
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            if not (
                isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.tolist() == y.tolist()
            ):
                return False
        elif x != y:
            return False
    return True


TAGS = {torch.Tensor: "__tensor__", SamplingParams: "__sampling__"}


def encoded_with_its_tags(msg) -> None:
    """A round trip's first check, on the sender's side: every tensor or sampling-parameters field
    of `msg` is encoded under its tag, so a frame that lost one fails as encode_value's mistake,
    not as the receiver's refusal of what it was sent."""
    encoded = encode_value(msg)
    assert isinstance(encoded, dict) and encoded.get("__msg__") == type(msg).__name__, (
        f"encode_value({type(msg).__name__}(...)) gave {encoded!r}: a message is encoded as its "
        f"fields and its name, {{'__msg__': {type(msg).__name__!r}, ...}}"
    )
    for f in dataclasses.fields(msg):
        tag = next((t for k, t in TAGS.items() if isinstance(getattr(msg, f.name), k)), None)
        got = encoded.get(f.name)
        assert tag is None or (isinstance(got, dict) and tag in got), (
            f"a message's fields are encoded too: a {type(msg).__name__}'s {f.name} goes under "
            f"{tag!r}, so that the receiver can revive it (dataclasses.asdict on the whole message "
            f"drops that tag); encode_value wrote it as {repr(got)[:80]}"
        )


def encode_with_sampling_params(value, what: str):
    """encode_value(value) for a value holding a SamplingParams; a TypeError naming it is the
    encoder's rule broken, said as that: SamplingParams is a dataclass but not a message."""
    try:
        return encode_value(value)
    except TypeError as e:
        refused_as_wanted(
            e,
            "SamplingParams" not in str(e),
            f"encode_value({what}) raised TypeError: {e}; SamplingParams is a dataclass but not a "
            "message: it travels under its own tag, {'__sampling__': its fields}, so it is "
            "recognised before a dataclass is refused for not being in MESSAGE_TYPES",
        )
        raise


def test_a_tensor_travels_as_its_ids_and_dtype():
    for dtype, name in ((torch.int32, "int32"), (torch.int64, "int64")):
        got = encode_value(torch.tensor([5, 6, 7], dtype=dtype))
        want = {"__tensor__": [5, 6, 7], "dtype": name}
        assert got == want, f"a {name} tensor [5, 6, 7] should encode as {want}, got {got}"


def test_sampling_params_travel_as_their_fields():
    got = encode_with_sampling_params(PARAMS, "SamplingParams(...)")
    want = {
        "__sampling__": {
            "temperature": 0.7,
            "top_k": 5,
            "top_p": 0.9,
            "max_tokens": 4,
            "ignore_eos": True,
            "stop": [],
            "stop_token_ids": [],
            "seed": None,
            "logprobs": None,
            "prompt_logprobs": False,
            "constraint": None,
            # which fields the client gave: the scheduler fills the others from the model's
            # generation_config.json, so it must know them after the trip too
            "fields_set": SET,
        }
    }
    assert got == want, f"SamplingParams should encode as {want}, got {got}"


def test_sampling_params_keep_which_fields_were_given_across_the_wire():
    sent = SamplingParams(temperature=0.5, max_tokens=3, fields_set=["temperature", "max_tokens"])
    user = UserMsg(uid=1, input_ids=torch.tensor([5, 6], dtype=torch.int32), sampling_params=sent)
    encoded_with_its_tags(user)
    (msg,) = decode_batch(encode_batch([user]))
    assert isinstance(msg.sampling_params, SamplingParams), (
        "a UserMsg's sampling parameters should arrive as SamplingParams, got "
        f"{type(msg.sampling_params).__name__} {msg.sampling_params!r}: encode them as "
        "{'__sampling__': fields} (dataclasses.asdict on the whole message drops that tag) and "
        "revive that tag"
    )
    got = msg.sampling_params.fields_set
    assert got == ["max_tokens", "temperature"], (
        f"a request that set temperature and max_tokens should arrive with those two set (the "
        f"others take the model's defaults), got {got}"
    )


def test_a_message_is_its_fields_and_its_name():
    got = encode_value(DetokenizeMsg(uid=3, next_token=9, finished=True))
    want = {
        "__msg__": "DetokenizeMsg",
        "uid": 3,
        "next_token": 9,
        "finished": True,
        "error": None,
        "logprobs": None,
    }
    assert got == want, f"a DetokenizeMsg should encode as {want}, got {got}"
    user = encode_with_sampling_params(MESSAGES[0], "a UserMsg")
    assert user.get("input_ids") == {
        "__tensor__": [5, 6, 7],
        "dtype": "int32",
    } and "__sampling__" in user.get("sampling_params", {}), (
        f"a message's fields are encoded too (its tensor and its sampling params), got {user}"
    )
    chat = encode_value(MESSAGES[4])
    assert chat.get("messages") == [{"role": "user", "content": "Héllo 🌹"}], (
        f"lists and dicts inside a message are kept, element by element; got {chat.get('messages')}"
    )


def test_lists_tuples_and_dicts_are_encoded_item_by_item():
    value = [
        DetokenizeMsg(uid=1, next_token=2, finished=False),
        {"ids": torch.tensor([4], dtype=torch.int32)},
        (1, 2),
        (torch.tensor([3], dtype=torch.int64), AbortMsg(uid=2)),
    ]
    got = encode_value(value)
    want = [
        {
            "__msg__": "DetokenizeMsg",
            "uid": 1,
            "next_token": 2,
            "finished": False,
            "error": None,
            "logprobs": None,
        },
        {"ids": {"__tensor__": [4], "dtype": "int32"}},
        [1, 2],
        [{"__tensor__": [3], "dtype": "int64"}, {"__msg__": "AbortMsg", "uid": 2}],
    ]
    at = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
    assert got == want and isinstance(got[2], list), (
        f"encode_value({value!r}): item {at} should encode as {want[at]!r}, got {got[at]!r} "
        "(a tuple becomes a list of its items, each encoded in turn)"
        if at is not None
        else f"expected {want} (each tuple as a list of its encoded items), got {got}"
    )


def test_encoded_values_are_plain_json():
    for msg in MESSAGES:
        encoded = encode_value(msg)
        try:
            back = json.loads(json.dumps(encoded))
        except TypeError as e:
            raise AssertionError(
                f"{type(msg).__name__} did not encode to plain JSON values: {e}"
            ) from None
        assert back == encoded, (
            f"{type(msg).__name__}: only JSON's own types may remain (no tuples), got {encoded}"
        )


def test_encoding_leaves_the_message_alone():
    msg = UserMsg(
        uid=1, input_ids=torch.tensor([1, 2], dtype=torch.int32), sampling_params=SamplingParams()
    )
    encode_value(msg)
    assert isinstance(msg.input_ids, torch.Tensor) and isinstance(
        msg.sampling_params, SamplingParams
    ), "encoding must not change the message it encodes"


def test_encoding_leaves_the_callers_dicts_and_lists_alone():
    ids = torch.tensor([4], dtype=torch.int32)
    inner = {"ids": ids}
    outer = [inner, [ids]]
    encode_value(outer)
    assert inner["ids"] is ids and outer[1][0] is ids and outer[0] is inner, (
        f"encode_value([{{'ids': tensor}}, [tensor]]) changed what it was given: it is now "
        f"{outer}; build new dicts and lists, the caller may still use its own"
    )


@pytest.mark.parametrize(
    "value,words",
    [
        (dataclasses.make_dataclass("Shutdown", ["uid"])(1), "Shutdown"),
        # a class is a message only if it is the one MESSAGE_TYPES holds: not any named like it
        (dataclasses.make_dataclass("UserMsg", ["uid"])(1), "UserMsg"),
        # nor a subclass of one: the receiver finds no class of that name
        (TracedAbortMsg(uid=1), "TracedAbortMsg"),
        (torch.zeros(2, 2, dtype=torch.int32), "1-D"),
        (torch.tensor(5, dtype=torch.int32), "1-D"),
        (torch.tensor([0.5]), "float"),
        # only int32 and int64 travel: not "anything but floats"
        (torch.tensor([1, 2], dtype=torch.int16), "int16"),
        (torch.tensor([1, 2], dtype=torch.uint8), "uint8"),
        (torch.tensor([True]), "bool"),
    ],
    ids=[
        "not a message",
        "a dataclass named like a message",
        "a subclass of a message",
        "2-D tensor",
        "0-D tensor",
        "float tensor",
        "int16 tensor",
        "uint8 tensor",
        "bool tensor",
    ],
)
def test_what_cannot_travel_is_refused(value, words):
    with refuses(TypeError, f"encode_value({value!r})", naming=words):
        encode_value(value)


def test_revive_rebuilds_each_tagged_object():
    t = revive({"__tensor__": [1, 2], "dtype": "int64"})
    assert isinstance(t, torch.Tensor) and t.dtype == torch.int64 and t.tolist() == [1, 2], (
        f"a tagged tensor should come back as an int64 tensor [1, 2], got {t!r}"
    )
    p = revive({"__sampling__": dataclasses.asdict(PARAMS)})
    assert p == PARAMS, f"tagged sampling params should come back as {PARAMS}, got {p!r}"
    m = revive({"__msg__": "AbortMsg", "uid": 3})
    assert m == AbortMsg(uid=3), f"a tagged message should come back as AbortMsg(uid=3), got {m!r}"
    plain = {"role": "user", "content": "hi"}
    assert revive(dict(plain)) == plain, (
        f"an untagged dict (a chat message, stats) stays a dict, got {revive(dict(plain))!r}"
    )


@pytest.mark.parametrize(
    "obj,words",
    [
        ({"__msg__": "Shutdown", "uid": 1}, "unknown message type 'Shutdown'"),
        # a tag with an empty or null name is still a tag: not a plain dict
        ({"__msg__": "", "uid": 1}, "unknown message type ''"),
        ({"__msg__": None, "uid": 1}, "unknown message type None"),
        # only MESSAGE_TYPES' names: not whatever minisgl.message happens to import
        ({"__msg__": "SamplingParams", "top_k": 5}, "unknown message type 'SamplingParams'"),
        ({"__msg__": "BackendMsg", "uid": 1}, "unknown message type 'BackendMsg'"),
        # a list is no class's name (and unhashable: no dict lookup may raise TypeError on it)
        ({"__msg__": ["AbortMsg"], "uid": 1}, "unknown message type ['AbortMsg']"),
        # a known class with bad fields: refused naming the class and the field, not as unknown
        ({"__msg__": "AbortMsg", "pid": 1}, ("AbortMsg", "pid")),
        ({"__msg__": "AbortMsg"}, ("AbortMsg", "uid")),
        ({"__msg__": "AbortMsg", "uid": "x"}, ("AbortMsg", "uid")),
        ({"__msg__": "DetokenizeMsg", "uid": 1, "next_token": 2, "finished": "no"}, "finished"),
        ({"__msg__": "DetokenizeMsg", "uid": 1, "next_token": "2", "finished": True}, "next_token"),
        # as repr writes it, in quotes: an empty or spaced name must show in a log
        ({"__tensor__": [1], "dtype": "float16"}, "'float16'"),
        # torch.tensor would truncate 1.5 to 1, take true as 1, build 2-D or 0-D tensors
        ({"__tensor__": [1.5], "dtype": "int64"}, "[1.5]"),
        ({"__tensor__": [1, 2.5], "dtype": "int64"}, "[1, 2.5]"),
        # whole-number floats too: encode_value never writes 5.0, so a sender that did is not it
        ({"__tensor__": [5.0, 2.0], "dtype": "int64"}, "[5.0, 2.0]"),
        ({"__tensor__": [True], "dtype": "int32"}, "[True]"),
        ({"__tensor__": [[1, 2]], "dtype": "int64"}, "[[1, 2]]"),
        ({"__tensor__": 5, "dtype": "int64"}, "5"),
        # the dtype missing, or not a string: no KeyError, no unhashable TypeError
        ({"__tensor__": [1]}, ("dtype", "None")),
        ({"__tensor__": [1], "dtype": ["int32"]}, ("dtype", "['int32']")),
        # torch.tensor raises a RuntimeError (int32) or a ValueError (int64) about overflow that
        # shows no ids: the range is the named dtype's, int64's too
        ({"__tensor__": [2**40], "dtype": "int32"}, ("[1099511627776]", "int32")),
        ({"__tensor__": [2**70], "dtype": "int64"}, ("[1180591620717411303424]", "int64")),
        ({"__tensor__": [-(2**63) - 1], "dtype": "int64"}, ("[-9223372036854775809]", "int64")),
        # each end of int32's range, one past it, and a bad id that is not the first
        ({"__tensor__": [2**31], "dtype": "int32"}, ("[2147483648]", "int32")),
        ({"__tensor__": [-(2**31) - 1], "dtype": "int32"}, ("[-2147483649]", "int32")),
        ({"__tensor__": [1, 2**40], "dtype": "int32"}, ("[1, 1099511627776]", "int32")),
        # SamplingParams(**[1]) is a TypeError that names no field
        ({"__sampling__": [1]}, "[1]"),
        ({"__sampling__": {"temperature": -1}}, "temperature"),
        ({"__sampling__": {"top_p": 0}}, "top_p"),
    ],
    ids=[
        "unknown type",
        "empty type name",
        "null type name",
        "a class of minisgl.message outside MESSAGE_TYPES",
        "a base class of the messages",
        "a list as the type name",
        "wrong fields",
        "a missing field",
        "a field of the wrong type",
        "a bool field given a string",
        "an int field other than uid given a string",
        "unknown dtype",
        "float ids",
        "a float among int ids",
        "whole-number float ids",
        "boolean ids",
        "nested ids",
        "ids not a list",
        "no dtype",
        "a list as the dtype",
        "ids too large for the dtype",
        "ids too large for int64",
        "ids too small for int64",
        "one past int32's largest",
        "one past int32's smallest",
        "a second id too large for the dtype",
        "sampling parameters not an object",
        "bad temperature",
        "bad top_p",
    ],
)
def test_revive_refuses_naming_the_problem(obj, words):
    words = words if isinstance(words, tuple) else (words,)
    wanted = f"a ValueError naming {' and '.join(map(repr, words))}"
    err = raised(lambda: revive(dict(obj)), f"revive({obj})", wanted)
    # the kind of refusal, not only its words: a known class given bad fields is no unknown type
    name = obj.get("__msg__")
    if isinstance(name, str) and name in MESSAGE_TYPES:
        refused_as_wanted(
            err,
            "unknown message type" not in str(err),
            f"revive({obj}) said {str(err)!r}, but {name} is a known message type: a message "
            "with the wrong fields is refused as that, naming the class and the field (a try "
            "around both the lookup and the class's call cannot tell the two apart)",
        )
    missing = [w for w in words if w not in str(err)]
    refused_as_wanted(
        err,
        isinstance(err, ValueError) and not missing,
        f"revive({obj}) raised {type(err).__name__}: {err}; expected a ValueError naming "
        f"{' and '.join(map(repr, words))}",
    )


@pytest.mark.parametrize(
    "ids,dtypes",
    [
        ([5], ("int32", "int64")),
        # a flat list of integers, none of them: a 1-D tensor of shape (0,), as encode_value
        # writes an empty token list
        ([], ("int32", "int64")),
        ([5, 6, 7], ("int32", "int64")),
        ([-(2**31), 2**31 - 1], ("int32", "int64")),
        # the range is the named dtype's: int32's limits do not bound an int64 tensor
        ([2**40, -(2**40)], ("int64",)),
        ([-(2**63), 2**63 - 1], ("int64",)),
    ],
    ids=[
        "one id",
        "no ids",
        "three ids",
        "the int32 limits",
        "int64 ids past int32",
        "the int64 limits",
    ],
)
def test_revive_gives_a_one_dimensional_tensor_of_the_ids(ids, dtypes):
    """A one-token prompt is a 1-D tensor of one id, not a 0-D scalar: the scheduler takes its
    length and slices it."""
    for dtype in dtypes:
        obj = {"__tensor__": list(ids), "dtype": dtype}
        try:
            t = revive(dict(obj))
        except (ValueError, TypeError) as e:
            pytest.fail(
                f"revive({obj}) raised {type(e).__name__}: {e}; expected a 1-D tensor of shape "
                f"({len(ids)},): the ids are a flat list of integers (none at all is one too) "
                f"that fit in {dtype}",
                pytrace=False,
            )
        assert isinstance(t, torch.Tensor) and tuple(t.shape) == (len(ids),), (
            f"revive({{'__tensor__': {ids}, 'dtype': {dtype!r}}}) gave "
            f"{t!r} of shape {tuple(getattr(t, 'shape', ()))}, expected a 1-D tensor of shape "
            f"({len(ids)},)"
        )
        assert str(t.dtype) == f"torch.{dtype}" and t.tolist() == ids, (
            f"revive({{'__tensor__': {ids}, 'dtype': {dtype!r}}}) gave {t!r}"
        )


def test_revive_leaves_the_dict_it_was_given_alone():
    """Every tag's dict, revived or refused, and the dicts inside it: a caller may keep them."""
    for obj in (
        {"__msg__": "AbortMsg", "uid": 3},
        {"__msg__": "Shutdown", "uid": 1},
        {"__msg__": "AbortMsg", "uid": "x"},
        {"__msg__": "StatsReply", "uid": 7, "stats": {"slots_free": 8}},
        {"__tensor__": [1, 2], "dtype": "int32"},
        {"__tensor__": [1], "dtype": "float16"},
        {"__sampling__": dataclasses.asdict(PARAMS)},
        {"__sampling__": {"temperature": 0.5}},
        {"__sampling__": {"temperature": -1}},
    ):
        before = copy.deepcopy(obj)
        try:
            revive(obj)
        except (ValueError, TypeError):
            pass  # refusing is allowed; changing the caller's dict is not
        assert obj == before, (
            f"revive changed the dict it was given: {before} became {obj} (read the tag and the "
            "fields without popping or rewriting them: the dict, and every dict in it, is the "
            "caller's)"
        )


def test_a_field_with_a_default_may_be_left_out():
    """The class says which fields a message needs: one with a default may be absent (an older
    sender's message), one without may not (test_revive_refuses_naming_the_problem)."""
    obj = {"__msg__": "DetokenizeMsg", "uid": 1, "next_token": 2, "finished": True}
    want = DetokenizeMsg(uid=1, next_token=2, finished=True)
    try:
        m = revive(dict(obj))
    except (ValueError, TypeError) as e:
        pytest.fail(
            f"revive({obj}) raised {type(e).__name__}: {e}; DetokenizeMsg's `error` has a default "
            "(None), so a message without it is whole: the class, called with the fields given, "
            "decides which are missing"
        )
    assert same(m, want), f"revive({obj}) gave {m!r}, expected {want!r}"


BAD_SAMPLING = [{"temperature": -1}, {"top_p": 0}, {"top_k": "a"}, {"min_p": 0.1}]


@pytest.mark.parametrize(
    "fields", BAD_SAMPLING, ids=["bad temperature", "bad top_p", "top_k a string", "unknown field"]
)
def test_revive_lets_sampling_params_errors_through_as_they_are(fields):
    want = raised(lambda: SamplingParams(**fields), f"SamplingParams(**{fields})")
    obj = {"__sampling__": dict(fields)}
    got = raised(lambda: revive(obj), f"revive({obj})")
    refused_as_wanted(
        got,
        type(got) is type(want) and str(got) == str(want),
        f"revive({obj}) raised {got!r}; SamplingParams itself raises {want!r}, which already "
        "names the field: let it through as it is",
    )


@pytest.mark.parametrize(
    "obj",
    [
        {"__msg__": "Shutdown", "uid": 1},
        {"__sampling__": {"min_p": 0.1}},
        {"__msg__": "AbortMsg", "pid": 1},
        {"__msg__": "AbortMsg"},
        {"__msg__": "AbortMsg", "uid": "x"},
        {"__tensor__": [1], "dtype": "float16"},
        {"__tensor__": [1.5], "dtype": "int64"},
        {"__sampling__": {"temperature": -1}},
        {"__sampling__": {"top_p": 0}},
        {"__tensor__": [2**40], "dtype": "int32"},
        {"__sampling__": [1]},
    ],
    ids=[
        "unknown type",
        "unknown sampling field",
        "wrong fields",
        "a missing field",
        "a field of the wrong type",
        "unknown dtype",
        "float ids",
        "bad temperature",
        "bad top_p",
        "ids too large for the dtype",
        "sampling parameters not an object",
    ],
)
def test_a_frame_passes_revives_refusal_through_unchanged(obj):
    want = raised(
        lambda: revive(dict(obj)), f"revive({obj})", "a ValueError or TypeError: the object is bad"
    )
    frame = json.dumps([obj]).encode()
    got = raised(lambda: decode_batch(frame), f"decode_batch({frame!r})", f"revive's {want!r}")
    refused_as_wanted(
        got,
        type(got) is type(want) and str(got) == str(want),
        f"decode_batch({frame!r}) raised {got!r}, but revive's own refusal {want!r} already "
        "names the problem: catch only the errors of bytes that are not UTF-8 JSON",
    )


def test_a_frame_revives_the_objects_inside_its_messages_too():
    """A message's tensor and sampling parameters are objects inside it: decode_batch must have
    revive see every object of the frame, innermost first (json.loads's object_hook), not only
    the frame's items, or revive meets a message whose fields are still tagged dicts."""
    msg = MESSAGES[0]  # a UserMsg: a tensor and sampling parameters inside it
    frame = encode_batch([msg])
    try:
        got = decode_batch(frame)
        refusal = None
    except ValueError as e:
        refusal = e
    still_tagged = refusal is not None and (
        "'__tensor__'" in str(refusal) or "'__sampling__'" in str(refusal)
    )
    if still_tagged:
        pytest.fail(
            f"decode_batch({frame[:60]!r}...) handed revive a UserMsg whose fields were still "
            "tagged dicts, and revive refused it: every object of the frame must be revived, the "
            "ones inside a message first (json.loads calls its object_hook on each, innermost "
            f"first), not only the frame's items. Revive said: {str(refusal)[:160]}",
            pytrace=False,
        )
    if refusal is not None:
        raise refusal
    fields = {f: type(getattr(got[0], f, None)).__name__ for f in ("input_ids", "sampling_params")}
    assert fields == {"input_ids": "Tensor", "sampling_params": "SamplingParams"}, (
        f"decode_batch gave a UserMsg whose input_ids and sampling_params are {fields}: every "
        "object of the frame is revived, the ones inside a message too"
    )


def test_every_message_survives_the_wire():
    for msg in MESSAGES:
        encoded_with_its_tags(msg)
    got = decode_batch(encode_batch(MESSAGES))
    assert len(got) == len(MESSAGES), (
        f"{len(MESSAGES)} messages sent in one frame, {len(got)} came back"
    )
    for sent, back in zip(MESSAGES, got):
        assert same(sent, back), f"sent {sent}, got back {back}"


def test_a_frame_decodes_to_a_list_of_its_messages():
    """The contract's return type: a list, as its annotation and docstring say (a caller may append
    to it; a tuple refuses), an empty frame an empty list."""
    for frame in (encode_batch(MESSAGES[:2]), b"[]"):
        got = decode_batch(frame)
        assert type(got) is list, (
            f"decode_batch({frame[:40]!r}...) returned a {type(got).__name__} of "
            f"{len(got)} messages; the contract returns the list of messages: json.loads's list, "
            "as it is"
        )


def test_a_frame_is_a_json_array_of_messages():
    frame = encode_batch(MESSAGES[:2])
    items = json.loads(frame.decode("utf-8"))
    assert isinstance(items, list) and [i.get("__msg__") for i in items] == [
        "UserMsg",
        "AbortBackendMsg",
    ], f"a frame should be a JSON array of tagged messages, in order; got {frame[:80]!r}"


@pytest.mark.parametrize(
    "frame,words",
    [
        (b"\xff\xfe", "JSON"),
        (b"\x80", "JSON"),
        (b'["\xe2\x82', "JSON"),
        ("[]".encode("utf-16"), "JSON"),
        ("[]".encode("utf-32"), "JSON"),
        # valid JSON if read as latin-1, or with errors="replace": the UTF-8 rule alone refuses it
        (b'[{"__msg__":"StatsReply","uid":1,"stats":{"caf\xe9":1}}]', "JSON"),
        (b'["caf\xe9"]', "JSON"),
        (b"{not json", "JSON"),
        (b'{"__msg__": "AbortMsg", "uid": 1}', "array"),
        (b'{"uid": 1}', "array"),
        # JSON, but no array: null, a number, a string, a boolean
        (b"null", "array"),
        (b"3", "array"),
        (b'"AbortMsg"', "array"),
        (b"true", "array"),
        # a frame is UTF-8 as encode_batch writes it, which puts no byte-order mark first
        (b'\xef\xbb\xbf[{"__msg__": "AbortMsg", "uid": 1}]', "JSON"),
        (b'[{"__msg__": "AbortMsg", "uid": 1}, {"uid": 1}]', "not a message"),
        (b"[3]", "not a message"),
        # a message's fields, not messages: revive builds them, the frame check must refuse them
        (b'[{"__sampling__": {}}]', "not a message"),
        (b'[{"__tensor__": [1], "dtype": "int32"}]', "not a message"),
        (b'[{"__msg__": "Shutdown", "uid": 1}]', "Shutdown"),
        # revive's refusals are ValueErrors too: a missing field is no TypeError out of the frame
        (b'[{"__msg__": "AbortMsg"}]', "AbortMsg"),
        (b'[{"__msg__": "AbortMsg", "uid": "x"}]', "uid"),
    ],
    ids=[
        "not UTF-8 (a UTF-16 mark)",
        "not UTF-8 (a lone continuation byte)",
        "not UTF-8 (a character cut short)",
        "JSON in UTF-16",
        "JSON in UTF-32",
        "a latin-1 byte inside a message's string",
        "a latin-1 byte inside a string",
        "not JSON",
        "not an array",
        "a plain object, not an array",
        "null",
        "a number",
        "a string",
        "a boolean",
        "a UTF-8 byte-order mark",
        "a dict",
        "a number",
        "sampling params alone",
        "a tensor alone",
        "unknown type",
        "a message missing a field",
        "a message field of the wrong type",
    ],
)
def test_a_bad_frame_is_refused_naming_the_problem(frame, words):
    err = raised(
        lambda: decode_batch(frame), f"decode_batch({frame!r})", f"a ValueError naming {words!r}"
    )
    half_built = (
        " (an object revive built lacks its attributes: was it made without calling its class, "
        "so that its __init__ and its checks never ran?)"
        if isinstance(err, AttributeError)
        else ""
    )
    refused_as_wanted(
        err,
        isinstance(err, ValueError) and words in str(err),
        f"decode_batch({frame!r}) raised {type(err).__name__}: {err}; expected a ValueError "
        f"naming {words!r}{half_built}",
    )


@pytest.mark.parametrize(
    "frame,shown",
    [
        (b'[{"__msg__": "AbortMsg", "uid": 1}, {"uid": 7}]', "{'uid': 7}"),
        (b"[3.25]", "3.25"),
        (b'[{"__tensor__": [5, 6], "dtype": "int32"}]', "[5, 6]"),
        (b'[{"__msg__": "AbortMsg", "uid": 1}, "hello"]', "hello"),
        # as repr writes them: str would show an empty string as nothing, and a name as a name
        (b'[""]', "''"),
        (b'["AbortMsg"]', "'AbortMsg'"),
    ],
    ids=["a dict", "a number", "a tensor alone", "a string", "an empty string", "a type name"],
)
def test_a_frame_refusing_an_item_shows_it(frame, shown):
    """The refusal of an item that is not a message shows the item: with several in one frame,
    the reader learns which one."""
    err = raised(lambda: decode_batch(frame), f"decode_batch({frame!r})")
    refused_as_wanted(
        err,
        isinstance(err, ValueError) and "not a message" in str(err) and shown in str(err),
        f"decode_batch({frame!r}) raised {type(err).__name__}: {err}; expected a ValueError "
        f"saying 'not a message' and showing the item ({shown})",
    )


def test_the_live_server_answers_with_this_code():
    """The real three-process server (`python -m minisgl serve`), with this chapter's code in
    every process, answers the official openai client as the offline engine does
    (live_server.py)."""
    from live_server import check_live_server

    check_live_server("chapter 12")
