"""perf batch-replay: requests drafted teacher-forced through R rows, and the file it reads."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from perf import batch_replay as br
from perf.peers import VllmNgram, teacher_force


def copying_requests(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Requests whose outputs copy spans of their prompts, with a changed token now and then."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        prompt = [rng.randrange(1, 50) for _ in range(80)]
        output = prompt[20:60] + [rng.randrange(1, 50) for _ in range(5)] + prompt[5:30]
        output[12] = 999
        pairs.append((prompt, output))
    return pairs


def test_vllm_rule_through_rows_is_the_one_request_loop() -> None:
    # vLLM's rule keeps nothing across requests: whatever the rows, its counts are those of
    # perf.peers' teacher-forced loop run on each request alone (the first output token given).
    pairs = copying_requests(5)
    expected = br.Counts()
    for prompt, output in pairs:
        expected.add(teacher_force(VllmNgram(2, 5, 6), prompt + output, len(prompt) + 1, 6, "vllm"))
        expected.decoded += len(output) - 1

    def counts(c: br.Counts) -> tuple[int, int, int, int]:
        return c.n_steps, c.n_drafted, c.n_accept, c.decoded  # not the time

    for rows in (1, 2, 5):
        assert counts(br.replay(pairs, lambda p: br.NgramRequest(p, 6), rows, 6)) == counts(expected)


def test_every_token_committed_once_per_request() -> None:
    from lookupdec import fast

    pairs = copying_requests(6, seed=1)
    for rows in (1, 3):
        made = br.drafters([0.1], fast, 8)["hybrid@0.1"]()
        c = br.replay(pairs, made, rows, 8)
        assert c.decoded == sum(len(o) - 1 for _, o in pairs)
        # each step commits its accepted draft and one token, but a request's last step may end
        # within its accepted draft (nothing after it)
        assert c.n_steps + c.n_accept - len(pairs) <= c.decoded <= c.n_steps + c.n_accept
        assert c.n_accept > 0


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "outputs.json"
    reqs = [{"name": f"r{i}", "prompt": p, "output": o} for i, (p, o) in enumerate(copying_requests(4))]
    path.write_text(json.dumps({"new_tokens": 70, "requests": reqs}))
    out = tmp_path / "rows.json"
    assert br.main([str(path), "--rows", "1,2", "--k", "4", "--thresholds", "0.2", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "4 requests, 280 output tokens, k = 4" in printed
    rows = json.loads(out.read_text())
    assert [(r["drafter"], r["rows"]) for r in rows] == [
        ("hybrid@0.2", 1), ("hybrid@0.2", 2), ("llama", 1), ("llama", 2), (br.VLLM_NGRAM, 1), (br.VLLM_NGRAM, 2)
    ]  # fmt: skip
    bad = tmp_path / "bad.json"
    bad.write_text('{"requests": [{"prompt": [1]}]}')
    with pytest.raises(SystemExit) as e:
        br.main([str(bad)])
    assert e.value.code == 2  # argparse's usage error, one line naming the file
    assert "bad.json: not a perf vllm-speedup --save-outputs file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        br.main([str(path), "--rows", "0"])
    assert "--rows and --k must be >= 1" in capsys.readouterr().err
