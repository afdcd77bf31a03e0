"""The llama-lookup-stats loop (spec 8.2): replay a text and count drafted and accepted tokens."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from lookupdec.reference.cache import NGRAM_MAX, NGRAM_MIN, NgramCache
from lookupdec.reference.draft import PartSource, draft
from lookupdec.reference.history import SuffixHistory
from lookupdec.reference.hybrid import TARGET_WASTE, HybridState
from lookupdec.result import ReplayResult, common_prefix, tree_nodes
from lookupdec.rules import check_branches, check_draft_length, check_policy, check_target_waste

ProgressCallback = Callable[[int, int], None]
"""Called as ``progress(tokens_done, tokens_total)`` after every chunk."""


def replay(
    tokens: Sequence[int],
    n_ctx: int = 4096,
    n_draft: int = 8,
    nc_static: PartSource | None = None,
    nc_dynamic: NgramCache | None = None,
    progress: ProgressCallback | None = None,
    policy: str = "llama",
    history: SuffixHistory | None = None,
    branches: int = 1,
    target_waste: float | None = None,
) -> ReplayResult:
    """Replay ``tokens`` as llama-lookup-stats does and return the counts and timings.

    The tokens are cut into chunks of ``n_ctx`` while ``i_start + n_ctx < len(tokens)``
    (so a last chunk that ends exactly at the end is dropped too, as in llama.cpp).
    Each chunk starts with an empty context cache; after a chunk the context cache is
    merged into the dynamic one, which therefore grows through the run. ``nc_dynamic``
    is modified in place when given.

    ``policy="hybrid"`` extends every llama.cpp draft with the hybrid policy's suffix match
    (:mod:`lookupdec.reference.hybrid`); each chunk is then one request, and ``history``
    (a fresh :class:`SuffixHistory` if None) holds the chunks replayed so far.

    ``branches`` > 1 (hybrid only) replays tree drafts (:meth:`HybridState.propose_tree`): a
    step accepts the longest prefix any branch shares with the text (what a tree verifier
    accepts), is observed as branch 0's, and ``n_drafted`` counts the trees' distinct nodes.
    ``target_waste`` (hybrid only): the rejected drafted tokens per step the policy steers to
    (None: its default, :data:`lookupdec.reference.hybrid.TARGET_WASTE`).
    """
    if n_ctx < 1:
        raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
    check_draft_length(n_draft, "n_draft")
    check_policy(policy)
    check_branches(branches, policy)
    check_target_waste(target_waste, policy)
    tokens = list(tokens)
    state = None
    if policy == "hybrid":
        state = HybridState(history, target_waste=TARGET_WASTE if target_waste is None else target_waste)
    static: PartSource = nc_static if nc_static is not None else NgramCache()
    dynamic = nc_dynamic if nc_dynamic is not None else NgramCache()
    context = NgramCache()
    n_drafted = n_accept = n_steps = 0
    t_draft = 0.0
    total = len(tokens)
    i_start = 0
    while i_start + n_ctx < total:
        chunk = tokens[i_start : i_start + n_ctx]
        out = [chunk[0]]  # the first token is given, and not counted into the context cache
        if state is not None:
            state.begin_request()
            state._append([chunk[0]])  # through the state: it scores the exponents
        while len(out) < n_ctx:
            n_steps += 1
            drafted = [out[-1]]
            t0 = time.perf_counter()
            draft(out, drafted, n_draft, NGRAM_MIN, NGRAM_MAX, context, dynamic, static)
            proposal = drafted[1:]
            first = proposal  # branch 0, the one observed
            if state is not None and branches > 1:
                tree = state._tree_step(proposal, n_draft, None, static, branches)
                truth = chunk[len(out) :]
                # a tree verifier accepts the longest prefix any branch shares with the text
                first = tree[0] if tree else []
                proposal = max(tree, key=lambda b: common_prefix(b, truth), default=[])
                n_drafted += tree_nodes(tree)
            elif state is not None:
                state._extend_draft(proposal, n_draft, None, static)
            t_draft += time.perf_counter() - t0
            if branches == 1:
                n_drafted += len(proposal)  # drafts past the chunk end count too
            t0 = time.perf_counter()
            accepted = 0
            for token in proposal:
                if len(out) >= n_ctx or chunk[len(out)] != token:
                    break
                n_accept += 1
                accepted += 1
                out.append(token)
                context.update(out, 1, NGRAM_MIN, NGRAM_MAX)
            if state is not None:
                state.observe(common_prefix(first, proposal[:accepted]), proposal[:accepted])
            if len(out) < n_ctx:  # the "sampled" token is the ground truth
                out.append(chunk[len(out)])
                context.update(out, 1, NGRAM_MIN, NGRAM_MAX)
                if state is not None:
                    state._append([out[-1]])
            t_draft += time.perf_counter() - t0
        dynamic.merge(context)
        context.clear()
        i_start += n_ctx
        if progress is not None:
            progress(min(i_start, total), total)
    return ReplayResult(
        n_ctx=n_ctx,
        n_draft=n_draft,
        n_tokens=total,
        n_predict=total - total % n_ctx,
        n_drafted=n_drafted,
        n_accept=n_accept,
        t_draft_s=t_draft,
        n_steps=n_steps,
        policy=policy,
        branches=branches,
    )
