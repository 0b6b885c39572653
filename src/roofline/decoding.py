"""Greedy decoding through a model's static KV cache: one token a step, or speculative decoding, where a small draft
model guesses k tokens and the model checks all of them in one forward pass. Each step runs eagerly or replays a
CUDA graph of itself.

    steps = Steps(model, batch=1, graphs=True)                  # model.setup_cache(...) done by the caller
    tokens = greedy(steps, prompt, 128)                         # [batch, 128]: the next 128 tokens
    tokens, stats = speculative(steps, Steps(draft, 1, True), prompt, 128, k=4)   # the same tokens, sooner

Models follow the example models' protocol (examples/models, as gpt-fast's do): after
model.setup_cache(batch, max_seq, dtype), model(idx, input_pos) returns the logits [batch, len, vocab] of tokens idx
[batch, len] at positions input_pos, and writes their keys and values into the cache at those positions. Nothing
is ever removed from a cache: a rejected guess's keys sit past the accepted tokens, masked off by causality, until
the next pass overwrites them.

Speculative decoding keeps the model's greedy output: of the draft's guesses d1..dk, those up to the first that
differs from the model's own choice at that position are kept, then the model's choice there (or after all k, its
next token), so every token is the one the model would have picked. A round costs k draft steps and one pass of
the model over k + 1 tokens, which costs about one decode step where decoding is bound by reading the weights.
Batch 1 only: rows would accept different numbers of guesses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roofline.bench.steps import capture


class Steps:
    """A model's forward passes of `width` new tokens at once, for each width asked for, each with its own static
    input buffers so that a CUDA graph can replay it (graphs=True: captured at its first call, from that call's
    inputs: the warm-up runs before the capture write the same keys and values the call does).
    steps(tokens, start) returns the model's greedy choice after each of tokens [batch, width], placed at positions
    start .. start + width - 1: [batch, width], a static tensor under graphs (the next call overwrites it)."""

    def __init__(self, model: torch.nn.Module, batch: int, graphs: bool):
        self.model, self.batch, self.graphs = model, batch, graphs
        self.device = next(model.parameters()).device
        self._by_width = {}

    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """The prompt [batch, T] through the model at positions 0..T-1, eagerly (one pass whose width differs per
        prompt); the greedy next token [batch, 1]."""
        positions = torch.arange(prompt.shape[1], device=self.device)
        return self.model(prompt, positions)[:, -1:].argmax(-1)

    def __call__(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        width = tokens.shape[1]
        entry = self._by_width.get(width)
        if entry is not None:
            inputs, positions, offsets, run = entry
            inputs.copy_(tokens)
            torch.add(offsets, start, out=positions)
            return run()
        inputs = tokens.clone()
        offsets = torch.arange(width, device=self.device)
        positions = offsets + start

        def forward():
            return self.model(inputs, positions).argmax(-1)
        run = capture(forward) if self.graphs else forward
        self._by_width[width] = inputs, positions, offsets, run
        return run()


def greedy(steps: Steps, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The model's next `new_tokens` greedy tokens after prompt [batch, T]: [batch, new_tokens]. No host sync."""
    token = steps.prefill(prompt)
    out = [token]
    for position in range(prompt.shape[1], prompt.shape[1] + new_tokens - 1):
        token = steps(token, position).clone()
        out.append(token)
    return torch.cat(out, dim=1)


@dataclass
class SpeculativeStats:
    rounds: int = 0
    proposed: int = 0      # draft guesses made
    accepted: int = 0      # of them, kept

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def add(self, other: "SpeculativeStats") -> None:
        """Count another generation's rounds and guesses in with these."""
        self.rounds, self.proposed, self.accepted = (self.rounds + other.rounds, self.proposed + other.proposed,
                                                     self.accepted + other.accepted)


def speculative(steps: Steps, draft: Steps, prompt: torch.Tensor, new_tokens: int,
                k: int) -> tuple[torch.Tensor, SpeculativeStats]:
    """greedy(steps, prompt, new_tokens)'s tokens, with `draft` guessing k tokens a round. Both models' caches
    must hold prompt + new_tokens + k + 1 positions. One host sync a round (how many guesses were kept)."""
    if prompt.shape[0] != 1:
        raise ValueError(f"speculative decoding takes a batch of 1, got a prompt of {prompt.shape[0]} rows")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    stats = SpeculativeStats()
    token = steps.prefill(prompt)      # the model's next token: decided, not yet in either cache
    draft.prefill(prompt)
    position, out, produced = prompt.shape[1], [token], 1
    while produced < new_tokens:
        guesses, guess = [], token
        for i in range(k):             # the draft consumes the pending token and its own guesses
            guess = draft(guess, position + i).clone()
            guesses.append(guess)
        guessed = torch.cat(guesses, dim=1)
        chosen = steps(torch.cat([token, guessed], dim=1), position)   # the model's choice after each
        kept = int((guessed == chosen[:, :k]).int().cumprod(dim=1).sum())
        new = chosen[:, :kept + 1].clone()   # the kept guesses (equal to the model's choices), then its own
        if kept == k:                  # every guess kept: the draft has not consumed its last one yet
            draft(guessed[:, -1:], position + k)
        out.append(new)
        produced += kept + 1
        stats.rounds, stats.proposed, stats.accepted = stats.rounds + 1, stats.proposed + k, stats.accepted + kept
        token, position = new[:, -1:], position + kept + 1
    return torch.cat(out, dim=1)[:, :new_tokens], stats
