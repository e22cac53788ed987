"""DeepSpeed's universal checkpoint: a ZeRO-1/2 or ZeRO-3 step folder saved on one number of
data-parallel ranks, converted so it loads on another (`deepspeed.checkpoint.ds_to_universal`).

The plan decides the conversion (plan/layout_change.py `converts`); the strategy runs it on rank 0
while the other ranks wait (train/strategy.py), then loads with DeepSpeed's `load_universal`.
The converted copy is a sibling folder, `step<N>.universal` beside `step<N>.ckpt`, written under a
temp name and renamed when complete: a conversion cut short leaves only a temp folder, which is
removed (and named in the log) before the next conversion, never loaded. `keep_last` pruning
removes the copy with its step folder (checkpoint/files.py).

No Lightning here; DeepSpeed is imported only when converting.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

from tinytrain.checkpoint.files import TEMP_MARK, publish_directory, temp_path, universal_path

log = logging.getLogger(__name__)

LATEST = "latest_universal"  # DeepSpeed's tag file in a universal folder (engine.load_checkpoint reads it)


def is_complete(folder: Path) -> bool:
    return (folder / LATEST).is_file()


def stale_temps(checkpoint: Path) -> list[Path]:
    """Temp folders of conversions that never finished (a killed rank 0)."""
    final = universal_path(checkpoint)
    return sorted(final.parent.glob(f"{final.name}{TEMP_MARK}*"))


def convert(checkpoint: Path) -> Path:
    """The universal copy of DeepSpeed step folder `checkpoint`, converted unless already there."""
    final = universal_path(checkpoint)
    for stale in stale_temps(checkpoint):
        log.warning("checkpoint  removing %s: a universal conversion that never finished (never loaded)", stale.name)
        shutil.rmtree(stale, ignore_errors=True)
    if is_complete(final):
        log.info("checkpoint  %s already converted to a universal checkpoint: %s", checkpoint.name, final.name)
        return final
    tag = (checkpoint / "latest").read_text().strip()  # Lightning saves under tag "checkpoint"
    tmp = temp_path(final)
    tmp.mkdir(parents=True)
    from deepspeed.checkpoint import ds_to_universal

    log.info("checkpoint  converting %s to DeepSpeed's universal checkpoint %s (another number of DeepSpeed partitions: data parallel x cp)", checkpoint.name, final.name)
    args = argparse.Namespace(
        input_folder=str(checkpoint / tag),
        output_folder=str(tmp / tag),  # DeepSpeed writes `latest_universal` (the tag) beside it
        num_extract_workers=1,  # in-process: no worker pool inside a training rank
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # Lightning's saves carry no universal_checkpoint_info; DeepSpeed's default is complete for ZeRO without tp/pp
    )
    try:
        ds_to_universal.main(args)
        shutil.copy2(checkpoint / "latest", tmp / "latest")  # what Lightning checks a DeepSpeed folder by
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # (a kill leaves it: the next conversion removes it)
        raise
    publish_directory(tmp, final)
    return final


def group_settings(optimizer) -> list[dict]:
    """Each param group's settings (all but its params), taken before a universal load."""
    return [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]


def repair_stage3_load(optimizer, before: list[dict]) -> None:
    """Undo two slips of DeepSpeed 0.19's ZeRO-3 universal load
    (`load_hp_checkpoint_state_from_checkpoint_dir_stage3`) on its base `optimizer`:
    - it gives every sub-group one shared `step` tensor, which AdamW increments in place once per
      group per step: Adam's bias correction ran at step 2k after k steps of a resumed run;
    - it gives every param group the first group's settings: the no-decay group (norms, biases)
      took the decay group's weight_decay.
    `before`: group_settings() of the same optimizer before the load (the run's own groups). The
    steps are untied; what differed between the groups is put back (lr in proportion to the
    loaded one, which is the schedule's at the checkpoint)."""
    seen: set[int] = set()
    for state in optimizer.state.values():
        step = state.get("step")
        if step is None or not hasattr(step, "clone"):
            continue
        if id(step) in seen:
            state["step"] = step.clone()
        seen.add(id(step))
    first = before[0]
    for group, own in zip(optimizer.param_groups, before):
        for key, value in own.items():
            if all(g.get(key) == first.get(key) for g in before):
                continue  # one setting for every group: the checkpoint's, as loaded
            if key == "lr" and first["lr"]:
                group["lr"] = group["lr"] * value / first["lr"]
            else:
                group[key] = value
