"""The query's position taken as its index among the new tokens.

Right for a fresh prompt, where the new tokens are the whole sequence; after a cached prefix (a
prefix-cache hit, or a later chunk of a chunked prefill) each query then sees only the first keys
of the prefix, as many as its index, instead of the whole prefix and the new tokens before it.
"""


def causal_scores(s, offs, m, len_q, len_k, scale):
    qpos = m  # the bug: not len_k - len_q + m
    return tl.where(offs[None, :] <= qpos[:, None], s * scale, float("-inf"))
