"""`is_greedy` as upstream mini-sglang writes it: it also demands top_p == 1.

With temperature 0 (or top_k 1) the argmax is the only possible token whatever top_p is, since
top-p filtering always keeps the most likely token; such a request must still count as greedy.
"""


def is_greedy(self):
    return (self.temperature == 0.0 or self.top_k == 1) and self.top_p == 1.0  # the bug: top_p
