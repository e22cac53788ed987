"""The embedded corpus: pydoc's topic texts, which ship with every CPython (no network)."""

from __future__ import annotations


def pydoc_documents() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[key] for key in sorted(topics)]
