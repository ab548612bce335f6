"""`tokenize` that checks a client's token ids itself (no bools, nothing past int32) and leaves the
rest to `torch.tensor`, catching only ValueError.

torch.tensor is no check: it truncates 1.5 to 1 without a word, and on a string or a null it
raises a TypeError, which leaves the worker instead of becoming the client's 400. The ids are the
client's input: they go through the same check as the offline LLM's (`_prompt_ids`), whose
TypeError and ValueError are both the client's mistake.
"""

import torch


def tokenize(self, msg):
    try:
        if msg.input_ids is not None:  # the bug: torch converts what it should refuse
            if any(isinstance(t, bool) for t in msg.input_ids):
                raise ValueError("token ids must be integers, not booleans")
            ids = torch.tensor(list(msg.input_ids), dtype=torch.int64)
            if ((ids < -(2**31)) | (ids >= 2**31)).any():
                raise ValueError("a token id is outside the vocabulary")
            ids = ids.to(torch.int32)
        else:
            ids = self._prompt_ids(msg)
    except (ChatTemplateError, ValueError) as e:  # noqa: F821 (the module's)
        return UserReply(uid=msg.uid, finished=True, error=str(e), status=400)  # noqa: F821
    params = msg.sampling_params
    if msg.fill_context:
        params.max_tokens = max(1, self.context_len - len(ids))
    self.requests[msg.uid] = RequestInfo(  # noqa: F821
        prompt_tokens=len(ids), ignore_eos=params.ignore_eos
    )
    return UserMsg(uid=msg.uid, input_ids=ids, sampling_params=params)  # noqa: F821
