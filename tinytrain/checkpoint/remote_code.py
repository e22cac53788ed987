"""No code from a model folder unless asked: a Hugging Face folder whose config.json or
tokenizer_config.json maps an Auto class to its own .py files (`auto_map`) would make transformers
import them (or ask on a terminal whether to). tinytrain passes model.trust_remote_code (default
false) to every transformers load, and refuses such a folder in the plan, naming the key and the
folder, so no load ever reaches transformers' prompt."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tinytrain.errors import Problem

log = logging.getLogger(__name__)
CONFIG_FILES = ("config.json", "tokenizer_config.json")
_announced: set[str] = set()


def custom_code(folder: Path) -> list[str]:
    """`file: Auto class -> module.Class` for each auto_map entry of the folder's configs."""
    found = []
    for name in CONFIG_FILES:
        path = Path(folder) / name
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # absent or unreadable: the loader's own check names it
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        if isinstance(auto_map, dict):
            found += [f"{name}: {cls} -> {target}" for cls, target in auto_map.items()]
    return found


def remote_code_problems(key: str, folder, trust: bool) -> list[Problem]:
    """A folder named by `key` that needs its own code, refused unless model.trust_remote_code."""
    if trust or folder is None or not Path(folder).is_dir():
        return []
    found = custom_code(Path(folder))
    if not found:
        return []
    return [
        Problem(
            "model.trust_remote_code",
            False,
            f"{key}={folder} needs the folder's own Python code to load ({'; '.join(found[:3])}), and tinytrain runs no code from a model folder unless asked",
            f"use a model transformers ships (a Llama-family folder without auto_map), or read {folder}/*.py and set model.trust_remote_code=true",
        )
    ]


def tokenizer_code_problems(path: str) -> list[Problem]:
    """tinytrain's tokenizers are tokenizers-library or SentencePiece files; custom tokenizer
    classes are never imported (AutoTokenizer gets trust_remote_code=False)."""
    folder = Path(path)
    if not folder.is_dir():
        return []
    found = [f for f in custom_code(folder) if f.startswith("tokenizer_config.json: AutoTokenizer")]
    if not found:
        return []
    return [Problem("tokenizer.path", path, f"needs custom tokenizer code ({found[0]}), which tinytrain never runs", "use a folder with a tokenizer.json (tokenizers library) or a tokenizer.model (SentencePiece), or remove auto_map from its tokenizer_config.json")]


def code_files(folder: Path) -> tuple[list[str], list[str]]:
    """The .py files auto_map names (what transformers imports first), and every .py file of the
    folder (what those may import in turn)."""
    named = []
    for entry in custom_code(folder):
        targets = entry.split(" -> ", 1)[1].strip("[]").replace("'", "").split(", ")
        for target in targets:
            if target and target != "None":
                # "org/repo--module.Class": code from another hub repository, named as such.
                repo, _, module = target.rpartition("--")
                file = module.rsplit(".", 1)[0] + ".py"
                named.append(f"{repo}:{file}" if repo else file)
    return sorted(set(named)), sorted(p.name for p in Path(folder).glob("*.py"))


def announce(key: str, folder) -> None:
    """With model.trust_remote_code=true, one line before the first load that may run the folder's
    code: which files will run, so the run's log records what was trusted."""
    if folder is None or str(folder) in _announced or not Path(folder).is_dir():
        return
    named, present = code_files(Path(folder))
    if not named:
        return
    _announced.add(str(folder))
    log.warning("model.trust_remote_code=true: transformers will run the Python code of %s=%s: %s (from auto_map; the folder's .py files: %s)", key, folder, ", ".join(named), ", ".join(present) or "none")
