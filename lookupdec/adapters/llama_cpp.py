"""lookupdec drafting in llama-cpp-python (0.3.x), as its ``draft_model``.

::

    import lookupdec
    from llama_cpp import Llama
    from lookupdec.adapters.llama_cpp import LookupDraftModel

    drafter = lookupdec.Drafter(static="corpus.lkdc", dynamic="dynamic.bin", n_draft=8)
    draft_model = LookupDraftModel(drafter)
    llm = Llama(model_path="model.gguf", draft_model=draft_model, logits_all=True)
    out = llm("Once upon a time", max_tokens=200, temperature=0)
    draft_model.end()      # llama-cpp-python has no end-of-request hook: end it yourself
    drafter.save()

``Llama.generate`` calls the draft model with the committed history after every step (the
prompt, every accepted token, and the token just sampled). A history that extends the last one
continues the request; one that does not (a new prompt) ends it and starts a new one. Because
llama-cpp-python tells a draft model neither when a request starts nor when it ends, the last
request stays open until the next one begins or :meth:`LookupDraftModel.end` is called.

The adapter subclasses ``llama_cpp.llama_speculative.LlamaDraftModel`` when llama-cpp-python is
installed and plain ``object`` otherwise (it only needs NumPy), so it can be used and tested
without compiling llama.cpp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from lookupdec.adapters import HistoryFollower

if TYPE_CHECKING:
    _DraftModelBase = object
else:
    try:
        from llama_cpp.llama_speculative import LlamaDraftModel as _DraftModelBase
    except ImportError:  # llama-cpp-python not installed: the adapter still works with anything that calls it
        _DraftModelBase = object

LLAMA_CPP_AVAILABLE: bool = _DraftModelBase is not object
"""True when llama-cpp-python is installed and :class:`LookupDraftModel` is a ``LlamaDraftModel``."""


class LookupDraftModel(_DraftModelBase):
    """A llama-cpp-python draft model that proposes lookupdec drafts (``Llama(..., draft_model=...)``).

    ``n_draft`` (default: the drafter's) bounds each proposal; ``stop`` ids (e.g. the model's
    end-of-sequence token) cut a proposal before them.
    """

    def __init__(self, drafter: Any, n_draft: int | None = None, stop: tuple[int, ...] = ()) -> None:
        self.follower = HistoryFollower(drafter)
        """The request-following state (``follower.request`` is the current request)."""
        self.n_draft: int = drafter.n_draft if n_draft is None else n_draft
        """Tokens proposed per call at most."""
        self.stop = frozenset(stop)
        """Ids a proposal is cut before."""

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        """The draft that follows ``input_ids`` (the committed history), as ``numpy.intc`` ids."""
        history: list[int] = np.asarray(input_ids).tolist()
        proposal = self.follower.sync(history).propose(self.n_draft, stop=self.stop)
        return np.array(proposal, dtype=np.intc)

    def end(self, history: npt.ArrayLike | None = None) -> None:
        """End the current request (after counting the final ``history`` when given)."""
        self.follower.end(np.asarray(history).tolist() if history is not None else None)


__all__ = ["LLAMA_CPP_AVAILABLE", "LookupDraftModel"]
