"""BrowseComp-Plus from files in its repository's layout: queries, qrels and corpus load into a LocalQA env that
passes check_env, an agent that reads the evidence wins, and `searchgym eval` reports its evidence recalls."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import searchgym  # noqa: F401
from searchgym.agents.scripted import ScriptedWorkflow
from searchgym.envs.browsecomp_plus import load_queries, read_qrels
from searchgym.eval.evidence import evidence_metrics, evidence_stats
from tests.envs.browsecomp_layout import write_layout

BCP = "searchgym/BrowseCompPlus-v0"


def test_queries_take_evidence_from_the_qrels_else_from_their_rows(tmp_path):
    root = write_layout(tmp_path / "bcp")
    pool = load_queries(root)
    by_id = {t.id: t for t in pool}
    assert by_id["1"].metadata["evidence_docids"] == ["101", "102"]  # qrels win over the row's evidence_docs
    assert by_id["1"].metadata["gold_docids"] == ["102"]
    assert by_id["2"].metadata["evidence_docids"] == ["103"] and by_id["2"].answers == ("green",)
    assert read_qrels(root / "topics-qrels" / "qrel_evidence.txt") == {"1": ["101", "102"]}
    (root / "topics-qrels" / "qrel_evidence.txt").write_text("1 Q0 101\n")
    with pytest.raises(ValueError, match="qrel_evidence.txt:1"):
        load_queries(root)


@pytest.mark.parametrize("corpus_as", ["jsonl", "datasets"])
def test_the_env_passes_check_env_and_an_agent_reading_the_evidence_wins(tmp_path, corpus_as):
    if corpus_as == "datasets":
        pytest.importorskip("datasets")
    root = write_layout(tmp_path / "bcp", corpus_as=corpus_as)
    env = gym.make(BCP, root=root, max_turns=6)
    check_env(env.unwrapped)
    obs, info = env.reset(options={"task_id": "1"})
    assert "Orrin Vale" in obs
    obs, *_, info = env.step("<search>founder of the Orrin Vale Observatory</search>")
    hits = [h["doc_id"] for h in info["hits"]]
    assert "101" in hits and "bcplus://105" not in obs
    url_102 = next(h["url"] for h in info["hits"] if h["doc_id"] == "102") if "102" in hits else None
    if url_102 is None:
        obs, *_, info = env.step("<search>Mirela Kost born harbour town</search>")
        url_102 = next(h["url"] for h in info["hits"] if h["doc_id"] == "102")
    obs, *_, info = env.step(f"<access>{url_102}</access>")
    assert info["page"]["doc_id"] == "102" and "Teslin Bay" in obs
    obs, reward, terminated, truncated, info = env.step("<answer>Teslin Bay</answer>")
    assert terminated and reward == 1.0
    # the two documents served from one url are both reachable, the second by its docid
    urls = {
        json.loads(line)["url"] for line in next((root / ".searchgym").glob("corpus-*.jsonl")).read_text().splitlines()
    }
    assert {"https://example.org/teslin-bay", "https://example.org/teslin-bay#104", "bcplus://105"} <= urls
    env.close()


def test_a_missing_piece_says_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.delenv("SEARCHGYM_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="SEARCHGYM_DATA"):
        gym.make(BCP)
    with pytest.raises(FileNotFoundError, match="decrypt_dataset.py"):
        gym.make(BCP, root=tmp_path)
    root = write_layout(tmp_path / "bcp")
    (root / "corpus.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="browsecomp-plus-corpus"):
        gym.make(BCP, root=root)
    monkeypatch.setenv("SEARCHGYM_DATA", str(tmp_path))  # DATA/browsecomp-plus, as for the other suites
    write_layout(tmp_path / "browsecomp-plus")
    gym.make(BCP).close()


def test_evidence_recall_counts_retrieved_and_opened_documents():
    turns = [
        {"info": {"hits": [{"doc_id": "101"}, {"doc_id": "105"}]}},
        {"info": {"page": {"doc_id": "101", "url": "u"}}},
        {"info": {"hits": [{"doc_id": "102"}]}},
    ]
    stats = evidence_stats(turns, {"evidence_docids": ["101", "102", "103", "104"]})
    assert stats == {"evidence_recall_retrieved": 0.5, "evidence_recall_opened": 0.25}
    assert evidence_stats(turns, {}) == {}
    rows = [
        {"stats": stats},
        {"stats": {"evidence_recall_retrieved": 1.0, "evidence_recall_opened": 0.75}},
        {"stats": {}},
    ]  # a task without evidence does not count, as in BrowseComp-Plus's evaluation
    assert evidence_metrics(rows) == {"evidence_recall_retrieved": 0.75, "evidence_recall_opened": 0.5}


class ReadFirstHit(ScriptedWorkflow):
    """Searches the observatory, opens the first hit (document 101, the only one naming it), answers."""

    def __init__(self, settings=None):
        super().__init__(self.play, settings)

    @staticmethod
    def play(env, task):
        obs, info = yield "<search>Orrin Vale Observatory</search>"
        obs, info = yield f"<access>{info['hits'][0]['url']}</access>"
        yield "<answer>Mirela Kost</answer>"

    @classmethod
    def from_handle(cls, handle, settings):
        return cls(settings)


def test_eval_reports_evidence_recall_and_searches(tmp_path, tiny_model_dir):
    from searchgym.eval.harness import run_eval

    root = write_layout(tmp_path / "bcp")
    summary = run_eval(
        BCP,
        str(tiny_model_dir),
        tmp_path / "eval",
        env_kwargs={"root": str(root), "max_turns": 4},
        k=2,
        judge="f1",
        max_new_tokens=8,
        max_context=320,
        progress=False,
        workflow="tests.envs.test_browsecomp_plus:ReadFirstHit",
    )
    metrics = summary["metrics"]
    # evidence: query 1 {101, 102}, query 2 {103}, query 3 {101}; the agent retrieves and opens only 101
    assert metrics["evidence_recall_retrieved"] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert metrics["evidence_recall_opened"] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert metrics["searches"] == 1.0 and metrics["samples"] == 6.0
    assert metrics["avg@2/correct"] == pytest.approx(1 / 3)  # only query 3's answer is Mirela Kost
