"""RMSNorm written as LayerNorm: the mean is subtracted before the vectors are scaled.

Each vector then has mean 0 and unit variance, which is not what Qwen3 was trained with: every
layer's input is shifted, and the logits drift away from Hugging Face's.
"""


def rms_norm(x, weight, eps):
    x32 = x.float()
    x32 = x32 - x32.mean(dim=-1, keepdim=True)  # the bug: RMSNorm subtracts nothing
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)
