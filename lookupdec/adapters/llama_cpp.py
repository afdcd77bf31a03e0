"""lookupdec drafting in llama-cpp-python (0.3.x), as its ``draft_model``.

::

    import lookupdec
    from llama_cpp import Llama
    from lookupdec.adapters.llama_cpp import LookupDraftModel

    drafter = lookupdec.Drafter(static="corpus.lkdc", dynamic="dynamic.bin", n_draft=8)
    llm = Llama(model_path="model.gguf", logits_all=True)
    draft_model = llm.draft_model = LookupDraftModel(drafter, n_vocab=llm.n_vocab())
    prompt = llm.tokenize(b"Once upon a time")
    ids = list(draft_model.generate(llm, prompt, max_tokens=200, temp=0))
    print(llm.detokenize(ids).decode())
    drafter.save()

``Llama.generate`` calls the draft model with the committed history after every step (the
prompt, every accepted token, and the token just sampled); llama-cpp-python tells a draft model
neither when a generation starts nor when it ends. :meth:`LookupDraftModel.generate` wraps
``llm.generate`` and ends the request with its exact final history (every token it yielded)
when it returns or is closed. Through ``llm(...)``, ``create_completion`` or
``create_chat_completion``, a history that is not the next step of the last (the accepted part
of the last draft and one more token: see :class:`lookupdec.adapters.HistoryFollower`), such as a
chat's next turn, a new prompt or the same prompt again, ends the request and starts a new one;
the last request stays open until then or until :meth:`LookupDraftModel.end`, and the tokens
sampled after the last draft call are counted only when ``end`` is given the final history.

``n_vocab`` (the model's, ``llm.n_vocab()``) bounds the drafted ids: a drafter built for a
larger vocabulary is refused, and an id past it is a clear error rather than a crash inside
llama.cpp.

The adapter subclasses ``llama_cpp.llama_speculative.LlamaDraftModel`` when llama-cpp-python is
installed and plain ``object`` otherwise (it only needs NumPy), so it can be used and tested
without compiling llama.cpp.

On a CPU with Intel AMX, llama-cpp-python 0.3.36 built for it (the default, ``GGML_NATIVE``)
puts Q4_0, Q4_1 and Q8_0 weights in llama.cpp's AMX buffers, and its first forward pass can
crash the process (a segmentation fault in ``ggml_backend_amx_mul_mat``, llama.cpp issue
#20824; SmolLM2-135M Q4_1 does on this project's VM). Load the model inside :func:`no_repack`,
llama.cpp's ``--no-repack``, to keep the weights in plain CPU buffers::

    with no_repack(where_amx=True):
        llm = Llama(model_path="model.gguf", logits_all=True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from lookupdec.adapters import DraftLength, HistoryFollower

if TYPE_CHECKING:
    _DraftModelBase = object
else:
    try:
        from llama_cpp.llama_speculative import LlamaDraftModel as _DraftModelBase
    except ImportError:  # llama-cpp-python not installed: the adapter still works with anything that calls it
        _DraftModelBase = object

LLAMA_CPP_AVAILABLE: bool = _DraftModelBase is not object
"""True when llama-cpp-python is installed and :class:`LookupDraftModel` is a ``LlamaDraftModel``."""


def _room(history: npt.NDArray[Any]) -> int | None:
    """How many drafted tokens the engine can hold after ``history`` (None: not known).

    ``Llama.generate`` passes ``input_ids[: n]``, a view of the buffer it writes the next step's
    tokens into (the token just sampled, at ``n - 1``, and the draft after it). llama-cpp-python
    0.3.36 sizes that buffer, and ``scores``, by the ``n_ctx`` asked for, but cuts a draft at
    llama.cpp's context, which may be padded past it (``Llama(n_ctx=128).n_ctx()`` is 256): a
    draft past the buffer's end then failed the step with a NumPy broadcast error where plain
    generation still had room.
    """
    base = history.base
    if not isinstance(base, np.ndarray) or base.ndim != 1 or history.ndim != 1:
        return None
    if history.__array_interface__["data"][0] != base.__array_interface__["data"][0]:
        return None  # not the buffer's start: the room is not known
    return int(base.shape[0]) - int(history.shape[0])


def cpu_has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has Intel AMX (read from Linux's ``/proc/cpuinfo``; False where it cannot be read)."""
    try:
        flags = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return "amx_int8" in flags or "amx_bf16" in flags or "amx_tile" in flags


