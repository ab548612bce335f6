"""What `LLM.generate` and `LLM.add_request` accept, checked at the door.

A bad prompt or sampling setting must fail the call that brought it, with an error naming what was
wrong, before anything is queued: inside a step it would fail a whole batch, and on a GPU a NaN
temperature reaches a kernel that asserts and takes the process's CUDA context down with it.

A prompt is one of:
    str                                 text, encoded with the model's tokenizer
    a list or tuple of ints             token ids (numpy integers count; bools are not ids)
    a 1-D integer torch tensor or numpy array of token ids
`generate` takes one prompt or a list of them.
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, List

import torch

from minisgl.core import SamplingParams

MAX_TOKEN_ID = 2**31 - 1  # token ids travel as int32


def is_single_prompt(prompts: Any) -> bool:
    """Whether `generate`'s first argument is one prompt rather than a list of prompts."""
    if isinstance(prompts, (str, torch.Tensor)) or _is_ndarray(prompts):
        return True
    return isinstance(prompts, (list, tuple)) and len(prompts) > 0 and _is_int(prompts[0])


def prompt_list(prompts: Any) -> List[Any]:
    """`generate`'s first argument as a list of prompts, or a TypeError saying what it was."""
    if is_single_prompt(prompts):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        return list(prompts)
    raise TypeError(
        f"prompts must be a string, a list of token ids, or a list of those; got {_kind(prompts)}"
    )


def token_ids(prompt: Any, tokenizer) -> torch.Tensor:
    """One prompt as an int32 tensor of token ids (range checks against the vocabulary come
    later)."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(
                "this model directory has no tokenizer.json: pass token ids instead of text"
            )
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"the text is not valid Unicode: {e.reason} at character {e.start}"
            ) from None
        return torch.tensor(tokenizer.encode(prompt).ids, dtype=torch.int32)
    if isinstance(prompt, torch.Tensor) or _is_ndarray(prompt):
        t = torch.as_tensor(prompt)
        if t.dim() != 1 or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise TypeError(
                f"a prompt given as an array must be 1-D integer token ids, got {t.dim()}-D "
                f"{t.dtype}"
            )
        ids = t.tolist()
    elif isinstance(prompt, (list, tuple)):
        if not all(_is_int(t) for t in prompt):
            bad = next(t for t in prompt if not _is_int(t))
            raise ValueError(
                f"a prompt must be a string or a list of integer token ids; it holds {bad!r}"
            )
        ids = [int(t) for t in prompt]
    else:
        hint = " (decode bytes to str first)" if isinstance(prompt, (bytes, bytearray)) else ""
        raise TypeError(
            f"a prompt must be a string or a list of integer token ids, got {_kind(prompt)}{hint}"
        )
    out_of_range = [t for t in ids if not -MAX_TOKEN_ID <= t <= MAX_TOKEN_ID]
    if out_of_range:
        raise ValueError(f"token id {out_of_range[0]} is outside the vocabulary")
    return torch.tensor(ids, dtype=torch.int32)


def sampling_list(
    sampling_params: Any, n: int, fields: Dict[str, Any] | None = None
) -> List[SamplingParams]:
    """`generate`'s sampling settings as one SamplingParams per prompt, each checked again (a
    SamplingParams is a plain dataclass: a field may have been changed since it was made).

    `sampling_params` is taken as it is: every field counts as the caller's. `fields`, the
    keyword arguments, name only some: they alone count as set, and the others may take the
    model's defaults (none given: all of them). One or the other, not both."""
    fields = fields or {}
    if sampling_params is not None and fields:
        raise TypeError(
            f"give sampling_params or SamplingParams' fields as keywords ({', '.join(fields)}), "
            "not both"
        )
    if sampling_params is None:
        params = [SamplingParams(**fields, fields_set=list(fields))] * n
    elif isinstance(sampling_params, SamplingParams):
        params = [sampling_params] * n
    elif isinstance(sampling_params, (list, tuple)):
        params = list(sampling_params)
        if len(params) != n:
            raise ValueError(f"{n} prompts but {len(params)} sampling params")
    else:
        raise TypeError(
            "sampling_params must be a SamplingParams or a list of them, got "
            f"{_kind(sampling_params)}"
        )
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise TypeError(f"sampling_params[{i}] must be a SamplingParams, got {_kind(p)}")
        p.validate()
    return params


def _is_int(value: Any) -> bool:
    # numbers.Integral takes numpy's integer scalars too (list(np_array) holds those)
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_ndarray(value: Any) -> bool:
    return type(value).__module__ == "numpy" and type(value).__name__ == "ndarray"


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
