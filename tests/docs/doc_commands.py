"""The `tinytrain` / `python -m tinytrain` commands the README and docs/ show, as a user would paste
them: read from fenced code blocks, continuation lines joined, the shell's comments dropped."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHELL_FENCES = ("bash", "sh", "shell", "console")
PREFIXES = (("python", "-m", "tinytrain"), ("tinytrain",))


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line, for the failure message
    line: str  # the command as the page shows it
    args: tuple[str, ...]  # what follows `tinytrain`
    comment: str  # the shell comment after it ("exits 2: ..." states the expected refusal)

    @property
    def expected_exit(self) -> int:
        m = re.match(r"exits (\d+)", self.comment.strip())
        return int(m.group(1)) if m else 0


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md")), REPO / "slurm" / "README.md", REPO / "launch" / "README.md"]


def doc_commands() -> list[DocCommand]:
    found = []
    for path in doc_files():
        rel = path.relative_to(REPO)
        in_fence, pending, start = False, "", 0
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                # Shell blocks hold commands; a plain block is output or a diagram.
                in_fence, pending = (not in_fence and line.strip()[3:] in SHELL_FENCES), ""
                continue
            if not in_fence:
                continue
            if pending:
                pending += " " + line.strip()
            else:
                pending, start = line.strip(), number
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip()
                continue
            command = parse(pending)
            if command is not None:
                args, comment = command
                found.append(DocCommand(f"{rel}:{start}", pending, args, comment))
            pending = ""
    return found


def parse(line: str) -> tuple[tuple[str, ...], str] | None:
    if not any(line.startswith(" ".join(prefix) + " ") or line == " ".join(prefix) for prefix in PREFIXES):
        return None
    words = shlex.split(line, comments=True)
    comment = line.split(" #", 1)[1].strip() if " #" in line else ""
    for prefix in PREFIXES:
        if tuple(words[: len(prefix)]) == prefix:
            return tuple(words[len(prefix) :]), comment
    return None


SETUP_COMMANDS = ("mkdir ", "cat > ", "cat >> ")


def setup_blocks() -> list[tuple[str, str]]:
    """(page, block) for shell blocks that only write files later commands of the page read
    (mkdir and `cat > file <<'EOF'` here-documents, e.g. docs/evaluation.md's local tasks)."""
    found = []
    for path in doc_files():
        for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", path.read_text(), re.S):
            commands, ending = [], None
            for line in block.splitlines():
                if ending is not None:
                    ending = None if line.strip() == ending else ending
                    continue
                if line.strip() and not line.lstrip().startswith("#"):
                    commands.append(line.strip())
                    heredoc = re.search(r"<<-?\s*'?(\w+)'?", line)
                    ending = heredoc.group(1) if heredoc else None
            if commands and all(c.startswith(SETUP_COMMANDS) for c in commands):
                found.append((str(path.relative_to(REPO)), block))
    return found
