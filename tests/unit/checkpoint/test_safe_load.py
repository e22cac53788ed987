"""A checkpoint that pickles a callable is refused by every loader in tinytrain, before the
callable can run; tinytrain's own checkpoints load (the DeepSpeed ones in
tests/integration/test_deepspeed.py, single/fsdp_tp resumes in test_resume.py)."""

import os
from pathlib import Path

import pytest
import torch

from tinytrain.checkpoint.export import export_checkpoint
from tinytrain.checkpoint.format import read
from tinytrain.checkpoint.resume import read_state
from tinytrain.errors import ConfigError
from tinytrain.plan.start_points import checkpoint_metadata, resolve_resume
from tinytrain.plan.vocab import plan_vocab

VOCAB = plan_vocab(4096, 64, 1)


class RunsCode:
    """Unpickling this calls os.system: what a hostile checkpoint does."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def hostile(path: Path, marker: Path) -> Path:
    torch.save({"global_step": 4, "tinytrain": checkpoint_metadata(VOCAB, "f", "tiny"), "state_dict": {}, "extra": RunsCode(marker)}, path)
    return path


def refused(call, marker: Path, key: str) -> str:
    with pytest.raises(ConfigError) as e:
        call()
    assert not marker.exists(), "the pickled callable ran"
    problem = e.value.problems[0]
    assert problem.key == key and "refused: it pickles" in problem.message and "system" in problem.message
    assert "could run code" in problem.message and "saved by tinytrain" in problem.fix
    return problem.message


def test_init_from_refuses_a_pickled_callable(tmp_path):
    marker = tmp_path / "ran"
    path = hostile(tmp_path / "step0000004.ckpt", marker)
    refused(lambda: read(str(path)), marker, "checkpoint.init_from")


def test_resume_refuses_a_pickled_callable(tmp_path):
    marker = tmp_path / "ran"
    hostile(tmp_path / "step0000004.ckpt", marker)
    refused(lambda: resolve_resume(str(tmp_path / "step0000004.ckpt"), tmp_path, VOCAB, "f", "tiny"), marker, "resume")


def test_resume_refuses_a_deepspeed_folder_with_a_pickled_callable_in_any_shard(tmp_path):
    """DeepSpeed unpickles its shards with weights_only=False: the folder is checked first."""
    marker = tmp_path / "ran"
    folder = tmp_path / "step0000004.ckpt" / "checkpoint"
    folder.mkdir(parents=True)
    torch.save({"global_step": 4, "tinytrain": checkpoint_metadata(VOCAB, "f", "tiny")}, folder / "mp_rank_00_model_states.pt")
    hostile(folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt", marker)
    refused(lambda: read_state(tmp_path / "step0000004.ckpt"), marker, "resume")


@pytest.mark.parametrize("tag", ["../../elsewhere", "..", "/abs", "link"])
def test_a_deepspeed_folder_whose_latest_tag_leaves_it_is_refused(tmp_path, tag):
    """Lightning's converter and DeepSpeed join `latest`'s tag to the folder and unpickle what is
    there: a tag of ../.. loaded (and ran) files the per-file check had never read."""
    from tinytrain.checkpoint.formats import format_of

    marker = tmp_path / "ran"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    hostile(elsewhere / "mp_rank_00_model_states.pt", marker)
    folder = tmp_path / "run" / "checkpoints" / "step0000004.ckpt"
    (folder / "checkpoint").mkdir(parents=True)
    torch.save({"global_step": 4, "tinytrain": checkpoint_metadata(VOCAB, "f", "tiny")}, folder / "checkpoint" / "mp_rank_00_model_states.pt")
    (folder / "link").symlink_to(elsewhere)  # a sub-folder that is elsewhere
    (folder / "latest").write_text(tag)
    for reader in (read_state, lambda path: format_of(path).read_weights(path, "resume")):
        with pytest.raises(ConfigError, match="not a folder of this checkpoint: DeepSpeed would load its files from elsewhere"):
            reader(folder)
        assert not marker.exists()
    (folder / "latest").write_text("checkpoint")  # as Lightning writes it
    assert read_state(folder)["global_step"] == 4


def test_export_refuses_a_pickled_callable(tmp_path):
    marker = tmp_path / "ran"
    path = hostile(tmp_path / "final.ckpt", marker)
    refused(lambda: export_checkpoint(path, model_config=None, tokenizer=None, true_vocab=4096, out_dir=tmp_path / "hf_export"), marker, "checkpoint.path")
    assert not (tmp_path / "hf_export").exists()


@pytest.mark.parametrize(
    "content, needle",
    [
        ([1, 2, 3], "is not a checkpoint: it holds a list, not a dict"),
        (torch.zeros(3), "is not a checkpoint: it holds a Tensor, not a dict"),
    ],
)
def test_a_file_that_is_not_a_checkpoint_dict_is_named(tmp_path, content, needle):
    path = tmp_path / "x.ckpt"
    torch.save(content, path)
    with pytest.raises(ConfigError, match=needle):
        read(str(path))


def test_random_bytes_are_not_a_checkpoint(tmp_path):
    path = tmp_path / "x.ckpt"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(ConfigError, match="cannot read checkpoint"):
        read(str(path))


def test_a_deepspeed_folder_without_deepspeed_installed_is_named_with_the_extra(tmp_path, monkeypatch):
    """An install without the deepspeed extra met a ZeRO run's checkpoint with ModuleNotFoundError (exit 1)."""
    import importlib.util

    folder = tmp_path / "checkpoints" / "step0000004.ckpt" / "checkpoint"
    folder.mkdir(parents=True)
    torch.save({"global_step": 4}, folder / "mp_rank_00_model_states.pt")
    torch.save({"state_dict": {}}, tmp_path / "checkpoints" / "final.consolidated.ckpt")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else find_spec(name, *a))
    with pytest.raises(ConfigError) as e:
        read_state(tmp_path / "checkpoints" / "step0000004.ckpt")
    problem = e.value.problems[0]
    assert problem.key == "resume" and "is a DeepSpeed checkpoint folder, and DeepSpeed is not installed here" in problem.message
    assert "pip install 'tinytrain-llm[deepspeed]'" in problem.fix and "final.consolidated.ckpt" in problem.fix
    # resume=auto neither skips past it to an older checkpoint nor sets it aside as unreadable.
    from tinytrain.checkpoint.resume import newest_loadable

    torch.save({"global_step": 2, "tinytrain": checkpoint_metadata(VOCAB, "f", "tiny"), "state_dict": {}}, tmp_path / "checkpoints" / "step0000002.ckpt")
    with pytest.raises(ConfigError, match="DeepSpeed is not installed here"):
        newest_loadable(tmp_path / "checkpoints")


