"""The documentation builds as a site with no broken link or anchor (`mkdocs build --strict`), the
README stays a short front page, and nothing in the README or docs/ links outside the repository."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from tests.docs.doc_commands import REPO, doc_files

LINK = re.compile(r"\]\(([^)\s]+)\)")


def build(config_dir, tmp_path):
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config_dir / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"}, timeout=300,
    )


def test_the_site_builds_strictly(tmp_path):
    result = build(REPO, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "architecture" / "index.html").exists()


def test_a_broken_anchor_fails_the_build(tmp_path):
    """The strict build is what catches a page that moved: shown on a copy with one bad anchor."""
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(REPO / "mkdocs.yml", copy)
    shutil.copytree(REPO / "docs", copy / "docs")
    page = copy / "docs" / "errors.md"
    page.write_text(page.read_text() + "\nSee [resuming](checkpoints.md#no-such-section).\n")
    result = build(copy, tmp_path)
    assert result.returncode != 0 and "no-such-section" in result.stderr


def test_the_readme_is_a_front_page():
    assert len((REPO / "README.md").read_text().splitlines()) <= 250


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_nothing_links_outside_the_repository(path):
    outside = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+://", target) or target.startswith("/"):
            outside.append(target)
            continue
        file = target.split("#")[0]
        if file and not (path.parent / file).resolve().is_relative_to(REPO):
            outside.append(target)
    assert not outside, f"{path.name} links outside the repository: {outside}"
    assert "../shared/DESIGN.md" not in path.read_text()


def test_every_page_is_in_the_site():
    nav = (REPO / "mkdocs.yml").read_text()
    missing = [p.name for p in (REPO / "docs").glob("*.md") if f": {p.name}" not in nav]
    assert not missing, f"docs pages not in mkdocs.yml's nav: {missing}"


def test_the_readme_s_plan_sample_is_what_the_default_run_plans(tmp_path):
    """The README shows `python -m tinytrain mode=plan`'s output for the default run: its planning
    lines (model to fast paths, less the machine's own: tokenizer path, host memory, checkpoint
    disk) are what the plan prints here."""
    from tests.conftest import plan
    from tinytrain.plan.run_plan import fit_lines

    printed = fit_lines(plan([], tmp_path))
    readme = (REPO / "README.md").read_text().splitlines()
    for prefix in ("memory ", "           activations:", "recompute ", "fp8 ", "fast paths "):
        line = next(x for x in printed if x.startswith(prefix))
        assert line in readme, f"README.md's plan sample lacks: {line}"


def test_the_step_peak_sample_is_what_the_plan_prints(tmp_path):
    """docs/performance.md's "Where a step peaks" shows the memory line of the command above it."""
    from tests.conftest import plan
    from tinytrain.plan.run_plan import fit_lines

    run = ["model=tinyllama_1b", "hardware.gpu=H100", "trainer.micro_batch_size=8", "data.seq_len=2048", "trainer.activation_checkpointing=none"]
    page = (REPO / "docs" / "performance.md").read_text()
    assert f"python -m tinytrain mode=plan {' '.join(run)}" in page
    line = next(x for x in fit_lines(plan(run, tmp_path)) if x.startswith("memory "))
    assert line in page.splitlines(), f"docs/performance.md's step peak sample lacks: {line}"


def test_the_recompute_sample_is_what_the_plan_prints(tmp_path):
    """docs/performance.md's recompute table: each mode's row for the command below it, step times
    included (FLOPs counted as MFU counts them, attention over whole rows)."""
    from tests.conftest import plan
    from tinytrain.plan.run_plan import fit_lines

    run = ["model=llama3_1_8b", "hardware.gpu=H100", "parallel=zero3", "cluster.devices=8", "trainer.micro_batch_size=4", "data.seq_len=8192", "trainer.activation_checkpointing=auto"]
    page = (REPO / "docs" / "performance.md").read_text()
    assert " ".join(run) in " ".join(page.split())
    printed = fit_lines(plan(run, tmp_path))
    start = next(i for i, x in enumerate(printed) if x.startswith("recompute "))
    rows = printed[start : start + 4]
    assert len(rows) == 4 and all("s/step" in row for row in rows[1:]), rows
    for row in rows:
        assert row in page.splitlines(), f"docs/performance.md's recompute sample lacks: {row}"


def test_the_context_sample_is_what_the_plan_prints(tmp_path):
    """docs/parallelism.md's long-context sample: the context lines of the command above it."""
    from tests.conftest import plan
    from tinytrain.plan.run_plan import render

    command = "python -m tinytrain mode=plan model=llama3_1_8b parallel=zero3 cluster.devices=8 hardware.gpu=H100 trainer.micro_batch_size=1 trainer.global_batch_size=8 data.seq_len=65536 trainer.activation_checkpointing=full parallel.cp=2"
    page = (REPO / "docs" / "parallelism.md").read_text()
    assert command in page
    printed = render(plan(command.split()[4:], tmp_path)).splitlines()
    start = next(i for i, x in enumerate(printed) if x.startswith("context "))
    for line in printed[start : start + 3]:
        assert line in page.splitlines(), f"docs/parallelism.md's context sample lacks: {line}"
