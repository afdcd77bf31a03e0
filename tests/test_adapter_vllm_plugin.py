"""The vLLM 0.34+ plugin's host side: options, registration, and the per-step request table.

``RequestTable`` is checked against a lookupdec Drafter driven request by request through its
own API (the drafts it gives for the same tokens), on the shipped text; no vLLM is needed.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

import lookupdec
from lookupdec.adapters import IsolatedDrafter, vllm_plugin
from lookupdec.adapters.vllm_plugin import RequestTable, drafter_from_options, pad_drafts, read_options
from lookupdec.errors import VocabularyError
from lookupdec.tokens import read_tokens

DATA = Path(lookupdec.__file__).resolve().parent / "data"  # the installed package's, as in a wheel test


def text() -> list[int]:
    ids: list[int] = read_tokens(DATA / "wiki.test.demo.llama3.bin").tolist()[:6000]
    return ids


class Engine:
    """A batch of requests as vLLM 0.34's runner holds them: slots of committed tokens.

    Each step every scheduled row commits the accepted part of its last draft and one token
    of the real text (teacher forcing), as ``post_update`` appends them to ``all_token_ids``.
    """

    def __init__(self, truth: dict[str, list[int]], prompts: dict[str, int]) -> None:
        self.truth = truth
        self.rows: dict[str, list[int]] = {rid: truth[rid][: prompts[rid]] for rid in truth}
        self.drafts: dict[str, list[int]] = {rid: [] for rid in truth}

    def commit(self, rid: str) -> int:
        row, truth, draft = self.rows[rid], self.truth[rid], self.drafts[rid]
        n = 0
        while n < len(draft) and len(row) + n < len(truth) and draft[n] == truth[len(row) + n]:
            n += 1
        new = truth[len(row) : len(row) + n + 1]
        row += new
        return len(new)


def test_table_drafts_what_the_drafter_drafts_per_request() -> None:
    # Two requests in one batch, teacher-forced on two parts of the text; the oracle drives a
    # second Drafter request by request: the same tokens give the same drafts.
    t = text()
    truth = {"a": t[:1500], "b": t[3000:4500]}
    engine = Engine(truth, {"a": 300, "b": 200})
    table = RequestTable(lookupdec.Drafter(n_draft=8), 8, 10_000)
    oracle = lookupdec.Drafter(n_draft=8)
    mine: dict[str, Any] = {}
    steps = 0
    sampled = {"a": 0, "b": 0}  # the first step: both still prefilling
    while min(len(r) for r in engine.rows.values()) < 1400:
        ids = ["a", "b"] if steps % 2 == 0 else ["b", "a"]  # vLLM may reorder the batch
        rows = [engine.rows[r] for r in ids]

        def read(i: int, s: int, e: int, rows: list[list[int]] = rows) -> list[int]:
            return rows[i][s:e]

        drafts = table.step(ids, [0, 1], [len(r) for r in rows], [sampled[r] for r in ids], read)
        for rid, d in zip(ids, drafts, strict=True):
            req = mine.get(rid)
            if req is None:
                req = mine[rid] = oracle.request(engine.rows[rid])
            else:
                req.extend(engine.rows[rid][len(req.tokens) :])
            want = req.propose(8) if sampled[rid] else []
            assert d == want, (steps, rid)
            engine.drafts[rid] = d
        for rid in ids:
            sampled[rid] = engine.commit(rid)
        steps += 1
    assert table.drafter.stats.n_accept == oracle.stats.n_accept > 100  # drafts were accepted
    table.finish(["b", "a", "unknown"])
    assert table.ended == 2 and not table.open
    for req in mine.values():
        req.end()
    assert table.drafter.dynamic.contents() == oracle.dynamic.contents()


def test_masked_rows_budget_and_model_length() -> None:
    t = text()
    table = RequestTable(lookupdec.Drafter(n_draft=8), 8, 1000)
    rows = [t[:500] + t[:200], t[:500] + t[:200]]

    def read(i: int, s: int, e: int) -> list[int]:
        return rows[i][s:e]

    # a masked row (negative slot) drafts nothing and opens nothing
    out = table.step(["x", "y"], [-1, 3], [700, 700], [1, 1], read)
    assert out[0] == [] and "x" not in table.open and len(out[1]) == 8
    # the step's budget (vLLM's num_speculative_tokens) caps the draft
    rows[1] = rows[1] + out[1][:1]
    assert len(table.step(["y"], [3], [701], [1], lambda i, s, e: rows[1][s:e], budget=3)[0]) == 3
    # no draft past max_model_len tokens in the request
    near = t[:498] + t[:500]  # 998 tokens: 2 left
    assert len(table.step(["z"], [5], [998], [1], lambda i, s, e: near[s:e])[0]) <= 2
    assert table.step(["w"], [6], [1000], [1], lambda i, s, e: (t[:500] * 2)[s:e]) == [[]]


def test_preempted_request_continues_and_a_replaced_one_restarts() -> None:
    t = text()
    drafter = lookupdec.Drafter(n_draft=8)
    table = RequestTable(drafter, 8, 10_000)
    row = t[:200] + t[:200]  # a repeated text: there is something to draft
    assert table.step(["r"], [0], [400], [0], lambda i, s, e: row[s:e]) == [[]]  # prefilling: no draft
    req = table.open["r"]
    assert len(table.step(["r"], [0], [400], [1], lambda i, s, e: row[s:e])[0]) == 8
    # preempted: absent from some steps, then resumed in another slot with its prompt and its
    # output so far as prefill (nothing is drafted while it prefills again)
    row += t[200:210]
    assert table.step(["r"], [7], [410], [0], lambda i, s, e: row[s:e]) == [[]]
    assert table.open["r"] is req and list(req.tokens) == row and table.ended == 0
    # a request whose tokens shrank was replaced (vLLM re-adds a streaming input): a new one
    short = t[1000:1100]
    table.step(["r"], [7], [100], [1], lambda i, s, e: short[s:e])
    assert table.open["r"] is not req and list(table.open["r"].tokens) == short and table.ended == 1
    table.end_all()
    assert not table.open and table.ended == 2


def test_options_that_are_not_a_mapping_are_refused() -> None:
    for bad in (["static"], "static=x"):  # an AttributeError and a bare dict() ValueError
        with pytest.raises(TypeError, match="speculator_options must be a mapping"):
            read_options(bad)  # type: ignore[arg-type]


def test_pad_drafts_fills_every_column() -> None:
    assert pad_drafts([[5, 6], [], [1, 2, 3, 4]], 4, [9, 8, 7]) == [[5, 6, 9, 9], [8, 8, 8, 8], [1, 2, 3, 4]]


def test_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("STATIC", "DYNAMIC", "POLICY", "CORPUS", "HISTORY_TOKENS", "TARGET_WASTE", "SAVE_INTERVAL"):
        monkeypatch.delenv(f"LOOKUPDEC_{var}", raising=False)
    kwargs, interval = read_options(None)
    none = {"static": None, "dynamic": None, "corpus": None, "history_tokens": None, "target_waste": None}
    assert kwargs == {**none, "policy": "llama"} and interval == 30.0
    dyn = str(tmp_path / "dyn.bin")
    monkeypatch.setenv("LOOKUPDEC_POLICY", "hybrid")
    monkeypatch.setenv("LOOKUPDEC_SAVE_INTERVAL", "5")
    kwargs, interval = read_options({"dynamic": dyn})
    assert kwargs == {**none, "dynamic": dyn, "policy": "hybrid"} and interval == 5.0
    monkeypatch.setenv("LOOKUPDEC_TARGET_WASTE", "0.5")
    assert read_options(None)[0]["target_waste"] == 0.5  # the environment, for a key not given
    assert read_options({"target_waste": 1})[0]["target_waste"] == 1.0
    drafter = drafter_from_options({"target_waste": 0.7}, 4)
    assert drafter.policy == "hybrid" and drafter.policy_state.target_waste10 == 7
    with pytest.raises(ValueError, match=r"speculator_options\['target_waste'\].*steers the hybrid policy"):
        read_options({"policy": "llama", "target_waste": 1.0})
    with pytest.raises(ValueError, match=r"speculator_options\['target_waste'\] must be a number"):
        read_options({"target_waste": "low"})
    monkeypatch.delenv("LOOKUPDEC_TARGET_WASTE")
    assert read_options({"save_interval": 0})[1] == 0.0
    drafter = drafter_from_options({"dynamic": dyn, "policy": "llama"}, 6)
    assert drafter.n_draft == 6 and drafter.policy == "llama" and drafter.dynamic_path == dyn
    with pytest.raises(ValueError, match=r"unknown key.*'statik'.*policy, corpus, history_tokens, target_waste"):
        read_options({"statik": "x"})
    with pytest.raises(ValueError, match=r"speculator_options\['save_interval'\]"):
        read_options({"save_interval": -1})
    with pytest.raises(ValueError, match=r"speculator_options\['static'\] must be a string"):
        read_options({"static": 3})
    monkeypatch.delenv("LOOKUPDEC_ISOLATE", raising=False)
    isolated = drafter_from_options({"isolate": True, "policy": "hybrid"}, 5)
    assert isinstance(isolated, IsolatedDrafter) and isolated.n_draft == 5 and isolated.policy == "hybrid"
    monkeypatch.setenv("LOOKUPDEC_ISOLATE", "1")
    assert isinstance(drafter_from_options(None, 5), IsolatedDrafter)  # the environment, for a key not given
    assert not isinstance(drafter_from_options({"isolate": False}, 5), IsolatedDrafter)
    with pytest.raises(ValueError, match=r"LOOKUPDEC_ISOLATE=1 isolates requests.*dyn\.bin"):
        drafter_from_options({"dynamic": dyn}, 5)
    with pytest.raises(ValueError, match=r"speculator_options\['isolate'\] isolates requests.*dyn\.bin"):
        drafter_from_options({"dynamic": dyn, "isolate": True}, 5)
    with pytest.raises(ValueError, match=r"speculator_options\['isolate'\] must be True or False, not 'yes'"):
        drafter_from_options({"isolate": "yes"}, 5)


def test_register_with_and_without_the_vllm_function(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    name = "vllm.v1.worker.gpu.spec_decode.speculator_config"
    fake = types.ModuleType(name)
    fake.register_speculative_method = lambda n, c: calls.append((n, c))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, name, fake)
    vllm_plugin.register()
    assert calls == [("lookupdec", "lookupdec.adapters.vllm_v2.LookupdecSpeculatorConfig")]
    # a vLLM without the function (0.33 and older): nothing happens, nothing fails
    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    vllm_plugin.register()
    assert len(calls) == 1


def test_entry_point_names_register() -> None:
    # what vLLM's plugin loader reads: the installed distribution's entry points
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "lookupdec"]
    assert len(found) == 1, "the installed lookupdec declares no vllm.general_plugins entry point"
    assert found[0].load() is vllm_plugin.register


def test_corpus_option(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("STATIC", "DYNAMIC", "POLICY", "CORPUS", "TARGET_WASTE", "ISOLATE"):
        monkeypatch.delenv(f"LOOKUPDEC_{var}", raising=False)
    path = tmp_path / "c.lkcorpus"
    lookupdec.fast.CorpusIndex.from_tokens([5, 6, 7, 8, 9], vocab_size=10).save(path)
    for options in (
        {"policy": "hybrid", "corpus": str(path)},
        {"policy": "hybrid", "corpus": str(path), "isolate": True},
    ):
        drafter = drafter_from_options(options, 4)
        assert drafter.request([1, 5, 6]).propose() == [7, 8, 9]  # drafted from the corpus
    monkeypatch.setenv("LOOKUPDEC_CORPUS", str(path))  # the environment, for a key not given
    assert drafter_from_options({"policy": "hybrid"}, 4).request([5, 6]).propose() == [7, 8, 9]
    with pytest.raises(
        ValueError,
        match=r"LOOKUPDEC_CORPUS=.*c\.lkcorpus: .*hybrid policy, not 'llama': set speculator_options\['policy'\]",
    ):
        read_options(None)
    monkeypatch.delenv("LOOKUPDEC_CORPUS")
    monkeypatch.setenv("LOOKUPDEC_POLICY", "llama")
    with pytest.raises(
        ValueError, match=r"speculator_options\['corpus'\]=.*not 'llama': set LOOKUPDEC_POLICY to hybrid"
    ):
        read_options({"corpus": str(path)})
    with pytest.raises(ValueError, match=r"speculator_options\['corpus'\] must be a string"):
        read_options({"corpus": [5, 6]})
    with pytest.raises(VocabularyError, match=r"c\.lkcorpus: the corpus file was built for a vocabulary of 10 ids"):
        drafter_from_options({"policy": "hybrid", "corpus": str(path)}, 4, vocab_size=8)
    assert drafter_from_options({"policy": "hybrid", "corpus": str(path)}, 4, vocab_size=10).vocab_size == 10
    with pytest.raises(FileNotFoundError, match=r"nowhere\.lkcorpus"):
        drafter_from_options({"policy": "hybrid", "corpus": str(tmp_path / "nowhere.lkcorpus")}, 4)


def test_history_tokens_option(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("POLICY", "CORPUS", "HISTORY_TOKENS", "TARGET_WASTE", "ISOLATE", "DYNAMIC"):
        monkeypatch.delenv(f"LOOKUPDEC_{var}", raising=False)
    drafter = drafter_from_options({"policy": "hybrid", "history_tokens": 2048}, 4)
    assert drafter.policy_state.history.max_tokens == 2048
    monkeypatch.setenv("LOOKUPDEC_HISTORY_TOKENS", "1024")  # the environment, for a key not given
    assert drafter_from_options({"policy": "hybrid"}, 4).policy_state.history.max_tokens == 1024
    assert drafter_from_options({"policy": "hybrid", "history_tokens": 512}, 4).policy_state.history.max_tokens == 512
    with pytest.raises(
        ValueError, match=r"speculator_options\['history_tokens'\] must be a number of tokens, not 1\.5"
    ):
        read_options({"policy": "hybrid", "history_tokens": 1.5})
    with pytest.raises(ValueError, match=r"speculator_options\['history_tokens'\]=4: history_tokens must be >= 16"):
        read_options({"policy": "hybrid", "history_tokens": 4})
    with pytest.raises(ValueError, match=r"LOOKUPDEC_HISTORY_TOKENS=1024: history_tokens bounds the hybrid policy's"):
        read_options({"policy": "llama"})
