"""The clairvoyant span copier: a ceiling for every drafter that copies spans of its history.

Prompt lookup, SuffixDecoding, vLLM's n-gram rule and lookupdec's suffix match all draft a span
that occurred earlier: in the prompt, the output so far, or an earlier request. Which span to
copy is their whole problem. The oracle knows the answer: at every step it drafts the longest
prefix (at most ``k`` tokens) of the true continuation that occurs anywhere in the history, so
it accepts all it drafts and wastes nothing. No drafter that copies one contiguous span of its
history accepts more at a step, so its tokens per step bound theirs on the same text (llama.cpp's
rule can chain n-grams into a draft that never occurred as a whole, and so beat it at a step;
on the grounded pairs that happened at under 0.3 % of the hybrid policy's steps).

Two ceilings (``perf grounded``'s rows ``oracle`` and ``oracle/anchored``):

- *any span*: the continuation may occur anywhere in the history;
- *anchored*: it must follow an occurrence of the request's last token, as it does for a drafter
  that finds its place by matching at least one token (every peer here does).

The history is one stream, every pair's prompt and output in the order the benchmark runs them
(as the drafters keep what they learn across pairs); a span crossing from one pair into the next
counts too, which only raises the ceiling.

It is a suffix automaton over that stream, built once (one pair at a time, before the drafters
run it) and shared by every ``k``: each state keeps the end of its substrings' first occurrence,
so a query sees only the stream before the step's position, the future of the pair excluded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from perf.peers import PeerDrafter


class SpanOracle:
    """The stream of every pair so far, indexed by a suffix automaton (online construction)."""

    def __init__(self) -> None:
        self.stream: list[int] = []
        # per state: transitions, suffix link, longest length, end (index) of the first occurrence
        self._next: list[dict[int, int]] = [{}]
        self._link: list[int] = [-1]
        self._len: list[int] = [0]
        self._first: list[int] = [-1]
        self._last = 0
        self.pair_start = 0
        self.pair_end = 0

    def add_pair(self, tokens: Sequence[int]) -> None:
        """Append a pair's tokens (prompt + output); the oracle's drafters then generate it."""
        self.pair_start = len(self.stream)
        for t in tokens:
            self._add(t)
        self.pair_end = len(self.stream)

    def _add(self, c: int) -> None:
        nxt, link, length, first = self._next, self._link, self._len, self._first
        pos = len(self.stream)
        self.stream.append(c)
        cur = len(length)
        length.append(length[self._last] + 1)
        link.append(0)
        nxt.append({})
        first.append(pos)
        p = self._last
        while p != -1 and c not in nxt[p]:
            nxt[p][c] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][c]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:  # split q: the clone keeps q's transitions and its first occurrence
                clone = len(length)
                length.append(length[p] + 1)
                link.append(link[q])
                nxt.append(dict(nxt[q]))
                first.append(first[q])
                while p != -1 and nxt[p].get(c) == q:
                    nxt[p][c] = clone
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        self._last = cur

    def longest(self, tokens: Sequence[int], before: int) -> int:
        """How many of ``tokens``, from the first, occur as one span ending before ``stream[before]``."""
        state, n = 0, 0
        for t in tokens:
            s = self._next[state].get(t)
            # a longer span first occurs no earlier, so the first one past `before` ends the walk
            if s is None or self._first[s] >= before:
                break
            state, n = s, n + 1
        return n


class OracleDrafter:
    """A :class:`perf.peers.PeerDrafter` that drafts what :class:`SpanOracle` knows will be accepted.

    It reads the true continuation from the oracle's stream: call ``oracle.add_pair`` with the
    pair before each of its requests.
    """

    def __init__(self, oracle: SpanOracle, k: int, anchored: bool) -> None:
        self.oracle, self.k, self.anchored = oracle, k, anchored
        self.base = 0

    def begin(self, prompt: list[int]) -> None:
        """The request of the pair last given to the oracle starts (its prompt is checked)."""
        o = self.oracle
        if o.stream[o.pair_start : o.pair_start + len(prompt)] != prompt:
            raise ValueError("OracleDrafter: the request is not the pair the oracle was given (call add_pair first)")
        self.base = o.pair_start

    def propose(self, out: list[int]) -> list[int]:
        """The longest prefix of the truth after ``out`` (at most ``k``) that the history holds."""
        o = self.oracle
        at = self.base + len(out)  # the stream position of the next token
        ahead = o.stream[at : min(at + self.k, o.pair_end)]
        if not self.anchored:
            return ahead[: o.longest(ahead, at)]
        # the span must follow an occurrence of the last token (a request's prompt is never empty)
        return ahead[: o.longest([o.stream[at - 1], *ahead], at) - 1]

    def observe(self, new_tokens: list[int]) -> None:
        """Nothing to learn: the oracle's stream already holds the pair."""

    def end(self) -> None:
        """Nothing to close."""


@dataclass
class Shortfall:
    """A drafter's steps judged against the anchored ceiling at the same position (:class:`Judged`).

    Each step is one of: ``at_ceiling`` (accepted as many tokens as the ceiling drafts there, or
    more), ``wrong`` (drafted a wrong token before reaching it) or ``short`` (stopped before it,
    every drafted token right); ``wrong_tokens`` and ``short_tokens`` sum how far below the
    ceiling those steps accepted.
    """

    at_ceiling: int = 0
    wrong: int = 0
    wrong_tokens: int = 0
    short: int = 0
    short_tokens: int = 0

    def add(self, other: Shortfall) -> None:
        """Add another drafter run's counts to these."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class Judged:
    """A :class:`perf.peers.PeerDrafter` that passes ``drafter``'s proposals on unchanged, judging
    each against the anchored ceiling at its position (into ``shortfall``, the counts of the
    current or last request).

    The oracle must have been given the pair (``add_pair``) before the request begins; the
    judging's cost counts in the step's time.
    """

    def __init__(self, drafter: PeerDrafter, oracle: SpanOracle, k: int) -> None:
        self.drafter = drafter
        self.ceiling = OracleDrafter(oracle, k, anchored=True)
        self.shortfall = Shortfall()

    def begin(self, prompt: list[int]) -> None:
        """Start the request in the ceiling and in the wrapped drafter; the counts start at zero."""
        self.ceiling.begin(prompt)
        self.shortfall = Shortfall()
        self.drafter.begin(prompt)

    def propose(self, out: list[int]) -> list[int]:
        """The wrapped drafter's proposal, unchanged, after judging it."""
        proposal = self.drafter.propose(out)
        best = len(self.ceiling.propose(out))
        o = self.ceiling.oracle
        at = self.ceiling.base + len(out)
        truth = o.stream[at : min(at + len(proposal), o.pair_end)]  # shorter past the pair's end
        accepted = next((i for i, (p, t) in enumerate(zip(proposal, truth, strict=False)) if p != t), len(truth))
        s = self.shortfall
        if accepted >= best:
            s.at_ceiling += 1
        elif accepted < len(proposal):
            s.wrong += 1
            s.wrong_tokens += best - accepted
        else:
            s.short += 1
            s.short_tokens += best - accepted
        return proposal

    def observe(self, new_tokens: list[int]) -> None:
        """Passed on to the wrapped drafter."""
        self.drafter.observe(new_tokens)

    def end(self) -> None:
        """Passed on to the wrapped drafter."""
        self.drafter.end()
