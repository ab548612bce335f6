"""`named_tensors` that yields copies of the weights.

The names are right, so every name test passes, but the state dict no longer holds the op's own
tensors: each call (load_weight makes one just to learn the keys) copies the whole model, and
anything written into the state dict never reaches the op.
"""


def named_tensors(self, prefix=""):
    for name, value in self.__dict__.items():
        if name.startswith("_"):
            continue
        if isinstance(value, torch.Tensor):
            yield prefix + name, value.clone()  # the bug: a copy
        elif isinstance(value, BaseOP):
            yield from value.named_tensors(prefix + name + ".")
