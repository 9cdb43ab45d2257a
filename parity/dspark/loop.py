"""Greedy speculative decoding with any target and any draft (dspark.md §5), and plain greedy
decoding of the same target: lossless speculation means the two token lists are equal.

One verify step: the draft proposes d_1..d_γ after the anchor a; the target runs one pass over
[a, d_1..d_γ]; n = the longest prefix with d_j = argmax of the target's row j-1; the bonus token is
the argmax of row n; the target's caches go back to before the verify pass and the accepted rows
a, d_1..d_n run again, their main_hidden committed into the draft's rings. τ = n + 1."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sides import Side


@dataclass
class Speculation:
    """One greedy speculative generation: tokens, and per verify step the accepted count n (0..γ)
    and the target's top-2 logit margin at the first rejected row (near ties explain a difference
    between two runs that agree everywhere else)."""

    tokens: list[int]
    accepted: list[int] = field(default_factory=list)
    reject_margin: list[float] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)   # per token: the target's top-2 margin where it was chosen

    @property
    def tau(self) -> list[int]:
        return [a + 1 for a in self.accepted]

    @property
    def acceptance_length(self) -> float:
        return sum(self.tau) / len(self.tau) if self.tau else float("nan")

    def position_rates(self, gamma: int) -> list[float]:
        """Per draft position j = 1..γ: the fraction of verify steps that accepted d_j."""
        n = len(self.accepted)
        return [sum(a >= j for a in self.accepted) / n if n else float("nan") for j in range(1, gamma + 1)]


def _margin(row: torch.Tensor) -> float:
    """Top-2 log-probability margin of one logits row (the same scale as the near-tie threshold)."""
    top = torch.topk(torch.log_softmax(row.double(), -1), 2).values
    return float(top[0] - top[1])


@torch.no_grad()
def speculate(target: Side, draft: Side, prompt: torch.Tensor, n_tokens: int) -> Speculation:
    """``n_tokens`` greedy tokens of ``target``, drafted by ``draft``'s draft."""
    gamma = draft.dspark.gamma
    logits, mh, state = target.start(prompt)
    ds = draft.dspark.new_state()
    draft.commit(ds, mh)
    anchor = int(torch.argmax(logits[-1]))
    out = Speculation([anchor], margins=[_margin(logits[-1])])
    while len(out.tokens) < n_tokens:
        d = draft.dspark.draft(ds, anchor)
        before = target.snapshot(state)
        q, _ = target.extend(state, [anchor] + d.tokens)
        best = torch.argmax(q, dim=-1).tolist()
        n = 0
        while n < gamma and d.tokens[n] == best[n]:
            n += 1
        state = before
        _, mh = target.extend(state, [anchor] + d.tokens[:n])
        draft.commit(ds, mh)
        anchor = best[n]
        out.tokens += d.tokens[:n] + [anchor]
        out.margins += [_margin(q[j]) for j in range(n + 1)]
        out.accepted.append(n)
        out.reject_margin.append(_margin(q[n]) if n < gamma else float("inf"))
    out.tokens, out.margins = out.tokens[:n_tokens], out.margins[:n_tokens]
    return out


@dataclass
class Greedy:
    tokens: list[int]
    margins: list[float]


@torch.no_grad()
def greedy(target: Side, prompt: torch.Tensor, n_tokens: int) -> Greedy:
    """Plain greedy decoding of ``target``, one token per trunk pass (with each step's top-2 margin)."""
    logits, _, state = target.start(prompt)
    out = Greedy([int(torch.argmax(logits[-1]))], [_margin(logits[-1])])
    while len(out.tokens) < n_tokens:
        logits, _ = target.extend(state, [out.tokens[-1]])
        out.tokens.append(int(torch.argmax(logits[-1])))
        out.margins.append(_margin(logits[-1]))
    return out
