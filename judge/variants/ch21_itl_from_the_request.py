"""The inter-token latencies start at the request being sent: the TTFT gap counts as one ITL.

Prefill's wait then lands in the ITL distribution; its p99 becomes the TTFT tail.
"""


def stream_latencies(sent, chunks):
    arrivals = [t for t, tokens in chunks if tokens > 0]
    if not arrivals:
        raise ValueError("the stream carried no token: no time to first token to measure")
    times = [sent] + arrivals  # the bug: the send time is treated as a token
    itls = [b - a for a, b in zip(times, times[1:])]
    return arrivals[0] - sent, itls
