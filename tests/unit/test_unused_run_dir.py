"""A command that made its run directory and wrote nothing there removes it, and the parents Hydra
made with it (run.root on first use, a run.name's sub-folders), leaving no empty runs/ behind."""

from tinytrain.config.resolvers import _run_dir
from tinytrain.outputs.unused_run_dir import remove_if_unused


def test_the_parents_made_with_an_unused_run_directory_go_with_it(tmp_path):
    kept = tmp_path / "project"
    kept.mkdir()
    run_dir = type(kept)(_run_dir(str(kept / "runs"), "sweep/child"))
    run_dir.mkdir(parents=True)
    (run_dir / "tinytrain.log").write_text("refused\n")
    assert remove_if_unused(run_dir)
    assert list(kept.iterdir()) == []  # runs/ and runs/sweep were made for it


def test_a_parent_holding_another_run_stays(tmp_path):
    root = tmp_path / "runs"
    run_dir = type(root)(_run_dir(str(root), "sweep/child"))
    run_dir.mkdir(parents=True)
    (root / "other").mkdir()  # another run, made since
    assert remove_if_unused(run_dir)
    assert sorted(p.name for p in root.iterdir()) == ["other"]


def test_a_refused_command_removes_the_hydra_run_dir_it_was_given_and_made(tmp_path):
    """An explicit hydra.run.dir bypasses tt.run_dir: a refused command left it behind, holding its
    .hydra record and log only. One that existed before stays."""
    from tests.cli_in_process import run_in_process

    made = tmp_path / "made" / "run"
    code, err = run_in_process(["mode=plan", "trainer.lr=-1", f"hydra.run.dir={made}"])
    assert code == 2 and "trainer.lr" in err, err
    assert not (tmp_path / "made").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    code, _ = run_in_process(["mode=plan", "trainer.lr=-1", f"hydra.run.dir={existing}"])
    assert code == 2 and existing.is_dir()


def test_a_given_hydra_run_dir_is_kept_after_a_command_that_ran(tmp_path):
    """An output mode's log in the hydra.run.dir its command gave (Slurm's eval jobs give one per
    checkpoint) was removed with the directory once the mode wrote its outputs elsewhere."""
    from tinytrain.config.resolvers import remember_found

    given = tmp_path / "evals" / "step8"
    remember_found(str(given), given=True)
    given.mkdir(parents=True)
    (given / "tinytrain.log").write_text("eval step8: loss 6.9\n")
    assert not remove_if_unused(given) and (given / "tinytrain.log").exists()
    assert remove_if_unused(given, refused=True)  # a refused command made it: gone again


def test_the_log_handler_goes_with_the_removed_directory(tmp_path):
    """Left on the root logger, it reopened tinytrain.log in the removed folder for the next line
    logged in the process (FileNotFoundError in whatever logged next)."""
    import logging

    from tinytrain.config.resolvers import remember_found

    run_dir = tmp_path / "refused"
    remember_found(str(run_dir), given=True)
    run_dir.mkdir()
    handler = logging.FileHandler(run_dir / "tinytrain.log")
    logging.getLogger().addHandler(handler)
    try:
        assert remove_if_unused(run_dir, refused=True)
        assert handler not in logging.getLogger().handlers
        logging.getLogger("tinytrain.test").warning("after the removal")  # no error from a handler of the removed folder
    finally:
        logging.getLogger().removeHandler(handler)
