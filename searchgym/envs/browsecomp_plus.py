"""BrowseComp-Plus: its queries over its fixed, curated corpus, as a LocalQA env with its evidence judgements.

BrowseComp-Plus (texttron/BrowseComp-Plus, arXiv 2508.06600) fixes ~100K documents and 830 BrowseComp queries
so that deep-research agents are compared on the same documents. The layout read here is the one its repository
documents (README.md, scripts_build_index/decrypt_dataset.py and scripts_evaluation/evaluate_run.py at commit
97c637c):

    ROOT/data/browsecomp_plus_decrypted.jsonl  one decrypted query per line: `query_id`, `query`, `answer`, and
                                               `evidence_docs` / `gold_docs` / `negative_docs` ([{docid, text}])
    ROOT/topics-qrels/qrel_evidence.txt        TREC qrels, `query_id Q0 docid relevance`: documents needed to answer
    ROOT/topics-qrels/qrel_golds.txt           (or qrel_gold.txt) evidence documents that also hold the answer
    corpus                                     Tevatron/browsecomp-plus-corpus rows (`docid`, `text`, optional
                                               `url`/`title`) as JSONL, or a `datasets` directory saved from it;
                                               `corpus=` or ROOT/corpus.jsonl or ROOT/corpus/

The corpus is converted once into searchgym's corpus form (id = docid; the page url is the document's own url,
made unique, or `bcplus://DOCID`) beside nothing of the user's: under ROOT/.searchgym/ unless `cache_dir` says
where, with its BM25 index built on first use. The conversion is keyed by the source's content (its path, size and
mtime: envs/source_files.py), so a replaced or edited corpus is converted again (and the older conversions of that
source, with their indexes, removed); a bad row (a duplicate docid, text that is not UTF-8) is an error naming the
user's file and line, and nothing is written for it. Each task keeps its evidence and gold docids in its metadata
(the qrels where they list the query, else the query row's `evidence_docs`/`gold_docs`), which `searchgym eval`
turns into BrowseComp-Plus's retrieval recall and into the recall among the pages the agent opened.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from searchgym.core.atomic_file import write_atomic
from searchgym.envs.source_files import SourceFileError, content_stamp, json_lines, path_stamp, text_lines
from searchgym.envs.tasks import Task, TaskPool

QUERIES = Path("data") / "browsecomp_plus_decrypted.jsonl"
EVIDENCE_QRELS = Path("topics-qrels") / "qrel_evidence.txt"
GOLD_QRELS = (Path("topics-qrels") / "qrel_golds.txt", Path("topics-qrels") / "qrel_gold.txt")
DOC_URL = "bcplus://{docid}"


def read_qrels(path: str | os.PathLike) -> dict[str, list[str]]:
    """TREC qrels (`query_id Q0 docid relevance` per line) as query id -> relevant docids, in file order."""
    out: dict[str, list[str]] = defaultdict(list)
    for lineno, line in text_lines(path):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 4:
            raise SourceFileError(
                f"{path}:{lineno}: a qrels line is 'query_id Q0 docid relevance', got {line.strip()[:200]!r}"
            )
        query_id, _, docid, relevance = parts
        if relevance != "0" and docid not in out[query_id]:
            out[query_id].append(docid)
    return dict(out)


def load_queries(root: str | os.PathLike, queries: str | os.PathLike | None = None) -> TaskPool:
    """The decrypted queries as a TaskPool: answer as the one accepted answer, evidence and gold docids in metadata."""
    root = Path(root)
    path = Path(queries) if queries is not None else root / QUERIES
    if not path.is_file():
        raise FileNotFoundError(
            f"BrowseComp-Plus: no queries at {path}. Run the repository's "
            "`python scripts_build_index/decrypt_dataset.py --output data/browsecomp_plus_decrypted.jsonl` in ROOT "
            "(or pass queries=FILE); searchgym reads the decrypted file and never downloads it."
        )
    evidence = read_qrels(root / EVIDENCE_QRELS) if (root / EVIDENCE_QRELS).is_file() else {}
    gold_file = next((root / p for p in GOLD_QRELS if (root / p).is_file()), None)
    gold = read_qrels(gold_file) if gold_file is not None else {}
    tasks: list[Task] = []
    lines: dict[str, int] = {}  # query_id -> its line
    for lineno, row in json_lines(path):
        try:
            query_id, question, answer = str(row["query_id"]), row["query"], row["answer"]
        except (KeyError, TypeError) as e:
            raise SourceFileError(f"{path}:{lineno}: a query row needs query_id, query and answer ({e})") from None
        if not isinstance(question, str) or not isinstance(answer, str) or not question.strip():
            raise SourceFileError(f"{path}:{lineno}: query and answer must be text")
        if query_id in lines:
            raise SourceFileError(
                f"{path}:{lineno}: query_id {query_id[:80]!r} appears twice (first on line "
                f"{lines[query_id]}); every query needs its own query_id"
            )
        lines[query_id] = lineno
        metadata = {
            "source": "browsecomp-plus",
            "evidence_docids": evidence.get(query_id) or _docids(row.get("evidence_docs")),
            "gold_docids": gold.get(query_id) or _docids(row.get("gold_docs")),
        }
        tasks.append(Task(query_id, question, (answer,), metadata))
    return TaskPool(tasks, name="browsecomp-plus")


def _docids(docs: Any) -> list[str]:
    return [str(d["docid"]) for d in docs or () if isinstance(d, dict) and "docid" in d]


def corpus_rows(corpus: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """The corpus's rows, each with where it is (`FILE:LINE`, or `DIR row N`), from a JSONL file or a `datasets`
    directory saved from Tevatron/browsecomp-plus-corpus."""
    path = Path(corpus)
    if path.is_dir():
        from searchgym.core.extras import needs

        with needs("a BrowseComp-Plus corpus saved with `datasets`"):
            from datasets import load_from_disk

        data = load_from_disk(str(path))
        if hasattr(data, "keys"):  # a DatasetDict: its one split (the corpus has only "train")
            data = data[next(iter(data.keys()))]
        for i, row in enumerate(data):
            yield f"{path} row {i}", row
        return
    for lineno, row in json_lines(path):
        yield f"{path}:{lineno}", row


def convert_corpus(corpus: str | os.PathLike, out: str | os.PathLike) -> Path:
    """searchgym's corpus JSONL at `out` from the BrowseComp-Plus corpus (written once, atomically); its path.

    Every row is checked here, so an error names the user's file and line (never the converted copy) and a corpus
    with a bad row leaves no conversion behind."""
    out = Path(out)
    if out.is_file():
        return out
    lines, urls = [], set()
    docids: dict[str, str] = {}  # docid -> where it first was
    for where, row in corpus_rows(corpus):
        docid = row.get("docid") if isinstance(row, dict) else None
        if isinstance(docid, int) and not isinstance(docid, bool):
            docid = str(docid)
        if not isinstance(docid, str) or not docid.strip() or not isinstance(row.get("text"), str):
            raise SourceFileError(
                f"{where}: a corpus row needs a docid (text or a whole number) and text, got {str(row)[:200]!r}"
            )
        if docid in docids:
            raise SourceFileError(
                f"{where}: docid {docid[:80]!r} appears twice (first at {docids[docid]}); every document needs its "
                "own docid"
            )
        docids[docid] = where
        text = row["text"]
        url = row.get("url") if isinstance(row.get("url"), str) and row.get("url") else DOC_URL.format(docid=docid)
        while url in urls:  # two documents from one address: the second is told apart by its docid
            url = f"{url}#{docid}"
        urls.add(url)
        title = row.get("title") if isinstance(row.get("title"), str) else _title(text, docid)
        lines.append(json.dumps({"id": docid, "title": title, "url": url, "text": text}, ensure_ascii=False))
    if not lines:
        raise ValueError(f"{corpus}: the corpus has no documents")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, "\n".join(lines) + "\n")
    return out


def _title(text: str, docid: str) -> str:
    """A title for a document without one: its first non-empty line (markdown and front matter marks dropped)."""
    for line in text.splitlines():
        line = line.strip().lstrip("#").strip()
        if line and line != "---" and not line.lower().startswith(("url:", "date:")):
            return line.removeprefix("title:").strip()[:120]
    return f"document {docid}"


def default_corpus(root: Path) -> Path:
    for candidate in (root / "corpus.jsonl", root / "corpus"):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(
        f"BrowseComp-Plus: no corpus. Save Tevatron/browsecomp-plus-corpus (its train split) at {root / 'corpus'} "
        f"with `datasets` (`load_dataset(...).save_to_disk(...)`) or as JSONL rows of docid, text[, url] at "
        f"{root / 'corpus.jsonl'}, or pass corpus=PATH; or give index=DIR / servers=URL for a built one."
    )


def make_browsecomp_plus(
    root: str | os.PathLike | None = None,
    *,
    data_root: str | os.PathLike | None = None,
    queries: str | os.PathLike | None = None,
    corpus: str | os.PathLike | None = None,
    index: str | os.PathLike | None = None,
    servers: str | list[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
    **env_kwargs: Any,
) -> Any:
    """`searchgym/BrowseCompPlus-v0`: the queries of ROOT (`root`, else DATA/browsecomp-plus with DATA the
    `data_root` kwarg or $SEARCHGYM_DATA, as for the other suites) over the corpus's BM25 index (converted and
    built on first use), an `index=` directory (BM25 or dense), or retrieval `servers=`."""
    from searchgym.envs.local_qa import make_local_qa

    if root is None:
        data = data_root if data_root is not None else os.environ.get("SEARCHGYM_DATA")
        if data is None:
            raise FileNotFoundError(
                "BrowseComp-Plus: pass root=DIR (a clone of texttron/BrowseComp-Plus with its "
                "decrypted queries), data_root=DIR or $SEARCHGYM_DATA (DIR/browsecomp-plus)"
            )
        root = Path(data) / "browsecomp-plus"
    root = Path(root)
    pool = load_queries(root, queries)
    if index is not None or servers is not None:
        return make_local_qa(pool, index=index, servers=servers, **env_kwargs)
    source = Path(corpus) if corpus is not None else default_corpus(root)
    target = Path(cache_dir) if cache_dir is not None else root / ".searchgym"
    return make_local_qa(pool, corpus=converted_corpus(source, target), **env_kwargs)


def converted_corpus(source: Path, cache_dir: Path) -> Path:
    """The conversion of `source` as it is now, in `cache_dir` (converted when the source is new or changed); the
    conversions of the source's earlier versions, and the indexes built from them, are removed."""
    prefix = f"corpus-{path_stamp(source)}"
    out = convert_corpus(source, cache_dir / f"{prefix}-{content_stamp(source)}.jsonl")
    for old in [*cache_dir.glob(f"{prefix}*"), *cache_dir.glob(f".{prefix}*")]:
        if out.name not in old.name:  # the current conversion and its index, lock, build, ... stay
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
    return out


# its **env_kwargs reach LocalQA's factory (envs/env_kwargs.py checks them by name)
make_browsecomp_plus.forwards_kwargs_to = ("searchgym.envs.local_qa:make_local_qa",)  # type: ignore[attr-defined]
