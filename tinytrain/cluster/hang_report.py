"""hang_report.txt: which rank did not arrive, and what every rank was doing.

Assembled by one watchdog from what every rank's watchdog left in the attempt's folder: the
heartbeats (step, phase), each rank's process state (state-rank<N>.json: running, stopped by
SIGSTOP, gone), its Python stack (stack-rank<N>.txt, written by faulthandler inside the rank) and
its flight-recorder summary (fr-rank<N>.txt: PyTorch's record of the rank's collectives, dumped by
a thread inside the rank; gloo and NCCL both record in torch >= 2.7).

A rank "did not arrive" when it is frozen or gone, when it is steps behind the others, or when it
has entered fewer collectives than the others (the flight recorder's sequence numbers). Where a
rank is frozen or gone, the live ones behind are listed apart, as likely waiting on it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

# /proc/<pid>/stat's state letters, said for a reader of the report.
STATES = {"R": "running", "S": "sleeping (waiting: a collective, I/O or a lock)", "D": "in uninterruptible I/O", "T": "stopped (SIGSTOP or a debugger): it cannot run code", "t": "stopped by a debugger", "Z": "exited (zombie)"}
FROZEN = ("T", "t", "Z", "gone")


def process_state(pid: int) -> dict:
    """State letter and CPU seconds of a process on this host, from /proc (Linux); "gone" when it does not exist."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return {"state": "gone", "cpu_s": None, "ppid": None}
    ticks = 100  # os.sysconf("SC_CLK_TCK") on every Linux in practice
    return {"state": fields[0], "cpu_s": (int(fields[11]) + int(fields[12])) / ticks, "ppid": int(fields[1])}


def last_collective(fr: dict) -> dict | None:
    """The newest entry of a flight-recorder dump (pickle.loads of torch's _dump_fr_trace)."""
    entries = fr.get("entries") or []
    return max(entries, key=lambda e: e.get("collective_seq_id", 0)) if entries else None


def describe_collective(entry: dict | None) -> str:
    if entry is None:
        return "none recorded yet"
    done = "completed" if entry.get("state") == "completed" else entry.get("state", "?")
    return f"#{entry.get('collective_seq_id')} {entry.get('profiling_name')} (process group {entry.get('process_group', ('?',))[0]}, sizes {entry.get('input_sizes')}, {done})"


def summarize_fr(fr: dict, backend_note: str = "") -> dict:
    """What the report needs of one rank's dump: the newest collective and its sequence number."""
    entry = last_collective(fr)
    return {"seq": entry.get("collective_seq_id") if entry else 0, "last": describe_collective(entry), "entries": len(fr.get("entries") or []), "note": backend_note}


def did_not_arrive(beats: dict[int, dict], states: dict[int, dict], fr: dict[int, dict], world: int) -> dict[int, str]:
    """rank -> why it is named. Empty when every rank looks alike (the stacks then tell)."""
    named = {}
    for rank in range(world):
        if rank not in beats:
            named[rank] = "never wrote a heartbeat (it did not start, or died before its first)"
    for rank, state in states.items():
        if state.get("state") in FROZEN:
            named.setdefault(rank, STATES.get(state["state"], "its process is gone"))
    live = {r: b for r, b in beats.items() if b["phase"] != "done"}
    if live:
        ahead = max(b["step"] for b in live.values())
        for rank, b in live.items():
            if b["step"] < ahead:
                named.setdefault(rank, f"at step {b['step']}, behind the others' {ahead}")
    seqs = {r: f["seq"] for r, f in fr.items() if f.get("entries")}
    if len(seqs) > 1 and min(seqs.values()) < max(seqs.values()):
        top = max(seqs.values())
        for rank, seq in seqs.items():
            if seq < top:
                named.setdefault(rank, f"entered collective #{seq}, the others #{top}")
    return dict(sorted(named.items()))


def causes_first(named: dict[int, str], states: dict[int, dict], beats: dict[int, dict]) -> tuple[dict[int, str], dict[int, str]]:
    """(causes, waiting): ranks frozen, gone or never started are the causes; where there is one, a
    live rank merely behind in steps or collectives is most likely waiting on it (with 4 gloo ranks
    and one frozen, rank 0 sat in an earlier collective than ranks 1 and 3), so it is said apart."""
    causes = {r: why for r, why in named.items() if r not in beats or states.get(r, {}).get("state") in FROZEN}
    if not causes:
        return named, {}
    return causes, {r: why for r, why in named.items() if r not in causes}


def render(*, where: Path, world: int, stalled_s: float, limit_s: int, limit_phase: str, beats: dict[int, dict]) -> str:
    states = read_json(where, "state")
    fr = read_json(where, "fr")
    named, waiting = causes_first(did_not_arrive(beats, states, fr, world), states, beats)
    live = [b for b in beats.values() if b["phase"] != "done"]
    step = max((b["step"] for b in live), default=0)
    lines = [
        f"tinytrain hang report, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"no rank made progress for {stalled_s:.0f} s (limit {limit_s} s, phase {limit_phase}); step {step}",
        "did not arrive: " + ("; ".join(f"rank {r} ({why})" for r, why in named.items()) if named else "not decided: every rank is at the same step and collective; compare the stacks below"),
        *(["behind, likely waiting on it: " + "; ".join(f"rank {r} ({why})" for r, why in waiting.items())] if waiting else []),
        "",
        "rank  host  pid  step  phase  process  collectives (flight recorder)",
    ]
    for rank in range(world):
        b, s, f = beats.get(rank), states.get(rank, {}), fr.get(rank)
        if b is None:
            lines.append(f"{rank}  -  -  -  -  never started")
            continue
        cpu = f", {s['cpu_s']:.0f} s CPU" if s.get("cpu_s") is not None else ""
        collective = f"last {f['last']}" if f and f.get("entries") else (f["note"] if f else "not dumped (the rank could not run code)")
        lines.append(f"{rank}  {b['host']}  {b['pid']}  {b['step']}  {b['phase']}  {s.get('state', '?')}{cpu}  {collective}")
    for rank in range(world):
        lines += ["", f"--- rank {rank}: Python stack (faulthandler) ---"]
        stack = where / f"stack-rank{rank}.txt"
        text = stack.read_text(errors="replace").strip() if stack.exists() else ""
        lines.append(text or ("none: " + (STATES.get(states.get(rank, {}).get("state", ""), "") or "the rank did not answer") + " (its heartbeat is in the table above)"))
    # As tinytrain.errors.again_in words it (this module stays free of the package's imports).
    run_dir = where.parent.parent  # <run dir>/watchdog/<attempt>
    lines += ["", f"Exit 76: the run stopped on this hang; run the same command again with hydra.run.dir={run_dir} (or its run.name): resume=auto continues from the newest checkpoint."]
    return "\n".join(lines) + "\n"


def read_json(where: Path, prefix: str) -> dict[int, dict]:
    found = {}
    for path in where.glob(f"{prefix}-rank*.json"):
        try:
            found[int(path.stem.removeprefix(f"{prefix}-rank"))] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def write(path: Path, text: str) -> None:
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text)
    temp.replace(path)

