"""The one decode loop: sequences in groups over an Engine's rows, one token per unfinished row each step.

``runtime.generation.generate`` (transformers' ``generate``) is one group
holding every row of its batch, admitted at once; a ``runtime.slots.Session``
request is a group of one row that joins and leaves while others run.

A group is what transformers samples together: one ``Sampling``, one
generator, one draw over all its rows per step (``[rows, vocab]``).  A row
that produced eos is not fed again; its scores are set to 0 before a draw
(so the other rows' draws are those of transformers' batch call) and its
token is replaced by ``pad_token_id``.  A group ends when each of its rows
has produced eos, or after ``max_new_tokens``; its rows are then freed.
Greedy groups take one argmax together (a row's argmax does not depend on
its group).  The stopping test runs on the host (numpy): the chosen tokens
come to the host once per step, the only read a step makes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .sampling import Sampling, choose


@dataclass(eq=False)
class Group:
    """Sequences sampled together (module docstring), on the Engine rows ``first .. first + rows - 1``."""

    prompts: list  # each row's prompt: int64 [n] on the engine's device
    max_new_tokens: int
    sampling: Sampling
    generator: torch.Generator | None = None
    first: int = -1  # the group's first engine row (set when it joins)
    logits: torch.Tensor | None = None  # [rows, vocab]: each row's last logits
    unfinished: np.ndarray | None = None  # bool [rows]: rows that have not produced eos
    new: list = field(default_factory=list)  # per step: int64 [rows], the tokens chosen
    eos: np.ndarray | None = None  # int64: the sampling's eos tokens (set when it joins)

    @property
    def rows(self) -> int:
        return len(self.prompts)

    @property
    def ended(self) -> bool:
        return len(self.new) == self.max_new_tokens or not self.unfinished.any()

    def tokens(self) -> np.ndarray:
        """int64 [rows, steps]: the tokens chosen so far (pad after a row's eos)."""
        return np.stack(self.new, axis=1) if self.new else np.zeros((self.rows, 0), dtype=np.int64)


class Decoder:
    """The groups running on one Engine; :meth:`join` prefills new ones, :meth:`step` makes one decode step."""

    def __init__(self, engine):
        self.engine = engine
        self.groups: list[Group] = []

    def join(self, groups: list[Group]) -> None:
        """Feed the groups' prompts (rows already set; the running rows wait, fed filler) and add the groups."""
        logits = self.engine.prefill({g.first + i: p for g in groups for i, p in enumerate(g.prompts)})
        for g in groups:
            g.logits = torch.stack([logits[g.first + i] for i in range(g.rows)])
            g.unfinished = np.ones(g.rows, dtype=bool)
            g.eos = np.asarray(g.sampling.eos_token_id or (), dtype=np.int64)
            self.groups.append(g)

    def leave(self, group: Group) -> None:
        """Take `group` out (if still in) and free its rows."""
        if group in self.groups:
            self.groups.remove(group)
            for r in range(group.first, group.first + group.rows):
                self.engine.free(r)

    def step(self) -> list[Group]:
        """Choose every group's next tokens; the groups that end leave and are returned; the unfinished rows of
        the others are fed their token in one decode call."""
        spec = self.engine.spec
        tokens = np.full(spec.max_batch, spec.filler_token, dtype=np.int64)
        active = np.zeros(spec.max_batch, dtype=bool)
        ended = []
        for g, nxt in zip(self.groups, self._choose()):
            s = g.sampling
            if s.eos_token_id:
                nxt = np.where(g.unfinished, nxt, s.pad_token_id)
                g.unfinished = g.unfinished & ~(nxt[:, None] == g.eos[None, :]).any(axis=1)
            g.new.append(nxt)
            if g.ended:
                ended.append(g)
            else:
                tokens[g.first:g.first + g.rows], active[g.first:g.first + g.rows] = nxt, g.unfinished
        for g in ended:
            self.leave(g)
        if self.groups:
            logits = self.engine.decode(tokens, active)
            for g in self.groups:
                g.logits = _rows(logits, g.first, g.rows)
        return ended

    def _choose(self) -> list[np.ndarray]:
        """Each group's tokens (int64 [rows] on the host): one argmax for the greedy groups, a draw per sampled one."""
        out: list = [None] * len(self.groups)
        greedy = [k for k, g in enumerate(self.groups) if not g.sampling.do_sample]
        if greedy:
            scores = [self.groups[k].logits for k in greedy]
            picked = choose(scores[0] if len(scores) == 1 else torch.cat(scores), self.groups[greedy[0]].sampling)
            picked, at = picked.cpu().numpy(), 0
            for k in greedy:
                out[k], at = picked[at:at + self.groups[k].rows], at + self.groups[k].rows
        for k, g in enumerate(self.groups):
            if g.sampling.do_sample:
                scores = g.logits.float()
                if not g.unfinished.all():
                    scores = torch.where(torch.from_numpy(g.unfinished).to(scores.device)[:, None], scores, 0.0)
                out[k] = choose(scores, g.sampling, g.generator).cpu().numpy()
        return out


def _rows(logits: torch.Tensor, first: int, n: int) -> torch.Tensor:
    """Rows ``first .. first + n - 1`` of a call's logits; rows past those the call computed (a row bucket: only
    rows that were not fed, so ended ones) are zeros."""
    have = logits[first:first + n]
    if len(have) == n:
        return have
    return torch.cat([have, logits.new_zeros((n - len(have), logits.shape[1]))])


__all__ = ["Decoder", "Group"]
