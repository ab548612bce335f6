"""`next_text` that decodes each token on its own.

Every token of plain English decodes to its own text, so the chapter's Shakespeare looks right. An
emoji or an accented letter is split over several byte-level tokens, each of which decodes to U+FFFD
alone: the client sees '���' where the whole decode says '🌹'. And a SentencePiece-style decoder
drops the space that starts a lone token, so words run together.
"""


def next_text(tokenizer, state, new_ids, finished):
    state.ids.extend(new_ids)
    state.prefix_offset = state.read_offset = len(state.ids)
    return tokenizer.decode(new_ids)  # the bug: no context, no wait for a whole character
