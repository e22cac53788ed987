"""Whether a DeepSpeed step folder holds every shard file its save wrote, from the names DeepSpeed
gives them: one optimizer partition per data-parallel rank (and, under ZeRO-3, one model-states
file per rank too). A folder copied in part would otherwise fail deep in DeepSpeed's loader or
converter ("Expected 2 of '*_optim_states.pt' ... but found 1 files"), after the run started.
"""

from __future__ import annotations

from pathlib import Path

from tinytrain.errors import ConfigError, Problem


def expected_shards(folder: Path, state: dict, state_file: Path) -> list[str] | None:
    """The shard file names the save wrote (None when the state does not say its world size)."""
    dp, mp = state.get("dp_world_size"), state.get("mp_world_size") or 1
    if not isinstance(dp, int) or dp < 1:
        return None
    files = folder / "checkpoint"
    # bf16 saves prefix the partitions; which prefix is on disk tells (the config where none is).
    bf16 = any(files.glob("bf16_zero_pp_rank_*_optim_states.pt")) or (not any(files.glob("*optim_states.pt")) and bf16_config(state))
    prefix = "bf16_" if bf16 else ""
    zero3 = state_file.name.startswith("zero_pp_rank_")
    names = []
    for m in range(mp):
        names += [f"{prefix}zero_pp_rank_{r}_mp_rank_{m:02d}_optim_states.pt" for r in range(dp)]
        names += [f"zero_pp_rank_{r}_mp_rank_{m:02d}_model_states.pt" for r in range(dp)] if zero3 else [f"mp_rank_{m:02d}_model_states.pt"]
    return names


def bf16_config(state: dict) -> bool:
    config = state.get("ds_config")
    section = config.get("bf16") if isinstance(config, dict) else None
    return bool(section.get("enabled")) if isinstance(section, dict) else False


def check_shards(folder: Path, state: dict, state_file: Path, key: str) -> None:
    """Raises ConfigError naming the first missing shard file."""
    names = expected_shards(folder, state, state_file)
    if names is None:
        return
    missing = [n for n in names if not (folder / "checkpoint" / n).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ConfigError(
            Problem(
                key,
                str(folder),
                f"is a DeepSpeed save over {state['dp_world_size']} data-parallel rank(s), and its shard checkpoint/{missing[0]} is missing{more}: {len(names) - len(missing)} of the {len(names)} files are there",
                f"copy the whole step folder again from where it was saved, or point {key} at another step checkpoint of that run",
            )
        )
