"""A sharded index's manifest checked against its shard directories whenever it is read (as `serve ray-search` reads
it to deploy a shard each: an edited `shards.json` or a half-replaced index is an error naming the manifest, never
shards silently lost), and what a killed index build
leaves beside its target removed by the next build."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchgym.bench.reliability_sources import every_page_found
from searchgym.envs.source_files import SourceFileError
from searchgym.envs.tools.local_index import LocalIndex
from searchgym.envs.tools.shards import build_shards
from searchgym.serve.ray_search import RayServeLayout

SHARDS = 3
DOCS = [
    {"id": f"d{i}", "title": f"Page {word}", "url": f"https://example.org/{word}", "text": f"All about {word}."}
    for i, word in enumerate(["amber", "basalt", "cobalt", "dolomite", "ember", "feldspar", "garnet", "hematite"])
]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A corpus of eight pages built into three shards."""
    root = tmp_path_factory.mktemp("shards")
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return build_shards(root / "corpus.jsonl", root / "index", SHARDS)


def every_page_is_found(index_dir: Path) -> bool:
    """Whether every document is searchable and its page reachable in the shards `serve ray-search` would deploy."""
    return every_page_found(index_dir, DOCS)


def test_a_manifest_edited_to_fewer_shards_is_refused_naming_it(built, tmp_path):
    index = shutil.copytree(built, tmp_path / "index")
    assert every_page_is_found(index)
    manifest = json.loads((index / "shards.json").read_text())
    assert manifest["shards"] == SHARDS and len(manifest["shard_docs"]) == SHARDS
    (index / "shards.json").write_text(json.dumps({**manifest, "shards": 2}))
    with pytest.raises(SourceFileError, match=r"shards\.json says 2 shard\(s\) but .* holds shard directories \[0,"):
        RayServeLayout(str(index)).shard_indexes()
    (index / "shards.json").write_text("{ junk")
    with pytest.raises(SourceFileError, match=r"shards\.json:1: a shards manifest is not JSON"):
        RayServeLayout(str(index)).shard_indexes()


def test_a_rebuild_with_fewer_shards_leaves_no_old_shard_behind(built, tmp_path):
    index = shutil.copytree(built, tmp_path / "index")
    build_shards(built.parent / "corpus.jsonl", index, 2)
    assert sorted(p.name for p in index.glob("shard-*")) == ["shard-00", "shard-01"] and every_page_is_found(index)


MANIFEST_DAMAGES = st.one_of(
    st.binary(max_size=40).map(lambda b: ("bytes", b)),
    st.integers(-2, 6).map(lambda n: ("shards", n)),
    st.lists(st.integers(0, 9), max_size=4).map(lambda docs: ("shard_docs", docs)),
    st.integers(0, SHARDS - 1).map(lambda i: ("drop shard", i)),
    st.integers(0, SHARDS - 1).map(lambda i: ("drop index manifest", i)),
    st.sampled_from([None, [], "3", 3.0, True, {"shards": "3"}]).map(lambda v: ("value", v)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=MANIFEST_DAMAGES)
def test_any_damaged_sharded_index_is_an_error_naming_its_manifest_or_serves_every_page(built, damage):
    """Property: whatever is done to shards.json or the shard directories, reading the layout gives a SourceFileError
    naming the manifest, or an index from which every page is found; never a traceback, never shards silently lost."""
    with tempfile.TemporaryDirectory() as tmp:
        index = shutil.copytree(built, Path(tmp) / "index")
        manifest_path = index / "shards.json"
        manifest = json.loads(manifest_path.read_text())
        how, value = damage
        if how == "bytes":
            manifest_path.write_bytes(value)
        elif how in ("shards", "shard_docs"):
            manifest_path.write_text(json.dumps({**manifest, how: value}))
        elif how == "drop shard":
            shutil.rmtree(index / f"shard-{value:02d}")
        elif how == "drop index manifest":
            (index / f"shard-{value:02d}" / "index" / "index.json").unlink()
        else:
            manifest_path.write_text(json.dumps(value))
        try:
            found = every_page_is_found(index)
        except SourceFileError as e:
            assert str(e).startswith(str(manifest_path)), e
            return
        assert found, damage


def test_a_build_killed_mid_way_leaves_a_leftover_that_the_next_build_removes(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    out = tmp_path / "corpus.jsonl.index"
    killed = (
        "import os, signal, sys\n"
        "from searchgym.envs.tools.index_files import atomic_build\n"
        "with atomic_build(sys.argv[1]) as tmp:\n"
        "    (tmp / 'half-written').write_text('x')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run([sys.executable, "-c", killed, str(out)], env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert result.returncode == -signal.SIGKILL
    leftovers = list(tmp_path.glob(".corpus.jsonl.index.building-*"))
    assert len(leftovers) == 1 and (leftovers[0] / "half-written").is_file()
    running = tmp_path / f".corpus.jsonl.index.building-{os.getpid()}-live"  # a build still running is left alone
    running.mkdir()
    LocalIndex.build(corpus, out)
    assert not leftovers[0].exists() and running.is_dir() and (out / "index.json").is_file()
