"""A query denied its own key: `<` where `<=` belongs.

Each query attends to the keys before it only, which a model was not trained on; the first token
of a fresh prompt then sees no key at all, and its softmax is 0 / 0.
"""


def causal_scores(s, offs, m, len_q, len_k, scale):
    qpos = len_k - len_q + m
    return tl.where(offs[None, :] < qpos[:, None], s * scale, float("-inf"))  # the bug
