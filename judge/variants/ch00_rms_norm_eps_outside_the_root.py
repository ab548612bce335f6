"""RMSNorm that adds eps after the square root instead of under it.

`x / (sqrt(mean(x**2)) + eps)`: nearly the same for large vectors, but a vector near zero is scaled
very differently (by 1/eps instead of 1/sqrt(eps)), and Hugging Face's numbers differ.
"""


def rms_norm(x, weight, eps):
    x32 = x.float()
    x32 = x32 / (x32.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps)  # the bug: eps outside
    return weight * x32.to(x.dtype)
