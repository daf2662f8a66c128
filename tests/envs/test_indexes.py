"""open_index: one way to open (or build on first use) the index behind a path, in every form a user passes."""

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from searchgym.envs.tools.indexes import open_index
from searchgym.envs.tools.local_index import LocalIndex

ROWS = [
    {"id": "0", "contents": '"Tessar Works"\nTessar Works was founded in 1873 by Kelda Voss.'},
    {"id": "1", "contents": '"Kelda Voss"\nKelda Voss was born in Velmora.'},
]


def corpus_at(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_an_index_directory_and_a_bundle_directory_open_the_same_index(small_bundle):
    direct = open_index(small_bundle / "index")
    via_bundle = open_index(small_bundle)
    assert isinstance(via_bundle, LocalIndex) and via_bundle.index_dir == small_bundle / "index"
    assert via_bundle.search_sync("river", 5) == direct.search_sync("river", 5)


def test_a_corpus_file_is_indexed_beside_it_once(tmp_path):
    corpus = corpus_at(tmp_path / "wiki.jsonl")
    index = open_index(corpus)
    assert index.index_dir == tmp_path / "wiki.jsonl.index" and len(index) == 2
    assert index.search_sync("Tessar Works", 1)[0].doc_id == "0"
    built = (index.index_dir / "index.json").stat().st_mtime_ns
    os.utime(corpus)  # touched, not changed: the second open reuses the first index
    assert len(open_index(corpus)) == 2 and (index.index_dir / "index.json").stat().st_mtime_ns == built


def test_a_changed_corpus_is_indexed_again_on_the_next_open(tmp_path):
    """The index beside a corpus follows it (issue 44): a replaced corpus, even one of the same size, is rebuilt,
    and a stale dense index is never replaced by a BM25 one unasked."""
    corpus = corpus_at(tmp_path / "wiki.jsonl")
    assert open_index(corpus).search_sync("Velmora", 1)[0].doc_id == "1"
    rows = [{"id": "0", "contents": '"Tessar Works"\nTessar Works was founded in 1873 by Kelda Voss.'}]
    rows.append({"id": "1", "contents": '"Kelda Voss"\nKelda Voss was born in Ardmore.'})  # same size
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    index = open_index(corpus)
    assert index.search_sync("Ardmore", 1)[0].doc_id == "1" and not index.search_sync("Velmora", 1)
    corpus.write_text(corpus.read_text() + json.dumps({"id": "2", "contents": '"Quill"\nA new page.'}) + "\n")
    assert len(open_index(corpus)) == 3
    manifest = json.loads((tmp_path / "wiki.jsonl.index" / "index.json").read_text())
    (tmp_path / "wiki.jsonl.index" / "index.json").write_text(json.dumps({**manifest, "kind": "dense"}))
    corpus.write_text(corpus.read_text() + json.dumps({"id": "3", "contents": '"Reed"\nAnother.'}) + "\n")
    with pytest.raises(ValueError, match="dense index .* was built from another version"):
        open_index(corpus)


def test_a_world_directory_gets_its_index_built_inside_it(tmp_path):
    corpus_at(tmp_path / "world" / "corpus.jsonl")
    index = open_index(tmp_path / "world")
    assert index.index_dir == tmp_path / "world" / "index" and len(index) == 2


def test_what_is_not_an_index_says_what_to_give(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_index(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither an index directory"):
        open_index(tmp_path / "empty")


def test_a_kind_the_caller_ruled_out_is_refused(small_bundle):
    with pytest.raises(ValueError, match="holds a bm25 index, not a dense one"):
        open_index(small_bundle / "index", dense=True)
    assert isinstance(open_index(small_bundle / "index", dense=False), LocalIndex)


def _open_and_list(corpus: str, barrier) -> list[str]:
    barrier.wait()  # both workers look for the index at the same moment
    return sorted(os.listdir(open_index(corpus).index_dir))


def test_parallel_processes_build_a_missing_index_once(tmp_path):
    corpus = corpus_at(tmp_path / "wiki.jsonl")
    with multiprocessing.Manager() as manager, ProcessPoolExecutor(2) as pool:
        barrier = manager.Barrier(2)
        first, second = pool.map(_open_and_list, [str(corpus)] * 2, [barrier] * 2, timeout=60)
    assert first == second  # tantivy names segments at random: two builds would list different files
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no build left behind
