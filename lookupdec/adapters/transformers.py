"""lookupdec drafting in Hugging Face transformers (4.56 to 5.x, torch), through public API only.

::

    import lookupdec
    from lookupdec.adapters.transformers import lookup_generate

    drafter = lookupdec.Drafter(static="corpus.lkdc", dynamic="dynamic.bin", n_draft=8)
    out = model.generate(input_ids, custom_generate=lookup_decoding(drafter), max_new_tokens=200)
    drafter.save()

On transformers 5.x, ``custom_generate=lookup_generate, drafter=drafter`` works too (4.x
refuses arguments a custom function adds to ``generate``; :func:`lookup_decoding` binds them).

``custom_generate`` (a callable) is transformers' documented way to replace the decoding loop:
``generate`` prepares the generation config, logits processors and stopping criteria, then calls
:func:`lookup_generate`, which runs its own draft-and-verify loop on the model's public
``forward`` with a ``DynamicCache`` (cropped after each verification). Greedy output is exactly
the model's greedy output; with ``do_sample=True`` every position is sampled from the model's
own distribution and a draft token is kept only when it equals the sampled token, so the output
has the model's distribution. One sequence at a time: batch size 1.

Streaming: transformers 5.x keeps ``streamer=`` for itself and does not hand it to a custom
``generate`` function (it would receive the prompt, never the new tokens nor ``end()``), so give
the streamer to :func:`lookup_decoding` (``stream=``): it gets the prompt, each step's committed
tokens and ``end()``. A ``streamer`` that 4.x hands over (after putting the prompt) gets the
rest.

:class:`Verifier` and :func:`decode` are the loop's parts, for a loop of your own (``perf
speedup`` times them); :class:`LookupCandidateGenerator` plugs lookupdec into code written
against transformers' ``CandidateGenerator`` interface.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any

try:
    import torch
    from transformers import DynamicCache
    from transformers.generation.candidate_generator import CandidateGenerator
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        f"lookupdec.adapters.transformers needs torch and transformers ({e}): pip install 'lookupdec[transformers]'"
    ) from e

from lookupdec.adapters import DraftLength, HistoryFollower
from lookupdec.errors import VocabularyError

Propose = Callable[[Sequence[int], int], Sequence[int]]
"""``propose(tokens, k)``: up to ``k`` tokens likely to follow ``tokens`` (the committed sequence)."""
Choose = Callable[["torch.Tensor", Sequence[int], int], list[int]]
"""``choose(logits, tokens, start)``: the model's token at each of ``logits``' rows.

``logits`` has one row per position from ``start - 1`` on (row i predicts the token at
``start + i``), ``tokens`` is the committed sequence followed by the draft being verified.
"""


def _single_row(input_ids: torch.Tensor) -> list[int]:
    if not isinstance(input_ids, torch.Tensor):  # a numpy array failed on .dim()
        raise TypeError(f"input_ids must be a torch tensor of token ids, not {type(input_ids).__name__}")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(
            f"lookupdec drafting in transformers needs batch size 1 (assisted decoding drafts one sequence), "
            f"got input_ids of shape {tuple(input_ids.shape)}"
        )
    row: list[int] = input_ids[0].tolist()
    return row


def _eos_ids(eos_token_id: torch.Tensor | int | Sequence[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, str):  # "17" was read as the ids 1 and 7
        raise TypeError(f"eos_token_id must be an int, a list of ints or a tensor, not a str ({eos_token_id!r})")
    if isinstance(eos_token_id, int):
        return frozenset((eos_token_id,))
    if isinstance(eos_token_id, torch.Tensor):
        return frozenset(eos_token_id.flatten().tolist())
    return frozenset(int(t) for t in eos_token_id)


class Verifier:
    """A decoder-only model's forward passes over a KV cache that can be rolled back.

    :meth:`forward` feeds new tokens (those the cache does not hold yet) and returns their
    logits; :meth:`rollback` drops the last tokens from the cache (a rejected draft). Works with
    transformers 4.56 to 5.x: the forward's cache argument (``past_key_values`` before 5.24,
    ``cache`` after) and ``crop``'s meaning (a length or a negative count in 4.x, a negative
    count in 5.x) are read from the installed version's signatures.
    """

    def __init__(self, model: Any, cache: Any = None) -> None:
        self.model = model
        """The model (``model(input_ids=..., use_cache=True, <cache>=...)`` returns ``.logits``)."""
        self.cache: Any = cache if cache is not None else _new_cache(model)
        """The KV cache, updated in place by every forward pass."""
        self.length = 0
        """Tokens the cache holds."""
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._logits_to_keep = "logits_to_keep" in params
        # transformers 5.x: crop(-n) removes n tokens and crop(0) still resizes sliding-window
        # layers; 4.x: crop(n >= 0) keeps n tokens, so crop(0) would empty the cache.
        self._crop_zero = "tokens_to_remove" in inspect.signature(self.cache.crop).parameters

    def forward(self, ids: Sequence[int], keep: int = 0) -> torch.Tensor:
        """Feed ``ids`` after the cached tokens; their logits, shape ``(len(ids), vocab)``.

        ``keep``: only the last ``keep`` positions' logits (0: all). A prompt's prefill needs
        one row, and a row over a large vocabulary is large (128,256 floats for Llama 3).
        """
        device = getattr(self.model, "device", None)
        tensor = torch.tensor([list(ids)], dtype=torch.long, device=device)
        extra: dict[str, Any] = {self._cache_arg: self.cache}
        if keep and self._logits_to_keep:
            extra["logits_to_keep"] = keep
        with torch.no_grad():
            out = self.model(input_ids=tensor, use_cache=True, **extra)
        self.length += len(ids)
        logits: torch.Tensor = out.logits[0]
        return logits

    def rollback(self, n: int) -> None:
        """Drop the last ``n`` tokens from the cache."""
        if not 0 <= n <= self.length:  # more than it holds left a negative length
            raise ValueError(f"rollback({n}): the cache holds {self.length} tokens")
        if n > 0 or self._crop_zero:
            self.cache.crop(-n)
        self.length -= n


def _new_cache(model: Any) -> Any:
    try:
        return DynamicCache(config=model.config)  # layer types (sliding windows) from the config
    except TypeError:  # an older DynamicCache takes no config
        return DynamicCache()


def greedy(logits: torch.Tensor, tokens: Sequence[int], start: int) -> list[int]:
    """The model's greedy choice at each row (the :data:`Choose` of plain greedy decoding)."""
    choice: list[int] = logits.argmax(dim=-1).tolist()
    return choice


class StepLog:
    """What :func:`decode` did, step by step (a step: one verification forward pass)."""

    def __init__(self) -> None:
        self.drafted: list[int] = []
        """Tokens proposed at each step."""
        self.committed: list[int] = []
        """Tokens committed at each step (accepted drafts and the model's own token)."""

    @property
    def steps(self) -> int:
        """Verification steps (the prefill is not one)."""
        return len(self.committed)


def decode(
    verifier: Verifier,
    prompt: Sequence[int],
    propose: Propose,
    *,
    k: int,
    max_new_tokens: int,
    choose: Choose = greedy,
    stop: Callable[[list[int], int], bool] | None = None,
    on_commit: Callable[[list[int]], None] | None = None,
    log: StepLog | None = None,
) -> list[int]:
    """Generate after ``prompt`` by drafting and verifying; the new tokens.

    The prompt is prefilled in one forward pass, then every step feeds the last committed
    token and a draft of up to ``k`` tokens (``propose(tokens, budget)``), takes the token
    ``choose`` picks at each position, keeps the draft's matching prefix and the model's
    next token, and rolls the rejected draft tokens back out of the cache. ``stop(tokens, i)``,
    called after every committed token (the step's ``i``-th), ends generation (an
    end-of-sequence token, a stop string); ``on_commit`` receives each step's committed tokens.
    """
    tokens = list(prompt)
    if not tokens:
        raise ValueError("decode needs a prompt of at least one token")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_new_tokens == 0:  # the prefill's token would be one too many
        return []
    end = len(tokens) + max_new_tokens
    logits = verifier.forward(tokens, keep=1)[-1:]
    new = choose(logits, tokens, len(tokens))
    while True:
        committed: list[int] = []
        done = False
        for i, t in enumerate(new):
            tokens.append(t)
            committed.append(t)
            if len(tokens) >= end or (stop is not None and stop(tokens, i)):
                done = True
                break
        if on_commit is not None:
            on_commit(committed)
        if log is not None and log.drafted:
            log.committed.append(len(committed))
        if done:
            return tokens[len(prompt) :]
        # One more token comes from the model after the draft: keep within max_new_tokens.
        budget = min(k, end - len(tokens) - 1)
        draft = list(propose(tokens, budget)) if budget > 0 else []
        if log is not None:
            log.drafted.append(len(draft))
        n_known = verifier.length
        logits = verifier.forward(tokens[n_known:] + draft)[-(len(draft) + 1) :]
        choice = choose(logits, tokens + draft, len(tokens))
        n = 0
        while n < len(draft) and choice[n] == draft[n]:
            n += 1
        verifier.rollback(len(draft) - n)
        new = [*draft[:n], choice[n]]


