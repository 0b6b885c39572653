"""The language-model head and its loss, as the example models compute them in their forward (nanoGPT's way), or
with the two fused (roofline.ops.linear_cross_entropy: the [tokens x vocabulary] logits never held whole).

    loss: "separate"   logits = lm_head(hidden); F.cross_entropy(logits, targets)   (returns logits and loss)
          "fused"      roofline.ops.linear_cross_entropy(hidden, lm_head.weight, targets)
                                                                                 (returns None and loss)
"""

import torch.nn.functional as F

LOSSES = ("separate", "fused")


def check_loss(config) -> None:
    if config.loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {config.loss!r}")


def logits_and_loss(hidden, lm_head, targets, how: str):
    """The logits without targets; with targets (each position's next token), (logits, loss), the logits None
    where the loss is fused."""
    if targets is None:
        return lm_head(hidden)
    if how == "fused":
        from roofline import ops

        return None, ops.linear_cross_entropy(hidden, lm_head.weight, targets, lm_head.bias)
    logits = lm_head(hidden)
    return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
