"""BrowseComp-Plus's files as a user edits and damages them: a replaced corpus is converted again on the next open,
a bad row is an error naming the user's file and line (never the converted copy), and a fixed file is not answered
with an old conversion."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import searchgym  # noqa: F401
from searchgym.envs.browsecomp_plus import converted_corpus, load_queries
from searchgym.envs.source_files import SourceFileError
from searchgym.envs.tools.corpus import read_corpus
from searchgym.testing.faults import LINE_DAMAGES, damage_lines
from tests.envs.browsecomp_layout import write_layout

BCP = "searchgym/BrowseCompPlus-v0"
NEW_DOC = {"docid": "106", "text": "Zephyrquartz\nZephyrquartz is a mineral found only near Teslin Bay.", "url": ""}


def search_ids(root: Path, query: str) -> list[str]:
    """The doc ids of one search on a fresh env over ROOT."""
    env = gym.make(BCP, root=root, max_turns=4)
    try:
        env.reset(options={"task_id": "1"})
        *_, info = env.step(f"<search>{query}</search>")
        return [hit["doc_id"] for hit in info["hits"]]
    finally:
        env.close()


def test_a_replaced_corpus_is_converted_again_and_its_old_conversion_removed(tmp_path):
    root = write_layout(tmp_path / "bcp")
    assert "106" not in search_ids(root, "Zephyrquartz mineral")
    rows = (root / "corpus.jsonl").read_text()
    (root / "corpus.jsonl").write_text(rows + json.dumps(NEW_DOC) + "\n")
    assert search_ids(root, "Zephyrquartz mineral")[0] == "106"  # the new document is found on the next open
    conversions = sorted(p.name for p in (root / ".searchgym").glob("corpus-*.jsonl"))
    assert len(conversions) == 1 and not list((root / ".searchgym").glob("corpus-*.index.building-*"))
    assert len(list((root / ".searchgym").glob("corpus-*.jsonl.index"))) == 1  # the old one's index went with it


def test_a_duplicate_docid_names_the_users_file_and_line_and_the_fixed_file_is_used(tmp_path):
    root = write_layout(tmp_path / "bcp")
    good = (root / "corpus.jsonl").read_text()
    first = good.splitlines()[0]
    (root / "corpus.jsonl").write_text(good + first + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{root / 'corpus.jsonl'}:6: docid '101' appears twice")) as e:
        gym.make(BCP, root=root)
    assert f"first at {root / 'corpus.jsonl'}:1" in str(e.value) and ".searchgym" not in str(e.value)
    assert not list((root / ".searchgym").glob("corpus-*.jsonl"))  # nothing bad is kept to be served later
    (root / "corpus.jsonl").write_text(good + json.dumps(NEW_DOC) + "\n")
    assert search_ids(root, "Zephyrquartz mineral")[0] == "106"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(["corpus", "queries", "qrels"]), how=st.sampled_from(LINE_DAMAGES), at=st.integers(0, 9))
def test_any_damaged_file_is_an_error_naming_it_or_a_conversion_of_what_it_holds_now(which, how, at):
    """Property: whatever the damage, loading gives a SourceFileError naming the user's file (and line, where a line
    is at fault) or a result equal to a fresh read of the file as it is now; never a traceback, never stale data."""
    with tempfile.TemporaryDirectory() as tmp:
        root = write_layout(Path(tmp) / "bcp")
        cache = Path(tmp) / "cache"
        source = {
            "corpus": root / "corpus.jsonl",
            "queries": root / "data" / "browsecomp_plus_decrypted.jsonl",
            "qrels": root / "topics-qrels" / "qrel_evidence.txt",
        }[which]
        before = [doc.id for doc in read_corpus(converted_corpus(root / "corpus.jsonl", cache))]
        source.write_bytes(damage_lines(source.read_bytes(), how, at))
        try:
            load_queries(root)
            docs = [doc.id for doc in read_corpus(converted_corpus(root / "corpus.jsonl", cache))]
        except SourceFileError as e:
            assert str(e).startswith(str(source)), e  # the user's file, never the converted copy
            if how != "utf-16":
                assert re.match(rf"{re.escape(str(source))}:\d+: ", str(e)), e
            assert [doc.id for doc in read_corpus(next(cache.glob("corpus-*.jsonl")))] == before  # nothing bad kept
            return
        fresh = [str(json.loads(line)["docid"]) for line in (root / "corpus.jsonl").read_text().splitlines()]
        assert docs == fresh  # the conversion is of the file as it is now
        assert len(list(cache.glob("corpus-*.jsonl"))) == 1
