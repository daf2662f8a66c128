"""Hashes of files, read in blocks so a file of any size costs little memory."""

from __future__ import annotations

import hashlib
import os

BLOCK_BYTES = 1 << 20


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()
