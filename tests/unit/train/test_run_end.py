"""The end of a run is one path (train/run_end.py) for a run that just trained and a saved one, and
fit takes its results from what build_trainer returns."""

import ast
from pathlib import Path

from tinytrain.train import run_end

PACKAGE = Path(run_end.__file__).resolve().parents[1]
# What only run_end.py calls: the export of a checkpoint (by its format) and the average.
ONE_PATH = {"export_checkpoint", "export_state_dict", "export_sharded", "average_checkpoints"}


def calls(path: Path) -> set[str]:
    return {n.func.id if isinstance(n.func, ast.Name) else n.func.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))}


def test_fit_and_the_output_modes_end_a_run_through_run_end():
    for rel in ("train/fit.py", "outputs/modes.py"):
        assert calls(PACKAGE / rel) & ONE_PATH == set(), rel
    assert {"export", "average"} <= calls(PACKAGE / "train/fit.py")


def test_fit_does_not_search_the_trainers_callbacks():
    source = (PACKAGE / "train/fit.py").read_text()
    assert "trainer.callbacks" not in source


def test_exports_are_named_after_their_checkpoint(tmp_path):
    assert run_end.export_dir_for(tmp_path / "checkpoints" / "final.ckpt", tmp_path) == tmp_path / "hf_export"
    assert run_end.export_dir_for(tmp_path / "checkpoints" / "average-k3-step0000008.ckpt", tmp_path) == tmp_path / "hf_export-average-k3-step0000008"
