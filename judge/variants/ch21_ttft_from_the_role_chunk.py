"""TTFT measured to the first chunk of the stream, whatever it carries.

A chat stream opens with a chunk that only names the assistant's role, sent before any token is
computed: TTFT then looks tiny and says nothing about prefill.
"""


def stream_latencies(sent, chunks):
    arrivals = [t for t, tokens in chunks if tokens > 0]
    if not arrivals:
        raise ValueError("the stream carried no token: no time to first token to measure")
    itls = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return chunks[0][0] - sent, itls  # the bug: the first chunk, not the first token
