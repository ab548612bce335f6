"""Each gap measured from the previous chunk of any kind, not from the previous chunk with tokens.

A chunk without tokens between two token chunks (a keep-alive, a usage chunk) splits a real gap
in two, and the part after it is reported as the whole ITL.
"""


def stream_latencies(sent, chunks):
    arrivals = [t for t, tokens in chunks if tokens > 0]
    if not arrivals:
        raise ValueError("the stream carried no token: no time to first token to measure")
    itls, previous = [], None
    for t, tokens in chunks:
        if tokens > 0 and previous is not None and t != arrivals[0]:
            itls.append(t - previous)
        if previous is not None or tokens > 0:
            previous = t  # the bug: any chunk after the first token restarts the gap
    return arrivals[0] - sent, itls
