"""`next_text` that waits for a whole character even on the request's last token.

While a character is incomplete it is right to wait: the next token brings its missing bytes. But
the last token brings nothing after it. A reply that ends part-way through a character (max_tokens
reached inside an emoji) loses its last bytes: the joined stream is shorter than decoding all the
output tokens, which ends in U+FFFD.
"""


def next_text(tokenizer, state, new_ids, finished):
    state.ids.extend(new_ids)
    before = tokenizer.decode(state.ids[state.prefix_offset : state.read_offset])
    after = tokenizer.decode(state.ids[state.prefix_offset :])
    if len(after) <= len(before) or after.endswith(REPLACEMENT):  # noqa: F821 (the module's)  the bug
        return ""
    state.prefix_offset, state.read_offset = state.read_offset, len(state.ids)
    return after[len(before) :]