@contextlib.contextmanager
def no_repack(where_amx: bool = False) -> Iterator[None]:
    """Models loaded by ``llama_cpp.Llama(...)`` inside keep their weights out of llama.cpp's extra buffers.

    This is llama.cpp's ``--no-repack`` (``use_extra_bufts = false``), which ``Llama`` does not
    expose: the weights are not repacked for AMX (whose buffers crash llama-cpp-python 0.3.36 on
    AMX CPUs, see the module's docs) or for the CPU's other repacked layouts. ``where_amx``:
    only on a CPU with AMX (:func:`cpu_has_amx`); elsewhere the models load as usual.
    """
    if where_amx and not cpu_has_amx():
        yield
        return
    import llama_cpp.llama_cpp as lib  # what Llama.__init__ calls for its default model parameters

    default = lib.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = default


class LookupDraftModel(_DraftModelBase):
    """A llama-cpp-python draft model that proposes lookupdec drafts (``Llama(..., draft_model=...)``).

    ``n_draft`` (default: the drafter's) bounds each proposal; ``stop`` ids (e.g. the model's
    end-of-sequence token) cut a proposal before them; ``n_vocab`` is the model's vocabulary size.
    ``adaptive`` (the default): each proposal is as long as pays off on this engine, from the
    measured time of its steps and the drafts' acceptance (:class:`lookupdec.adapters.DraftLength`;
    give one to share what it learned between draft models of the same engine); False: always up
    to ``n_draft``.
    """

    def __init__(
        self,
        drafter: Any,
        n_draft: int | None = None,
        stop: tuple[int, ...] = (),
        n_vocab: int | None = None,
        adaptive: bool | DraftLength = True,
    ) -> None:
        k: int = drafter.n_draft if n_draft is None else n_draft
        ctl = adaptive if isinstance(adaptive, DraftLength) else DraftLength(k) if adaptive else None
        self.follower = HistoryFollower(drafter, n_vocab, ctl)
        """The request-following state (``follower.request`` is the current request)."""
        self.n_draft = k
        """Tokens proposed per call at most."""
        self.stop = frozenset(stop)
        """Ids a proposal is cut before."""

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        """The draft that follows ``input_ids`` (the committed history), as ``numpy.intc`` ids.

        The draft fits the engine's buffers (:func:`_room`): no longer than the room left in the
        array ``input_ids`` is the start of."""
        ids = np.asarray(input_ids)
        history: list[int] = ids.tolist()
        k = self.n_draft
        room = _room(ids)
        if room is not None:
            k = max(0, min(k, room))
        proposal = self.follower.propose(history, k, self.stop)
        return np.array(proposal, dtype=np.intc)

    def generate(
        self, llm: Any, tokens: Sequence[int], *, max_tokens: int | None = None, **kwargs: Any
    ) -> Generator[int, None, None]:
        """``llm.generate(tokens, **kwargs)`` drafted by this model: the generated ids, stopping at end of sequence.

        ``llm`` must have this object as its ``draft_model``. Generation stops before the
        model's end-of-sequence token and after ``max_tokens`` tokens (None, 0 or less: at the
        context's end, as llama-cpp-python's ``create_completion`` reads them, or at its buffers'
        when they are smaller); the request ends with the prompt and every yielded token when the
        generator returns or is closed.
        """
        if getattr(llm, "draft_model", None) is not self:
            raise ValueError("LookupDraftModel.generate needs llm.draft_model to be this draft model")
        if max_tokens is not None:
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
                raise TypeError(f"max_tokens must be an int or None, not {type(max_tokens).__name__}")
            if max_tokens <= 0:
                max_tokens = None
        history = [int(t) for t in tokens]
        if not history:  # llama-cpp-python's own check is a bare assert, and a request was counted
            raise ValueError("LookupDraftModel.generate needs a prompt of at least one token")
        n_prompt = len(history)
        n_ctx = int(llm.n_ctx())
        buffer = getattr(llm, "input_ids", None)
        if isinstance(buffer, np.ndarray):  # smaller than llama.cpp's padded context: see _room
            n_ctx = min(n_ctx, len(buffer))
        eos = int(llm.token_eos())
        try:
            for token in llm.generate(history, **kwargs):
                if token == eos:
                    break
                history.append(int(token))
                yield int(token)
                if len(history) - n_prompt == max_tokens or len(history) >= n_ctx:
                    break
        finally:
            self.end(history)

    def end(self, history: npt.ArrayLike | None = None) -> None:
        """End the current request (after counting the final ``history`` when given)."""
        self.follower.end(np.asarray(history).tolist() if history is not None else None)


__all__ = ["LLAMA_CPP_AVAILABLE", "LookupDraftModel", "cpu_has_amx", "no_repack"]
