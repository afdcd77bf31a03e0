"""The vLLM adapter's per-step loop, compiled: which request is in which row, then extend and propose.

vLLM calls its proposer once per step with the whole batch and names requests only by their
row. ``lookupdec.adapters.vllm.LookupProposer`` hands each call to :class:`RowTracker`, which
reads each row's first, middle and last known token (one vectorized NumPy read), recognizes
the request of each row, ends the requests that left, and extends and drafts. It runs for every
row of every step, so it is compiled with the fast path: interpreted, this bookkeeping would
cost as much as the drafting it serves. A ``lookupdec.fast`` request is extended and asked to
propose through native calls; requests of any other Drafter (e.g. the reference's, or the fast
one's with the hybrid policy) are called through their Python methods.

This module is compiled by mypyc (see ``setup.py``); it also runs unchanged as plain Python.
"""

from __future__ import annotations

import sys
from typing import Any, Final

from librt.strings import BytesWriter, write_i64_be, write_i64_le
from mypy_extensions import i64

from lookupdec.fast._request import Request

LITTLE_ENDIAN: Final = sys.byteorder == "little"


def put_i64(w: BytesWriter, x: i64) -> None:
    """Append ``x`` to ``w`` in the machine's byte order (what ``memoryview.cast("q")`` reads)."""
    if LITTLE_ENDIAN:
        write_i64_le(w, x)
    else:
        write_i64_be(w, x)


def as_list(ids: Any) -> list[int]:
    """``ids`` as a list of ints: a list itself, else its ``tolist()`` (NumPy) or its items."""
    if type(ids) is list:
        return ids
    tolist = getattr(ids, "tolist", None)
    return list(tolist()) if tolist is not None else [int(t) for t in ids]


def as_lists(rows: Any) -> list[list[int]]:
    """Each row of ``rows`` through :func:`as_list` (vLLM's sampled tokens: lists or arrays)."""
    return [as_list(row) for row in rows]


def tokens_of(req: Any) -> list[int]:
    """The committed tokens of a request (natively for a compiled one)."""
    if isinstance(req, Request):
        return req._tokens
    tokens: list[int] = req.tokens
    return tokens


def propose_within(req: Any, committed: bool, budget: i64, limit: i64) -> list[int]:
    """Up to ``budget`` drafted tokens, none past ``limit`` tokens in the request.

    None for a row that committed nothing this step (still prefilling).
    """
    room = limit - len(tokens_of(req))
    d = budget if budget < room else room
    if d <= 0 or not committed:
        return []
    if isinstance(req, Request):  # lets mypyc call a lookupdec.fast request natively
        return req.propose(d)
    proposal: list[int] = req.propose(d)
    return proposal


def continues(req: Any, known: i64, first: int, mid: int, last: int) -> bool:
    """True when ``req`` is a request of ``known`` tokens with these first, middle and last tokens.

    Not the whole history: enough to tell requests apart, and O(1) per row.
    """
    tokens = tokens_of(req)
    return (
        len(tokens) == known and known > 0 and tokens[-1] == last and tokens[0] == first and tokens[known >> 1] == mid
    )


