"""The llama-lookup-stats loop (spec 8.2), compiled: llama.cpp's policy and the hybrid policy."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from librt.vecs import append, vec
from mypy_extensions import i32, i64

from lookupdec.fast._cache import NgramCache, check_ngram_range, require_cache, to_vec
from lookupdec.fast._draft import draft_core, keys_buffer, require_static_source
from lookupdec.fast._history import SuffixHistory
from lookupdec.fast._hybrid import TARGET_WASTE, HybridState
from lookupdec.fast._source import StaticSource
from lookupdec.fast._tables import NGRAM_MAX, NGRAM_MIN
from lookupdec.fast._tree import tree_nodes, tree_path
from lookupdec.result import ReplayResult
from lookupdec.rules import check_branches, check_draft_length, check_policy, check_target_waste


def replay_core(
    toks: vec[i32],
    n_ctx: i64,
    n_draft: i64,
    st: StaticSource,
    dyn: NgramCache,
    progress: Callable[[int, int], None] | None,
    total: i64,
) -> tuple[i64, i64, i64, float]:
    """The replay loop; returns (n_drafted, n_accept, n_steps, t_draft seconds).

    The accepted tokens are the chunk's own tokens, so ``out`` is never materialized: it is
    ``toks[i_start : i_start + pos]``. Timing covers each chunk's drafting and context updates
    (and the trivial accept loop), not the merge, as llama.cpp's ``t_draft``.
    """
    ctx = NgramCache()
    n_drafted: i64 = 0
    n_accept: i64 = 0
    n_steps: i64 = 0
    t_draft = 0.0
    i_start: i64 = 0
    # One buffer for every step's tail and drafts: append into spare capacity writes in place
    # and returns a longer vec over the same memory, so starting each step from this empty vec
    # reuses it (a new vec per step was a malloc and a free per step). Nothing reads a step's
    # tail after the step, so sharing is safe; were append ever to copy, it would only be slower.
    empty = vec[i32](capacity=NGRAM_MAX + n_draft)
    keys = keys_buffer()
    while i_start + n_ctx < total:
        t0 = time.perf_counter()
        pos: i64 = 1
        while pos < n_ctx:
            n_steps += 1
            nd: i64 = 0
            tail = empty
            if pos >= 2:
                # Not ``lo = pos - 4 if pos > 4 else 0``: mypyc types that expression as a Python
                # int (i64 | literal), so lo was boxed and the range below ran on tagged ints.
                lo: i64 = 0
                if pos > 4:
                    lo = pos - 4
                for j in range(i_start + lo, i_start + pos):
                    tail = append(tail, toks[j])
                base = i64(len(tail))
                tail = draft_core(tail, pos, n_draft, NGRAM_MIN, NGRAM_MAX, ctx, dyn, st, keys)
                nd = i64(len(tail)) - base
                n_drafted += nd
                j2: i64 = 0
                while j2 < nd and pos < n_ctx:
                    if toks[i_start + pos] != tail[base + j2]:
                        break
                    n_accept += 1
                    pos += 1
                    ctx._update_at(toks, i_start, pos, 1, NGRAM_MIN, NGRAM_MAX)
                    j2 += 1
            if pos < n_ctx:  # the "sampled" token is the ground truth
                pos += 1
                ctx._update_at(toks, i_start, pos, 1, NGRAM_MIN, NGRAM_MAX)
        t_draft += time.perf_counter() - t0
        dyn._merge_native(ctx)
        ctx._clear_keep()
        i_start += n_ctx
        if progress is not None:
            progress(int(min(i_start, total)), int(total))
    return n_drafted, n_accept, n_steps, t_draft


def replay_hybrid_core(
    toks: vec[i32],
    n_ctx: i64,
    n_draft: i64,
    st: StaticSource,
    dyn: NgramCache,
    state: HybridState,
    progress: Callable[[int, int], None] | None,
    total: i64,
    branches: i64 = 1,
) -> tuple[i64, i64, i64, float]:
    """The replay loop of ``_core.replay_core`` with hybrid drafts; (n_drafted, n_accept, n_steps, t).

    ``branches`` > 1: tree drafts (:meth:`HybridState.propose_tree`); a step accepts the longest
    prefix any branch shares with the text (what a tree verifier accepts) and is observed as
    branch 0's; ``n_drafted`` counts the trees' distinct nodes.
    """
    import time

    ctx = NgramCache()
    n_drafted: i64 = 0
    n_accept: i64 = 0
    n_steps: i64 = 0
    t_draft = 0.0
    i_start: i64 = 0
    check_ngram_range(NGRAM_MIN, NGRAM_MAX)
    own = vec[i32]()  # the query's context is the stream's end (the chunk is the current request)
    keys = state._keys  # draft_core's scratch, the state's own
    while i_start + n_ctx < total:
        t0 = time.perf_counter()
        state.begin_request()
        state._push_token(toks[i_start])
        pos: i64 = 1
        while pos < n_ctx:
            n_steps += 1
            tail = vec[i32](capacity=NGRAM_MAX + n_draft)
            lo: i64 = 0  # an if statement, not a conditional expression: see replay_core
            if pos > 4:
                lo = pos - 4
            for j in range(i_start + lo, i_start + pos):
                tail = append(tail, toks[j])
            base = i64(len(tail))
            if pos >= 2:
                tail = draft_core(tail, pos, n_draft, NGRAM_MIN, NGRAM_MAX, ctx, dyn, st, keys)
            obs: i64 = -1  # what the policy observes: the accepted count, or branch 0's share of it
            if branches > 1:
                tree = state._tree_step(tail, base, n_draft, own, st, branches)
                n_drafted += tree_nodes(tree)
                tail, obs = tree_path(tree, toks, i_start + pos, n_ctx - pos, tail, base)
                nd = i64(len(tail)) - base
            else:
                tail = state._suffix(tail, base, n_draft, own, st)
                nd = i64(len(tail)) - base
                n_drafted += nd
            acc: i64 = 0
            while acc < nd and pos < n_ctx:
                if toks[i_start + pos] != tail[base + acc]:
                    break
                n_accept += 1
                acc += 1
                pos += 1
                ctx._update_at(toks, i_start, pos, 1, NGRAM_MIN, NGRAM_MAX)
                state._push_token(toks[i_start + pos - 1])
            if obs < 0:
                obs = acc
            state._observe(obs)
            if pos < n_ctx:
                pos += 1
                ctx._update_at(toks, i_start, pos, 1, NGRAM_MIN, NGRAM_MAX)
                state._push_token(toks[i_start + pos - 1])
        t_draft += time.perf_counter() - t0
        dyn._merge_native(ctx)
        ctx._clear_keep()
        i_start += n_ctx
        if progress is not None:
            progress(int(min(i_start, total)), int(total))
    return n_drafted, n_accept, n_steps, t_draft


def replay(
    tokens: Sequence[int],
    n_ctx: int = 4096,
    n_draft: int = 8,
    nc_static: object = None,
    nc_dynamic: NgramCache | None = None,
    progress: Callable[[int, int], None] | None = None,
    policy: str = "llama",
    history: object = None,
    branches: int = 1,
    target_waste: float | None = None,
) -> ReplayResult:
    """Replay ``tokens`` as llama-lookup-stats does and return the counts and timings.

    ``policy`` is ``"llama"`` (llama.cpp's rule, exact) or ``"hybrid"`` (llama.cpp's drafts,
    then a suffix match over the chunks replayed so far: ``lookupdec.fast._hybrid``);
    ``history`` is the hybrid policy's ``SuffixHistory`` (a fresh one if None; kept and
    grown when given, like ``nc_dynamic``). ``branches`` > 1 (hybrid only) replays tree drafts
    (:meth:`HybridState.propose_tree`): a step accepts the longest prefix any branch shares with
    the text, and ``n_drafted`` counts the trees' distinct nodes. ``target_waste`` (hybrid
    only): the rejected drafted tokens per step the policy steers to (None: its default).

    The tokens are cut into chunks of ``n_ctx`` while ``i_start + n_ctx < len(tokens)``
    (so a last chunk that ends exactly at the end is dropped too, as in llama.cpp).
    Each chunk starts with an empty context cache; after a chunk the context cache is
    merged into the dynamic one, which therefore grows through the run. ``nc_dynamic``
    is modified in place when given and must be a fast NgramCache (TypeError otherwise).
    ``nc_static`` is a fast NgramCache, a StaticIndex, None, or any object with the
    reference's ``part(key)`` (looked up through Python calls).
    """
    if n_ctx < 1:
        raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
    check_draft_length(n_draft, "n_draft")
    check_policy(policy)
    check_branches(branches, policy)
    check_target_waste(target_waste, policy)
    st = require_static_source(nc_static)
    dyn = require_cache(nc_dynamic, "nc_dynamic") if nc_dynamic is not None else NgramCache()
    total = len(tokens)
    n_chunks = max(0, (total - 1) // n_ctx) if total > n_ctx else 0
    # Only the chunks' tokens are ever read (and range-checked, as the reference's updates do).
    # (With n_ctx 1 llama.cpp's loop reads none; the hybrid policy's still adds each chunk's one
    # token to its history, as the reference's does.)
    used = n_chunks * n_ctx if n_ctx >= 2 or policy == "hybrid" else 0
    toks = to_vec(tokens[:used] if used < total else tokens)
    if policy == "hybrid":
        if history is None:
            history = SuffixHistory()
        if not isinstance(history, SuffixHistory):
            raise TypeError(f"history must be a fast SuffixHistory, not {type(history).__name__}")
        state = HybridState(history, target_waste=TARGET_WASTE if target_waste is None else target_waste)
        n_drafted, n_accept, n_steps, t_draft = replay_hybrid_core(
            toks, n_ctx, n_draft, st, dyn, state, progress, total, branches
        )
    else:
        n_drafted, n_accept, n_steps, t_draft = replay_core(toks, n_ctx, n_draft, st, dyn, progress, total)
    return ReplayResult(
        n_ctx=n_ctx,
        n_draft=n_draft,
        n_tokens=total,
        n_predict=total - total % n_ctx,
        n_drafted=int(n_drafted),
        n_accept=int(n_accept),
        t_draft_s=t_draft,
        n_steps=int(n_steps),
        policy=policy,
        branches=branches,
    )
