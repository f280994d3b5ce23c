"""Local data files: which files of a path are data and which ``datasets`` builder reads them (no
heavy imports: the checks before launch use it)."""

from __future__ import annotations

from pathlib import Path

from torchtitan_lite.errors import InputError

LOCAL_FORMATS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
"""File extension -> ``datasets`` builder name."""


def local_data_files(path: str | Path) -> tuple[str, list[str]]:
    """``(builder, sorted files)`` of a data file or a folder of them (searched recursively, other
    files ignored), e.g. ``("json", ["/data/a.jsonl", "/data/b.jsonl"])``.

    Raises:
        InputError: nothing at ``path``, an unknown file extension, a folder with no data file, or
            with several formats.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"dataset_path not found: {path}; pass an existing file or folder")
    known = ", ".join(LOCAL_FORMATS)
    if p.is_file():
        if p.suffix not in LOCAL_FORMATS:
            raise InputError(
                f"dataset_path {path} has unknown extension '{p.suffix}'; use one of {known}"
            )
        return LOCAL_FORMATS[p.suffix], [str(p)]
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in LOCAL_FORMATS)
    if not files:
        raise InputError(
            f"dataset_path folder {path} holds no data file; expected files ending in {known}"
        )
    builders = sorted({LOCAL_FORMATS[f.suffix] for f in files})
    if len(builders) > 1:
        raise InputError(
            f"dataset_path folder {path} mixes formats ({', '.join(builders)}); keep one format "
            "per folder"
        )
    return builders[0], [str(f) for f in files]
