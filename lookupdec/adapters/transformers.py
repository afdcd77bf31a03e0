"""lookupdec drafting in Hugging Face transformers' assisted decoding (transformers 5.x, torch).

Two ways in::

    import lookupdec
    from lookupdec.adapters.transformers import lookup_generate

    drafter = lookupdec.Drafter(static="corpus.lkdc", dynamic="dynamic.bin", n_draft=8)
    out = model.generate(input_ids, custom_generate=lookup_generate, drafter=drafter, max_new_tokens=200)
    drafter.save()

or build a :class:`LookupCandidateGenerator` for a loop of your own. Assisted decoding in
transformers takes one sequence at a time: batch size 1.
"""

from __future__ import annotations

from typing import Any

try:
    import torch
    from transformers.generation.candidate_generator import CandidateGenerator
    from transformers.generation.utils import GenerationMixin
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        f"lookupdec.adapters.transformers needs torch and transformers ({e}): pip install 'lookupdec[transformers]'"
    ) from e

from lookupdec.adapters import HistoryFollower


def _single_row(input_ids: torch.Tensor) -> list[int]:
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(
            f"lookupdec drafting in transformers needs batch size 1 (assisted decoding drafts one sequence), "
            f"got input_ids of shape {tuple(input_ids.shape)}"
        )
    row: list[int] = input_ids[0].tolist()
    return row


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
        # One typed list: torch's ``tolist()`` is typed loosely (mypy cannot see it gives ints).
        ids: list[int]
        if isinstance(eos_token_id, torch.Tensor):
            ids = [int(t) for t in eos_token_id.flatten().tolist()]
        elif isinstance(eos_token_id, int):
            ids = [eos_token_id]
        else:
            ids = list(eos_token_id or ())
        self.eos_token_ids: frozenset[int] = frozenset(ids)
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
        req = self.follower.sync(history)
        k = self.follower.drafter.n_draft
        if self.max_length is not None:
            k = min(k, self.max_length - len(history) - 1)  # the model adds one token after the draft
        if k <= 0:
            return input_ids, None
        proposal = req.propose(k, stop=self.eos_token_ids)
        if not proposal:
            return input_ids, None
        draft = torch.tensor([proposal], dtype=input_ids.dtype, device=input_ids.device)
        return torch.cat((input_ids, draft), dim=1), None  # type: ignore[return-value,unused-ignore]

    def update_candidate_strategy(self, input_ids: torch.Tensor, scores: torch.Tensor, num_matches: int) -> None:
        """Nothing to adapt: the accepted tokens are counted on the next :meth:`get_candidates`."""

    def end(self, sequence: torch.Tensor | None = None) -> None:
        """End the request, after counting the final ``sequence`` (shape (1, n)) when given."""
        self.follower.end(_single_row(sequence) if sequence is not None else None)


def lookup_generate(
    model: Any,
    input_ids: torch.LongTensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    synced_gpus: bool = False,
    streamer: Any = None,
    drafter: Any = None,
    **model_kwargs: Any,
) -> Any:
    """``model.generate(..., custom_generate=lookup_generate, drafter=drafter)``: assisted decoding with lookupdec.

    Runs transformers' own assisted decoding (so greedy output is exactly the model's greedy
    output) with a :class:`LookupCandidateGenerator` as the candidate source; one request per
    call, ended (merged into the drafter's dynamic cache) when generation returns.
    """
    if drafter is None:
        raise TypeError("lookup_generate needs drafter=lookupdec.Drafter(...) in model.generate(...)")
    _single_row(input_ids)
    generator = LookupCandidateGenerator(
        drafter,
        eos_token_id=getattr(generation_config, "_eos_token_tensor", None),
        max_length=generation_config.max_length,
    )

    def use_lookup(*args: Any, **kwargs: Any) -> LookupCandidateGenerator:
        return generator

    # _assisted_decoding asks the model for its candidate generator; answer with ours for this call.
    model._get_candidate_generator = use_lookup
    try:
        result = GenerationMixin._assisted_decoding(
            model,
            input_ids,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            synced_gpus=synced_gpus,
            streamer=streamer,
            **model_kwargs,
        )
    finally:
        del model._get_candidate_generator
    sequences = result if isinstance(result, torch.Tensor) else result.sequences
    generator.end(sequences)
    return result


__all__ = ["LookupCandidateGenerator", "lookup_generate"]
