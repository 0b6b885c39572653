"""transformers' own LlamaForCausalLM and Qwen2ForCausalLM, built from a config (no download), behind the interface
benchmarks/models.py drives its models through: forward(idx, targets=) -> (logits, loss) for a training step (the
loss computed by transformers, F.cross_entropy over shifted labels), and setup_cache + forward(idx, positions) for
decoding through the model's own DynamicCache (a StaticCache under CUDA graphs and compile). And Liger-Kernel's
patch of them, in force only while its mode runs.

Sizes as on the H100 in DESIGN.md: 12 layers, d 2048, 32 query and 8 key/value heads, SwiGLU 5632, vocabulary 32000.
hf-llama-hd128 is the same Llama with 16 query and 4 key/value heads of 128 (head_dim 128, as Llama 3's): the head
dim flash_attention's Hopper kernels are routed at.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect

import torch
from torch import nn

_SIZES = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=12, num_attention_heads=32,
              num_key_value_heads=8, vocab_size=32000, max_position_embeddings=2048)
_TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=96, max_position_embeddings=64)
# name: (the model's class, its config's class, its family: transformers.models.<family>.modeling_<family>);
# transformers is imported where a model is built, not with models.py
FAMILIES = {"hf-llama": ("LlamaForCausalLM", "LlamaConfig", "llama"),
            "hf-llama-hd128": ("LlamaForCausalLM", "LlamaConfig", "llama"),
            "hf-qwen2": ("Qwen2ForCausalLM", "Qwen2Config", "qwen2")}
# name: its sizes where they are not _SIZES (and _TINY's): (full, tiny)
_HEADS = {"hf-llama-hd128": (dict(num_attention_heads=16, num_key_value_heads=4),
                             dict(num_attention_heads=2, num_key_value_heads=1))}


class CausalLM(nn.Module):
    """A transformers causal LM as models.py calls its models. Decoding through a DynamicCache crops it to `at`, the
    position of the tokens given (set by the caller, on the host: warm-up steps decode one position again and
    again); a StaticCache is written at the positions given, on the GPU."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.config = model.config
        self.cache, self.static = None, False
        self.at = 0          # where the tokens given go (the caller's count; a DynamicCache's only)
        self.length = 0      # what a DynamicCache holds (ours: no host sync to ask it)
        # the cache's keyword: `cache` where transformers has it (5.24 deprecates past_key_values), else the old one
        self.cache_keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def setup_cache(self, batch: int, length: int, dtype: torch.dtype, static: bool = False) -> None:
        """static: a StaticCache of `length` positions, which a CUDA graph can replay (a DynamicCache grows by
        concatenation: a replayed step would write where the captured one's tensors were, freed since)."""
        import transformers

        self.static = static
        self.cache = (transformers.StaticCache(config=self.config, max_cache_len=length) if static else
                      transformers.DynamicCache(config=self.config))
        self.length = 0
        # a sliding window's layer keeps its count on the host, which a replayed step cannot set
        if static and any(hasattr(layer, "cumulative_length_int") for layer in self.cache.layers):
            raise NotImplementedError("decoding transformers' sliding-window caches under CUDA graphs")

    def forward(self, idx, positions=None, targets=None):
        if targets is not None:
            out = self.model(input_ids=idx, labels=targets)
            return out.logits, out.loss
        if self.cache is None:
            return self.model(input_ids=idx).logits
        if self.static:   # nothing read from the host's count: torch.compile would specialize on it, a step each
            self._static_count_at(positions[:1])
        else:
            if self.length > self.at:   # a dynamic cache drops what lies past the position; a negative count: what
                self.cache.crop(self.at - self.length)   # both 5.17 and 5.24 take
            self.length = self.at + idx.shape[1]
        out = self.model(input_ids=idx, position_ids=positions[None].expand(idx.shape[0], -1), cache_position=positions,
                         use_cache=True, **{self.cache_keyword: self.cache})
        return out.logits

    def _static_count_at(self, first: torch.Tensor) -> None:
        """A static cache writes each position in place: 5.17 where cache_position says, 5.24 where its own count
        on the GPU says (advanced by every call), set here from the position tensor, on the GPU, so that a replayed
        graph writes where the step it replays is (one launch for every layer's count)."""
        counts = [layer.cumulative_length for layer in self.cache.layers
                  if layer.is_initialized and isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
        if counts:
            torch._foreach_copy_(counts, [first.reshape(())] * len(counts))


def build(name: str, tiny: bool) -> CausalLM:
    import transformers

    cls, config_cls, family = FAMILIES[name]
    sizes = {**(_TINY if tiny else _SIZES), **_HEADS.get(name, ({}, {}))[tiny]}
    config = getattr(transformers, config_cls)(**sizes, attn_implementation="sdpa")
    model = CausalLM(getattr(transformers, cls)(config))
    model.family = family
    return model


class Liger:
    """Liger-Kernel 0.8.5 applied to one model (its RMSNorm, SwiGLU, RoPE and fused linear cross-entropy), as its
    README says to (`_apply_liger_kernel_to_instance`). Liger also replaces module-level names of the family's
    modeling file and the model class's forward, for every model of the process: they are Liger's only inside
    `active()`, so that the other modes, which take turns with this one, run unpatched."""

    def __init__(self, model: CausalLM):
        from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance

        self._modeling = importlib.import_module(f"transformers.models.{model.family}.modeling_{model.family}")
        self._theirs = _names(self._modeling)
        _apply_liger_kernel_to_instance(model=model.model)
        self._ligers = _names(self._modeling)
        _put_back(self._modeling, self._theirs)
        self._depth = 0   # active() may be entered within itself (a mode's warm-up runs its timed steps)

    @contextlib.contextmanager
    def active(self):
        if self._depth == 0:
            _put_back(self._modeling, self._ligers)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                _put_back(self._modeling, self._theirs)


def _names(modeling) -> tuple[dict, dict]:
    """What a modeling file's names are bound to: its module's, and each of its classes' attributes."""
    return dict(vars(modeling)), {cls: dict(vars(cls)) for cls in vars(modeling).values() if isinstance(cls, type)}


def _put_back(modeling, names: tuple[dict, dict]) -> None:
    """Bind the modeling file's names as _names() found them (names added since are removed)."""
    module, classes = names
    for name in set(vars(modeling)) - set(module):
        delattr(modeling, name)
    vars(modeling).update(module)
    for cls, attributes in classes.items():
        for name in set(vars(cls)) - set(attributes):
            with contextlib.suppress(AttributeError, TypeError):
                delattr(cls, name)
        for name, value in attributes.items():
            if name != "__dict__" and vars(cls).get(name) is not value:
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(cls, name, value)