class RequestProposer:
    """:data:`Propose` from a :class:`lookupdec.Drafter`: one request, extended as the sequence grows.

    ``vocab_size``: the model's (drafted ids past it are a clear error, see
    :class:`lookupdec.adapters.HistoryFollower`). ``adaptive`` (the default): each proposal is
    as long as pays off, from the measured time of the steps and the drafts' acceptance
    (:class:`lookupdec.adapters.DraftLength`, or one given to share what it learned); False:
    always as long as asked.
    """

    def __init__(
        self,
        drafter: Any,
        stop: Collection[int] = (),
        vocab_size: int | None = None,
        adaptive: bool | DraftLength = True,
    ) -> None:
        k = drafter.n_draft
        ctl = adaptive if isinstance(adaptive, DraftLength) else DraftLength(k) if adaptive else None
        self.follower = HistoryFollower(drafter, vocab_size, ctl)
        """The request-following state (``follower.request`` is the current request)."""
        self.stop = frozenset(stop)
        """Ids a proposal is cut before (end-of-sequence tokens)."""

    def __call__(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` drafted tokens after ``tokens``."""
        return self.follower.propose(tokens, k, self.stop)

    def end(self, tokens: Sequence[int] | None = None) -> None:
        """End the request (after counting the final ``tokens`` when given)."""
        self.follower.end(tokens)


def _processed_choice(logits_processor: Any, do_sample: bool) -> tuple[Choose, list[torch.Tensor]]:
    """A :data:`Choose` that applies ``logits_processor`` at every position, as ``generate`` does."""
    scores_seen: list[torch.Tensor] = []

    def choose(logits: torch.Tensor, tokens: Sequence[int], start: int) -> list[int]:
        out: list[int] = []
        scores_seen.clear()
        for i in range(logits.shape[0]):
            row = logits[i : i + 1].float()
            if logits_processor is not None and len(logits_processor) > 0:
                prefix = torch.tensor([list(tokens[: start + i])], dtype=torch.long, device=logits.device)
                row = logits_processor(prefix, row)
            scores_seen.append(row)
            if do_sample:
                out.append(int(torch.multinomial(torch.softmax(row, dim=-1), 1)[0, 0]))
            else:
                out.append(int(row.argmax(dim=-1)[0]))
            # A sampled draft position past the first mismatch is never used: stop sampling there.
            if do_sample and start + i < len(tokens) and out[-1] != tokens[start + i]:
                break
        return out

    return choose, scores_seen


def lookup_generate(
    model: Any,
    input_ids: torch.LongTensor,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    synced_gpus: bool = False,
    streamer: Any = None,
    drafter: Any = None,
    stream: Any = None,
    adaptive: bool | DraftLength = True,
    **model_kwargs: Any,
) -> Any:
    """``model.generate(..., custom_generate=lookup_generate, drafter=drafter)``: generation with lookupdec drafts.

    Drafts ``drafter.n_draft`` tokens at most per step (cut before an end-of-sequence id and at
    ``max_length``); one request per call, ended (merged into the drafter's dynamic cache) when
    generation returns. ``stream``: a transformers streamer (see the module's docstring).
    ``adaptive``: draft only as long as pays off on this model and machine (see
    :class:`RequestProposer`; what it learned of the model's step costs is kept for the model's
    next calls); False: always ``drafter.n_draft``.
    Returns the sequences tensor, or a ``GenerateDecoderOnlyOutput`` holding it when
    ``return_dict_in_generate`` is set.
    """
    _check_drafter(drafter, "lookup_generate needs drafter=lookupdec.Drafter(...) in model.generate(...)")
    _check_stream(stream)
    prompt = _single_row(input_ids)
    vocab_size = _model_vocab_size(model)
    if vocab_size is not None and prompt and (min(prompt) < 0 or max(prompt) >= vocab_size):
        # Before the prefill: torch's embedding raised an IndexError (a device assert on CUDA).
        i = next(i for i, t in enumerate(prompt) if not 0 <= t < vocab_size)
        raise VocabularyError(f"prompt token {i} is {prompt[i]}: not an id of the model's vocabulary of {vocab_size}")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError("lookup_generate takes one unpadded sequence: its attention_mask must be all ones")
    config = generation_config if generation_config is not None else model.generation_config
    do_sample = bool(getattr(config, "do_sample", False))
    eos = _eos_ids(getattr(config, "eos_token_id", None))
    max_length = int(getattr(config, "max_length", None) or len(prompt) + 20)
    # generate() prepared a cache for the model (5.x: "cache", 4.x: "past_key_values"): use it
    # when it is an empty dynamic one, so its layer types are the model's.
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    if cache is not None and (not isinstance(cache, DynamicCache) or cache.get_seq_length() != 0):
        cache = None
    verifier = Verifier(model, cache)
    choose, scores = _processed_choice(logits_processor, do_sample)
    if adaptive is True:
        adaptive = _model_draft_length(model, drafter.n_draft)
    proposer = RequestProposer(drafter, stop=eos, vocab_size=vocab_size, adaptive=adaptive)

    def stop(tokens: list[int], i: int) -> bool:
        if tokens[-1] in eos:
            return True
        if stopping_criteria is None or len(stopping_criteria) == 0:
            return False
        ids = torch.tensor([tokens], dtype=torch.long, device=input_ids.device)
        # the scores of the token just committed: what generate gives criteria that read them
        return bool(torch.as_tensor(stopping_criteria(ids, scores[i])).any())

    def on_commit(committed: list[int]) -> None:
        if stream is not None:
            stream.put(torch.tensor(committed, dtype=torch.long))

    if stream is not None:
        stream.put(input_ids.cpu())
    elif streamer is not None:  # transformers 4.x hands its streamer over, the prompt already put
        stream = streamer
    try:
        new = decode(
            verifier,
            prompt,
            proposer,
            k=drafter.n_draft,
            max_new_tokens=max(0, max_length - len(prompt)),
            choose=choose,
            stop=stop,
            on_commit=on_commit,
        )
    finally:
        if stream is not None:
            stream.end()
    sequence = prompt + new
    proposer.end(sequence)
    sequences = torch.tensor([sequence], dtype=input_ids.dtype, device=input_ids.device)
    if getattr(config, "return_dict_in_generate", False):
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=sequences)  # type: ignore[arg-type,unused-ignore]
    return sequences


# A model's step costs, learned by one generation's DraftLength, serve its next ones.
_draft_lengths: weakref.WeakKeyDictionary[Any, DraftLength] = weakref.WeakKeyDictionary()


def _model_draft_length(model: Any, k: int) -> DraftLength:
    ctl = _draft_lengths.get(model)
    if ctl is None or ctl.k != k:
        ctl = _draft_lengths[model] = DraftLength(k)
    return ctl


def _model_vocab_size(model: Any) -> int | None:
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None)
    if size is None and config is not None and hasattr(config, "get_text_config"):
        size = getattr(config.get_text_config(), "vocab_size", None)
    return int(size) if size is not None else None


def _check_drafter(drafter: Any, message: str) -> None:
    """TypeError ``message`` unless ``drafter`` is a Drafter (or drafts as one: ``request`` and ``n_draft``)."""
    if drafter is None or not (hasattr(drafter, "request") and hasattr(drafter, "n_draft")):
        raise TypeError(f"{message}, not {type(drafter).__name__}")


def _check_stream(stream: Any) -> None:
    """TypeError unless ``stream`` is None or a streamer (``put`` and ``end``; 5 failed at the first put)."""
    if stream is not None and not (callable(getattr(stream, "put", None)) and callable(getattr(stream, "end", None))):
        raise TypeError(f"stream must be a transformers streamer (put and end), not {type(stream).__name__}")


def lookup_decoding(drafter: Any, *, stream: Any = None, adaptive: bool | DraftLength = True) -> Callable[..., Any]:
    """``model.generate(..., custom_generate=lookup_decoding(drafter))``: :func:`lookup_generate` bound to ``drafter``.

    ``stream``: a transformers streamer that receives the prompt, the committed tokens and
    ``end()`` (see the module's docstring); ``adaptive``: see :func:`lookup_generate`.
    """
    _check_drafter(drafter, "lookup_decoding needs a lookupdec.Drafter")
    _check_stream(stream)
    return functools.partial(lookup_generate, drafter=drafter, stream=stream, adaptive=adaptive)


# Without transformers installed, mypy sees CandidateGenerator as Any (subclassing Any is an error then).
class LookupCandidateGenerator(CandidateGenerator):  # type: ignore[misc,unused-ignore]
    """A transformers ``CandidateGenerator`` whose candidates are lookupdec drafts.

    Each :meth:`get_candidates` call sees the committed sequence: the tokens added since the
    last call (accepted drafts and the model's own token) are counted into the request, then
    up to ``drafter.n_draft`` tokens are proposed, cut before an end-of-sequence id and so that
    the sequence plus the model's next token stays within ``max_length``. A sequence that does
    not extend the previous one starts a new request. Call :meth:`end` when generation is over.
    """

    def __init__(
        self,
        drafter: Any,
        *,
        eos_token_id: torch.Tensor | int | list[int] | None = None,
        max_length: int | None = None,
    ) -> None:
        self.follower = HistoryFollower(drafter)
        """The request-following state (``follower.request`` is the current request)."""
        self.eos_token_ids: frozenset[int] = _eos_ids(eos_token_id)
        """Ids a proposal is cut before."""
        self.max_length = max_length
        """The longest sequence generation may produce (None: no limit)."""

    # Upstream annotates the logits as Tensor, yet documents them optional and its own prompt-lookup
    # generator returns None, as this one must (lookup drafting has no logits).
    def get_candidates(  # type: ignore[override,unused-ignore]
        self, input_ids: torch.LongTensor, **kwargs: Any
    ) -> tuple[torch.LongTensor, None]:
        """``input_ids`` followed by the draft (no draft logits: lookup drafting has none)."""
        history = _single_row(input_ids)
        k = self.follower.drafter.n_draft
        if self.max_length is not None:
            k = min(k, self.max_length - len(history) - 1)  # the model adds one token after the draft
        if k <= 0:
            self.follower.sync(history)
            return input_ids, None
        proposal = self.follower.propose(history, k, self.eos_token_ids)
        if not proposal:
            return input_ids, None
        draft = torch.tensor([proposal], dtype=input_ids.dtype, device=input_ids.device)
        return torch.cat((input_ids, draft), dim=1), None  # type: ignore[return-value,unused-ignore]

    def update_candidate_strategy(self, input_ids: torch.Tensor, scores: torch.Tensor, num_matches: int) -> None:
        """Nothing to adapt: the accepted tokens are counted on the next :meth:`get_candidates`."""

    def end(self, sequence: torch.Tensor | None = None) -> None:
        """End the request, after counting the final ``sequence`` (shape (1, n)) when given."""
        self.follower.end(_single_row(sequence) if sequence is not None else None)


__all__ = [
    "Choose",
    "LookupCandidateGenerator",
    "Propose",
    "RequestProposer",
    "StepLog",
    "Verifier",
    "decode",
    "greedy",
    "lookup_decoding",
    "lookup_generate",
]
