"""`rms_norm` that computes in the input's dtype instead of float32.

In float32 it is exact. In bfloat16 the squares, the mean and the scaling are each rounded to 8
bits, and about a quarter of the outputs differ from Hugging Face's, which computes in float32 and
casts back before the weight.
"""


def rms_norm(x, weight, eps):
    # the bug: no x.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
