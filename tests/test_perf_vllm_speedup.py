"""perf vllm-speedup's parent side: configs, argument checks, and the table from the workers' results.

The workers themselves need vLLM: ``.ci/run`` runs the command in its vLLM environment."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from perf import vllm_speedup as vs


def test_speculative_configs() -> None:
    assert vs.speculative_config("none", 4) is None
    assert vs.speculative_config("vllm-ngram", 4) == {"method": "ngram", "num_speculative_tokens": 4}
    ngram = vs.speculative_config("vllm-ngram/2-5", 8)
    assert ngram is not None and (ngram["prompt_lookup_min"], ngram["prompt_lookup_max"]) == (2, 5)
    for policy in ("llama", "hybrid"):
        spec = vs.speculative_config(policy, 3)
        assert spec == {"method": "custom_class", "model": "lookupdec.adapters.vllm.LookupProposer",
                        "num_speculative_tokens": 3}  # fmt: skip
    with pytest.raises(ValueError, match="unknown config 'eagle'"):
        vs.speculative_config("eagle", 4)
    # the hybrid policy at another waste target: the same proposer, steered by its environment
    assert vs.speculative_config("hybrid/w0.5", 4) == vs.speculative_config("hybrid", 4)
    assert vs.lookupdec_env("hybrid/w0.5") == {
        "LOOKUPDEC_POLICY": "hybrid", "LOOKUPDEC_TARGET_WASTE": "0.5", "LOOKUPDEC_ADAPTIVE": "0"
    }  # fmt: skip
    assert vs.lookupdec_env("llama") == {"LOOKUPDEC_POLICY": "llama", "LOOKUPDEC_ADAPTIVE": "0"}
    assert vs.lookupdec_env("vllm-ngram") == {}
    # priced: said explicitly, so that a caller's LOOKUPDEC_ADAPTIVE=0 cannot change the config
    assert vs.lookupdec_env("hybrid") == {"LOOKUPDEC_POLICY": "hybrid", "LOOKUPDEC_ADAPTIVE": "1"}
    assert vs.lookupdec_env("hybrid/fixed") == {"LOOKUPDEC_POLICY": "hybrid", "LOOKUPDEC_ADAPTIVE": "0"}
    assert vs.lookupdec_env("hybrid/isolated") == {
        "LOOKUPDEC_POLICY": "hybrid",
        "LOOKUPDEC_ADAPTIVE": "1",
        "LOOKUPDEC_ISOLATE": "1",
    }
    assert vs.lookupdec_env("llama/isolated") == {
        "LOOKUPDEC_POLICY": "llama",
        "LOOKUPDEC_ADAPTIVE": "0",
        "LOOKUPDEC_ISOLATE": "1",
    }
    assert vs.lookupdec_env("vllm-ngram/isolated") == {}
    # the corpus in the hybrid policy's history: a file next to the checkpoint the worker runs
    corpus = {"LOOKUPDEC_CORPUS": str(Path("/models") / "smol.enwiki-2000000.lkcorpus")}
    assert vs.lookupdec_env("hybrid+corpus", Path("/models/smol")) == {**vs.lookupdec_env("hybrid"), **corpus}
    assert vs.lookupdec_env("hybrid+corpus/isolated", Path("/models/smol")) == {
        **vs.lookupdec_env("hybrid/isolated"),
        **corpus,
    }
    assert vs.lookupdec_env("hybrid+corpus/w0.5", Path("/models/smol")) == {**vs.lookupdec_env("hybrid/w0.5"), **corpus}
    assert vs.speculative_config("hybrid+corpus/isolated", 4) == vs.speculative_config("hybrid", 4)
    for bad in ("llama+corpus", "hybrid+corpus/x", "vllm-ngram+corpus"):
        with pytest.raises(ValueError, match=f"unknown config '{re.escape(bad)}'"):
            vs.speculative_config(bad, 4)
    assert vs.speculative_config("hybrid/fixed", 4) == vs.speculative_config("hybrid", 4)
    for bad in ("hybrid/wsome", "hybrid/w65", "hybrid/w"):
        with pytest.raises(ValueError, match="not a number of tokens per step"):
            vs.speculative_config(bad, 4)
    with pytest.raises(ValueError, match="unknown config 'llama/w1'"):
        vs.speculative_config("llama/w1", 4)


def test_bad_arguments_fail_before_any_worker(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_worker(*args: Any) -> list[Any]:
        raise AssertionError("a worker started")

    monkeypatch.setattr(vs, "run_worker", no_worker)
    with pytest.raises(ValueError, match="unknown config 'eagle'"):
        vs.main(["--python", sys.executable, "--configs", "none,eagle"])
    with pytest.raises(SystemExit):
        vs.main(["--python", sys.executable, "--configs", "llama"])
    assert "must include none" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        vs.main(["--python", "/nonexistent/python"])
    assert "/nonexistent/python: no such file" in capsys.readouterr().err


def test_table_from_worker_results(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = list(range(101))
    # what the workers report per config: 100 decoded tokens; "none" in 1.0 s after a 0.2 s
    # prefill, "llama" in 0.5 s with 60 of 80 drafted tokens accepted (40 steps), the same output;
    # "hybrid" in 0.25 s but with another output
    results = {
        "none": dict(prefill=0.2, total=1.2, accepted=0.0, drafted=0.0, outputs=[plain]),
        "llama": dict(prefill=0.2, total=0.7, accepted=60.0, drafted=80.0, outputs=[plain]),
        "hybrid": dict(prefill=0.2, total=0.45, accepted=60.0, drafted=80.0, outputs=[[*plain[:-1], 7]]),
    }
    seen: list[tuple[str, int]] = []

    def fake_worker(python: str, model_dir: Path, config: str, k: int, args: Any, prompts: Path) -> list[Any]:
        assert json.loads(prompts.read_text()) == [["rename", [1, 2, 3]]]
        seen.append((config, k))
        return [dict(name="rename", **results[config])]

    monkeypatch.setattr(vs, "export_smollm2", lambda out: out)
    monkeypatch.setattr(vs, "chat_prompts", lambda model_dir, n=4: [("rename", [1, 2, 3])])
    monkeypatch.setattr(vs, "run_worker", fake_worker)
    out = tmp_path / "out.json"
    argv = ["--python", sys.executable, "--configs", "none,llama,hybrid", "--rounds", "2", "--json", str(out)]
    assert vs.main(argv) == 0
    # every config once per round, the order rotated between rounds
    assert seen == [("none", 4), ("llama", 4), ("hybrid", 4), ("llama", 4), ("hybrid", 4), ("none", 4)]
    rows = {r["drafter"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["none"]["speedup"] == pytest.approx(1.0)
    assert rows["llama"]["speedup"] == pytest.approx(2.0)
    assert rows["llama"]["tokens_per_step"] == pytest.approx(100 / 40)
    assert rows["hybrid"]["speedup"] == pytest.approx(4.0)
    assert "outputs identical to no speculation: NO: hybrid k=4 rename" in capsys.readouterr().out
    # --check: a differing output fails in float32 (where verifying matches decoding), not in bfloat16
    assert vs.main([*argv, "--check"]) == 0
    assert vs.main([*argv, "--check", "--dtype", "float32"]) == 1
    assert "outputs differ from no speculation's in float32: NO: hybrid k=4 rename" in capsys.readouterr().err


def test_check_fails_where_no_draft_was_accepted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fake_worker(python: str, model_dir: Path, config: str, k: int, args: Any, prompts: Path) -> list[Any]:
        accepted = 30.0 if config == "llama" else 0.0  # vllm-ngram: nothing accepted
        return [dict(name="rename", prefill=0.1, total=1.1, accepted=accepted, drafted=40.0, outputs=[list(range(65))])]

    monkeypatch.setattr(vs, "export_smollm2", lambda out: out)
    monkeypatch.setattr(vs, "chat_prompts", lambda model_dir, n=4: [("rename", [1, 2, 3])])
    monkeypatch.setattr(vs, "run_worker", fake_worker)
    argv = ["--python", sys.executable, "--configs", "none,vllm-ngram,llama", "--rounds", "1"]
    assert vs.main(argv) == 0
    assert vs.main([*argv, "--check"]) == 1
    assert "no draft token accepted on any prompt: vllm-ngram k=4" in capsys.readouterr().err
    assert vs.main(["--python", sys.executable, "--configs", "none,llama", "--rounds", "1", "--check"]) == 0


def test_batch_counts_every_request(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two requests at once, 51 tokens each: 50 decoded each (the first comes from the prefill),
    # 100 in all; "llama" had 60 drafted tokens accepted, so 40 verification steps over the two
    first, second = list(range(51)), list(range(100, 151))
    results = {
        "none": dict(prefill=0.5, total=2.5, accepted=0.0, drafted=0.0, outputs=[first, second]),
        "llama": dict(prefill=0.5, total=1.0, accepted=60.0, drafted=90.0, outputs=[first, second]),
    }
    batches: list[bool] = []

    def fake_worker(python: str, model_dir: Path, config: str, k: int, args: Any, prompts: Path) -> list[Any]:
        batches.append(args.batch)
        return [dict(name=vs.batch_name(2), **results[config])]

    monkeypatch.setattr(vs, "export_smollm2", lambda out: out)
    monkeypatch.setattr(vs, "chat_prompts", lambda model_dir, n=4: [("rename", [1, 2, 3]), ("code", [4, 5])])
    monkeypatch.setattr(vs, "run_worker", fake_worker)
    out = tmp_path / "out.json"
    argv = ["--python", sys.executable, "--configs", "none,llama", "--rounds", "1", "--batch", "--json", str(out)]
    assert vs.main(argv) == 0
    assert batches == [True, True]
    rows = {r["drafter"]: r for r in json.loads(out.read_text())["rows"]}
    assert {r["workload"] for r in rows.values()} == {"batch-2"}
    assert rows["none"]["tokens_per_s"] == pytest.approx(100 / 2.0)
    assert rows["llama"]["speedup"] == pytest.approx(4.0)
    assert rows["llama"]["tokens_per_step"] == pytest.approx(100 / 40)
    printed = capsys.readouterr().out
    assert "all 2 requests at once" in printed and "outputs identical to no speculation: yes" in printed


def test_worker_command_says_batch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import argparse
    import subprocess

    commands: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: Any) -> Any:
        commands.append(cmd)
        Path(cmd[-3]).write_text("[]")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    for batch, max_seqs in ((False, 0), (True, 4)):
        args = argparse.Namespace(threads=0, new_tokens=8, dtype="float32", batch=batch, max_seqs=max_seqs)
        assert vs.run_worker(sys.executable, tmp_path, "none", 4, args, tmp_path / "p.json") == []
    assert [c[-2:] for c in commands] == [["single", "0"], ["batch", "4"]]


def test_prompts_and_max_seqs_checked(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(vs, "run_worker", lambda *args: pytest.fail("a worker started"))
    for argv, message in ((["--prompts", "0"], "--prompts must be in 1..16"), (["--max-seqs", "-1"], ">= 0")):
        with pytest.raises(SystemExit):
            vs.main(["--python", sys.executable, *argv])
        assert message in capsys.readouterr().err


def fake_tree(root: Path, compiled: bool = True) -> Path:
    """A checkout for --tree: perf/vllm_speedup.py and (``compiled``) a built lookupdec.fast._hybrid."""
    (root / "perf").mkdir(parents=True)
    (root / "perf" / "vllm_speedup.py").write_text("")
    (root / "lookupdec" / "fast").mkdir(parents=True)
    if compiled:
        (root / "lookupdec" / "fast" / "_hybrid.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    return root


def test_tree_runs_lookupdec_configs_beside_this_checkout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[str] = []

    def fake_worker(python: str, model_dir: Path, config: str, k: int, args: Any, prompts: Path) -> list[Any]:
        seen.append(config)
        out = list(range(20))
        return [dict(name="rename", prefill=0.1, total=1.1, accepted=5.0, drafted=9.0, outputs=[out])]

    monkeypatch.setattr(vs, "export_smollm2", lambda out: out)
    monkeypatch.setattr(vs, "chat_prompts", lambda model_dir, n=4: [("rename", [1, 2, 3])])
    monkeypatch.setattr(vs, "run_worker", fake_worker)
    tree = fake_tree(tmp_path / "base")
    argv = ["--python", sys.executable, "--configs", "none,vllm-ngram,hybrid", "--rounds", "1", "--tree", str(tree)]
    assert vs.main(argv) == 0
    assert seen == ["none", "vllm-ngram", "hybrid", "hybrid@base"]  # vLLM's own configs are not lookupdec's
    assert "hybrid@base" in capsys.readouterr().out
    for bad, message in (
        (tmp_path / "none", "not a lookupdec checkout"),
        (fake_tree(tmp_path / "raw", False), "not compiled"),
    ):
        with pytest.raises(SystemExit):
            vs.main([*argv[:-1], str(bad)])
        assert message in capsys.readouterr().err


def test_worker_of_a_base_config_runs_from_the_tree(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import argparse
    import subprocess

    calls: list[tuple[list[str], dict[str, Any]]] = []

    def fake_run(cmd: list[str], **kwargs: Any) -> Any:
        calls.append((cmd, kwargs))
        Path(cmd[-3]).write_text("[]")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    tree = tmp_path / "base"
    args = argparse.Namespace(threads=0, new_tokens=8, dtype="float32", batch=True, max_seqs=4, tree=str(tree))
    for config in ("hybrid", "hybrid@base"):
        vs.run_worker(sys.executable, tmp_path, config, 4, args, tmp_path / "p.json")
    (here, here_kw), (base, base_kw) = calls
    assert here[5] == base[5] == "hybrid"  # the config the worker runs: the same name in both trees
    assert here_kw["cwd"] == vs.REPO and base_kw["cwd"] == tree.resolve()
    assert base_kw["env"]["PYTHONPATH"].split(":")[0] == str(tree.resolve())


def test_save_outputs_for_batch_replay(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from perf.batch_replay import read_outputs

    first, second = list(range(10, 16)), list(range(20, 26))

    def fake_worker(python: str, model_dir: Path, config: str, k: int, args: Any, prompts: Path) -> list[Any]:
        return [dict(name=vs.batch_name(2), prefill=0.1, total=1.1, accepted=2.0, drafted=4.0, outputs=[first, second])]

    monkeypatch.setattr(vs, "export_smollm2", lambda out: out)
    monkeypatch.setattr(vs, "chat_prompts", lambda model_dir, n=4: [("rename", [1, 2, 3]), ("code", [4, 5])])
    monkeypatch.setattr(vs, "run_worker", fake_worker)
    saved = tmp_path / "outputs.json"
    argv = ["--python", sys.executable, "--configs", "none,llama", "--rounds", "1", "--batch", "--new-tokens", "6"]
    assert vs.main([*argv, "--save-outputs", str(saved)]) == 0
    assert read_outputs(saved) == [([1, 2, 3], first), ([4, 5], second)]


def test_worker_takes_the_policy_from_its_config_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import types

    class Started(Exception):
        pass

    seen: dict[str, str] = {}

    class FakeLLM:
        def __init__(self, **kwargs: Any) -> None:
            import os

            seen.update({k: v for k, v in os.environ.items() if k in vs.POLICY_VARS})
            raise Started

    vllm = types.ModuleType("vllm")
    vllm.LLM = FakeLLM  # type: ignore[attr-defined]
    vllm.SamplingParams = object  # type: ignore[attr-defined]
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    # the caller's own settings, which would make "hybrid" another config (set through monkeypatch,
    # which restores all three: the worker changes os.environ itself)
    monkeypatch.setenv("LOOKUPDEC_POLICY", "llama")
    monkeypatch.setenv("LOOKUPDEC_ADAPTIVE", "0")
    monkeypatch.setenv("LOOKUPDEC_TARGET_WASTE", "1.5")
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([["rename", [1, 2, 3]]]))
    with pytest.raises(Started):
        vs.worker(str(tmp_path), "hybrid", 4, 8, "float32", str(prompts), str(tmp_path / "out.json"))
    assert seen == {"LOOKUPDEC_POLICY": "hybrid", "LOOKUPDEC_ADAPTIVE": "1"}


def test_corpus_made_once_with_the_models_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The +corpus configs' corpus: the data's English text in the checkpoint's own ids.
    import lookupdec
    from tests.test_tokens import make_tokenizer

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    tok = make_tokenizer(model_dir / "tokenizer.json")
    data = tmp_path / "data"
    data.mkdir()
    text = "the cat sat on the mat . " * 40
    (data / "enwiki_wt.10M.txt").write_text(text, encoding="utf-8")
    monkeypatch.setenv("LOOKUPDEC_DATA", str(data))
    path = vs.build_corpus(model_dir)
    assert path == vs.corpus_file(model_dir) and path.is_file()
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(tok)).encode(text).ids
    drafter = lookupdec.Drafter(policy="hybrid", corpus=path, n_draft=4)
    assert drafter.policy_state.history.corpus.n_tokens == len(ids)
    cat_sat = ids[1:3]  # "the cat": the corpus goes on "sat on the"
    assert drafter.request([0, *cat_sat]).propose(3) == ids[3:6]
    mtime = path.stat().st_mtime_ns
    assert vs.build_corpus(model_dir) == path and path.stat().st_mtime_ns == mtime  # made once
    bare = tmp_path / "no-tokenizer"
    bare.mkdir()
    with pytest.raises(SystemExit, match=r"making the \+corpus configs' corpus .* failed"):
        vs.build_corpus(bare)
    assert not vs.corpus_file(bare).exists()  # nothing half-written left to be taken for a corpus