class RowTracker:
    """The requests of vLLM's persistent batch, followed from step to step.

    Two ways, one per call: :meth:`step_ids` when vLLM's request ids are at hand (a request is
    its id, wherever its row is, and it ends when vLLM drops it), :meth:`step` when they are not
    (by content: a row whose known tokens continue a request, same length, same first, middle
    and last token, extends it, even from another row; a row that continues none starts a new
    request with its whole history as the prompt; a request that appears in no row is ended).
    Either way requests end (their contexts merged into the dynamic cache) before anything is
    drafted in that step.
    """

    rows: list[Any]
    """Batch row -> the request that was in it at the last step (None: an idle row)."""
    by_id: dict[str, Any]
    """vLLM request id -> its open request (:meth:`step_ids`)."""
    ended: int
    """Requests ended so far (the adapter saves the dynamic cache after steps that end some)."""
    started: list[Any]
    """The open requests of :meth:`step` in the order they started: finished ones end in it."""

    def __init__(self) -> None:
        self.rows = []
        self.by_id = {}
        self.ended = 0
        self.started = []

    def step_ids(
        self,
        drafter: Any,
        sampled_token_ids: Any,
        num_tokens_no_spec: Any,
        token_ids: Any,
        req_ids: list[str],
        live: Any,
        k: int,
        max_model_len: int,
    ) -> list[list[int]]:
        """One vLLM step with the batch's request ids: the drafts of every row.

        ``req_ids[i]``: the id of the request in row i (vLLM's ``InputBatch.req_ids``);
        ``live``: the ids of every request vLLM still holds, scheduled in this step or not
        (``GPUModelRunner.requests``; anything supporting ``in``), or None when unknown. An open
        request whose id is not in ``live`` has finished and is ended; one that is merely absent
        from the batch (left unscheduled at the token budget, or preempted) stays open, so it
        continues when it comes back instead of being counted twice. With ``live`` None, a
        request absent from the batch is taken for finished.

        A row may hold more tokens than its request has seen: vLLM skips ``propose`` for a whole
        step when its longest row is near ``max_model_len``. The row's tokens in between are
        committed first (the request's last proposal is judged by them, as by ``sampled``).
        """
        batch = as_lists(sampled_token_ids)
        n_rows = len(batch)
        raw_counts: list[Any] = as_list(num_tokens_no_spec)[:n_rows]
        counts = [int(n) for n in raw_counts]
        if len(counts) != n_rows or len(req_ids) < n_rows:
            raise ValueError(
                f"{n_rows} rows of sampled tokens, {len(counts)} of num_tokens_no_spec, {len(req_ids)} request ids"
            )
        by_id = self.by_id
        # End the finished requests first, in the order they started (the same on every rank).
        if live is None:
            present = set(req_ids[:n_rows])
            gone = [rid for rid in by_id if rid not in present]
        else:
            gone = [rid for rid in by_id if rid not in live]
        for rid in gone:
            by_id.pop(rid).end()
            self.ended += 1
        drafts: list[list[int]] = []
        budget: i64 = k
        limit: i64 = max_model_len
        for i in range(n_rows):
            sampled = batch[i]
            rid = req_ids[i]
            n: i64 = counts[i]
            req = by_id.get(rid)
            if req is None:
                if not sampled:  # still prefilling: the request starts with its first sampled token
                    drafts.append([])
                    continue
                req = drafter.request(token_ids[i, :n].tolist())
                by_id[rid] = req
            else:
                known: i64 = n - len(sampled)
                have: i64 = len(tokens_of(req))
                if have > known:
                    # The row no longer holds what the request saw (vLLM reused the id): a new request.
                    req.end()
                    self.ended += 1
                    req = drafter.request(token_ids[i, :n].tolist())
                    by_id[rid] = req
                    sampled = []
                elif have < known:
                    req.extend(token_ids[i, have:known].tolist())
                if sampled:
                    req.extend(sampled)
            drafts.append(propose_within(req, bool(batch[i]), budget, limit))
        return drafts

    def step(
        self, drafter: Any, sampled_token_ids: Any, num_tokens_no_spec: Any, token_ids: Any, k: int, max_model_len: int
    ) -> list[list[int]]:
        """One vLLM step: the drafts of every row (empty for a row that drafts nothing).

        ``sampled_token_ids[i]``: the tokens row i committed in this step (empty while
        prefilling); ``num_tokens_no_spec[i]``: how many tokens row i holds, those included;
        ``token_ids``: a NumPy array whose row i holds the row's tokens.
        """
        batch = as_lists(sampled_token_ids)
        n_rows = len(batch)
        # Items typed as objects: mypyc would refuse a NumPy integer before int() converts it.
        raw_counts: list[Any] = as_list(num_tokens_no_spec)[:n_rows]
        counts = [int(n) for n in raw_counts]
        if len(counts) != n_rows:
            raise ValueError(f"num_tokens_no_spec has {len(counts)} rows, sampled_token_ids {n_rows}")
        width: i64 = token_ids.shape[1] if n_rows else 0
        # Each row's first, middle and last known token, in one vectorized read of the array
        # (flat indices, 3 per row): reading it element by element is boxed generic code, and
        # NumPy converts a list index item by item, but a buffer of int64 (a memoryview of the
        # bytes written here natively, in the machine's byte order as format "q" reads) at once.
        w = BytesWriter()
        for i in range(n_rows):
            known: i64 = counts[i] - len(batch[i])
            if known > width:
                raise ValueError(f"row {i} holds {known} known tokens, more than token_ids' {width} columns")
            base = i * width
            put_i64(w, base)
            put_i64(w, base + (known >> 1 if known > 0 else 0))
            put_i64(w, base + (known - 1 if known > 0 else 0))
        signatures: list[int] = token_ids.take(memoryview(w.getvalue()).cast("q")).tolist() if n_rows else []
        previous = self.rows
        n_previous = len(previous)
        # Lists by row, not dicts by request id: each request sits in one row of `previous`, so
        # "claimed in this step" is a flag of that row (no hashing, no boxed ids per row).
        claimed = [False] * n_previous
        n_rows = len(batch)
        found: list[Any] = [None] * n_rows  # the request of each row, None for a new or idle row
        prompts: list[Any] = [None] * n_rows  # a new request's prompt: the row's whole history
        # Pass 1: which request is in which row now (the row's own request first, else the first
        # unclaimed one it continues, in row order of the last step).
        for i in range(n_rows):
            sampled = batch[i]
            known = counts[i] - len(sampled)
            first = signatures[3 * i]
            mid = signatures[3 * i + 1]
            last = signatures[3 * i + 2]
            at: i64 = -1
            if i < n_previous:
                req = previous[i]
                if req is not None and not claimed[i] and continues(req, known, first, mid, last):
                    at = i
            if at < 0:
                for j in range(n_previous):
                    r = previous[j]
                    if r is not None and not claimed[j] and continues(r, known, first, mid, last):
                        at = j
                        break
            if at >= 0:
                claimed[at] = True
                found[i] = previous[at]
            elif sampled:
                prompts[i] = token_ids[i, : counts[i]].tolist()
        # Requests in no row have finished (or were preempted): merge them before drafting, in
        # the order they started, as step_ids does (the hybrid policy's history keeps requests
        # in the order they end, and its drafts depend on that order).
        gone: set[int] = set()
        for j in range(n_previous):
            r = previous[j]
            if r is not None and not claimed[j]:
                gone.add(id(r))
        if gone:
            still: list[Any] = []
            for r in self.started:
                if id(r) in gone:
                    r.end()
                    self.ended += 1
                else:
                    still.append(r)
            self.started = still
        # Pass 2: count what each row committed, then draft within the model's length budget.
        # The isinstance branches let mypyc call a lookupdec.fast request natively; any other
        # request (the reference's, the hybrid policy's) goes through its Python methods.
        drafts: list[list[int]] = []
        budget: i64 = k
        limit: i64 = max_model_len
        for i in range(n_rows):
            sampled = batch[i]
            req = found[i]
            if req is None:
                prompt = prompts[i]
                if prompt is None:
                    drafts.append([])
                    continue
                req = drafter.request(prompt)
                found[i] = req
                self.started.append(req)
            elif isinstance(req, Request):
                if sampled:
                    req.extend(sampled)
            elif sampled:
                req.extend(sampled)
            drafts.append(propose_within(req, bool(sampled), budget, limit))
        self.rows = found
        return drafts

    def end_all(self) -> None:
        """End every request still open (their contexts go into the dynamic cache), in the order they started."""
        for req in self.started:
            req.end()
            self.ended += 1
        self.rows = []
        self.started = []
        for req in self.by_id.values():
            req.end()
            self.ended += 1
        self.by_id = {}


__all__ = ["RowTracker", "as_list", "as_lists", "continues"]