def dotted_global(module: str, name: str, argument: str) -> bytes:
    """A protocol-4 pickle calling module's `name` with one string: from protocol 4 on pickle
    follows a dotted name attribute by attribute (an allowed module's `os.system`)."""
    text = lambda t: b"\x8c" + bytes([len(t.encode())]) + t.encode()  # noqa: E731 - SHORT_BINUNICODE
    return b"\x80\x04" + text(module) + text(name) + b"\x93" + text(argument) + b"\x85R."


@pytest.mark.parametrize(
    "module, name",
    [
        ("torch.distributed.checkpoint.filesystem", "os.system"),  # through an allowed module's import
        ("torch.distributed.checkpoint.metadata", "dataclasses.sys.modules.os.system"),
        ("torch.distributed.checkpoint.filesystem", "os"),  # a module, not one of the index's classes
    ],
)
def test_a_dcp_index_naming_a_callable_through_an_allowed_module_is_refused(tmp_path, module, name):
    """fsdp_tp folders' `.metadata` is read before DCP unpickles it: an allowed module's dotted name
    ran os.system while merely planning with checkpoint.init_from."""
    from tinytrain.checkpoint.sharded import read_index

    marker = tmp_path / "ran"
    (tmp_path / ".metadata").write_bytes(dotted_global(module, name, f"touch {marker}"))
    with pytest.raises(ConfigError, match="not a DCP index tinytrain writes \\(unsupported GLOBAL"):
        read_index(tmp_path, "checkpoint.init_from")
    assert not marker.exists()


def test_a_real_dcp_index_reads(tmp_path):
    import warnings

    import torch.distributed.checkpoint as dcp

    from tinytrain.checkpoint.sharded import read_index

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no process group: DCP saves as one rank and says so
        dcp.save({"state_dict.w": torch.zeros(4, 3, dtype=torch.bfloat16), "step": torch.tensor(3), "names": ["a"]}, checkpoint_id=tmp_path)
    assert set(read_index(tmp_path, "resume").state_dict_metadata) == {"state_dict.w", "step", "names"}


def test_a_dcp_index_naming_a_shard_outside_the_folder_is_refused(tmp_path):
    import warnings

    import torch.distributed.checkpoint as dcp

    from tinytrain.checkpoint.sharded import INDEX_FILE, META_FILE, check_folder

    folder = tmp_path / "step0000004.ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no process group: DCP saves as one rank and says so
        dcp.save({"state_dict.w": torch.zeros(4, 3)}, checkpoint_id=folder)
    torch.save({"global_step": 4}, folder / META_FILE)
    assert check_folder(folder, "resume")["global_step"] == 4
    index = (folder / INDEX_FILE).read_bytes()
    (folder / INDEX_FILE).write_bytes(index.replace(b"__0_0.distcp", b"../x0.distcp"))  # same length: the pickle stays whole
    with pytest.raises(ConfigError, match="its index names the shard file '../x0.distcp', outside the folder"):
        check_folder(folder, "resume")
