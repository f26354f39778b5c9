"""A Hugging Face cache folder in the Hub's layout, holding a tiny model as if it had been downloaded."""

import hashlib
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_to_cache(cache: Path, model_id: str, source: str) -> Path:
    """`source`'s files laid out as the Hub's cache holds a download of `model_id` at COMMIT: each file's
    content in blobs/, the snapshot's files linking to them, refs/main naming the commit. Returns the
    snapshot folder."""
    repo = Path(cache) / ("models--" + model_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for name in os.listdir(source):
        data = Path(source, name).read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot
