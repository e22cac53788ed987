"""`python -m tinytrain ...` for the tests without paying its imports each time: a process per test
worker imports torch, Lightning, transformers and tinytrain's training modules once (~5 s), then
forks a child for every command. The child is a real process (its own pid, exit status, signals,
working directory, environment and output files), started where a fresh interpreter would be after
those imports, so what a test checks about the command is what `python -m tinytrain` does.

The ranks Lightning starts beside a command (local ranks 1..N-1 of `cluster.devices=N`) are asked
for with `spare_ranks`: before the command runs anything, its child forks that many spares, each
waiting on a socket. Lightning's `subprocess.Popen(python -m tinytrain ..., env, cwd)` for a rank
hands its command, environment, folder and standard streams to a spare, which becomes that rank:
a child of rank 0 as Lightning's would be (its parent, process group and session; rank 0 polls,
signals and reaps it; a killpg of its session reaches it), only without paying the imports again.
A spare not asked for exits when rank 0 does. Its command line stays the zygote's: tests find a
rank by the pid in its watchdog heartbeat (test_kill_during_save.launched_ranks).

A command whose environment differs from the zygote's in a variable that a preloaded module reads at
import (HF_*, TORCH*, OMP_*, ...) gets a fresh interpreter instead, as does every command when
TINYTRAIN_TEST_FRESH_PROCESS=1 (to rule the zygote out of a failure).

Protocol on the zygote's stdin/stdout, one JSON line each: a request {id, module, args, cwd, env,
stdout, stderr, append, new_session, spare_ranks} is answered {id, pid} at the fork and {id, status} (the
child's returncode as subprocess gives it) when the child ends; several children may run at once."""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What a training command imports (transformers' accelerate integration imports DeepSpeed where it is
# installed, as it is for the tests), and the output modes.
PRELOAD = (
    "torch", "transformers", "transformers.integrations.accelerate", "transformers.models.llama.modeling_llama", "deepspeed", "lightning.pytorch",
    "tinytrain.cli", "tinytrain.train.fit", "tinytrain.train.trainer", "tinytrain.model.module", "tinytrain.outputs.modes",
)  # fmt: skip
# torch.compile's first call imports inductor (~0.65 s): DeepSpeed's Muon module decorates with it at
# import, which every ZeRO run triggers (its optimizer check imports the module).
PRELOAD_FOR_ZERO = ("torch._inductor.compile_fx",)
# Prefixes of the environment variables the preloaded modules read when imported: a command that sets
# one of these otherwise than the zygote had it gets a fresh interpreter.
READ_AT_IMPORT = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "KMP_", "CUDA_", "PL_", "LIGHTNING_", "TOKENIZERS_", "XDG_", "PYTHON", "LD_", "HOME", "DS_", "ACCELERATE_", "MALLOC_", "GLIBC_")
# Set by rank 0 before Lightning starts the other ranks, read later than import (Lightning's seeding,
# the flight recorder's buffer when a process group is made): a spare that imported before they
# were set starts as a fresh rank would.
SET_BEFORE_RANKS_START = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS", "TORCH_FR_BUFFER_SIZE")


def import_time_differences(env: dict, reference: dict, ignored=()) -> list[str]:
    """The variables read at import (but not `ignored`) that `env` sets otherwise than `reference`."""
    keys = {k for k in (*env, *reference) if k.startswith(READ_AT_IMPORT) and k not in ignored}
    return sorted(k for k in keys if env.get(k) != reference.get(k))


class PopenLike:
    """What the tests and Lightning use of subprocess.Popen's signalling; subclasses poll and wait."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None:
        raise NotImplementedError

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ZygoteProcess(PopenLike):
    """What the tests use of subprocess.Popen, for a child of the zygote."""

    def __init__(self, zygote: Zygote, request_id: int, args: list[str]) -> None:
        self.args = args
        self._done = threading.Event()
        self.pid: int = zygote._await(request_id, "pid")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _ended(self, status: int) -> None:
        self.returncode = status
        self._done.set()


class Zygote:
    """The test worker's side: started on first use, one per worker process."""

    def __init__(self, lean_children: bool = True) -> None:
        # lean_children: inductor preloaded and the preloaded heap frozen out of the collector's reach
        # (benchmarks/zygote_start.py measures a zygote without them beside one with them)
        self.lean_children = lean_children
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._env: dict = {}
        self._added_env: dict = {}
        self._next_id = 0
        self._replies: dict[tuple[int, str], int] = {}
        self._replied = threading.Condition(self._lock)
        self._children: dict[int, ZygoteProcess] = {}
        # The worker's environment as the session began: the zygote starts with it whichever test
        # first asks (one that patched a variable for its own command gets a fresh interpreter).
        self._session_env = dict(os.environ)
        # How many commands were forked, and which variables sent the others to a fresh interpreter
        # (printed at the end of the session: a leaked variable quietly costs seconds per command).
        self.forked = 0
        self.fresh = 0
        self.fresh_because: dict[str, int] = {}

    def serves(self, env: dict) -> bool:
        """Whether a command with this environment starts from the zygote as a fresh interpreter would."""
        if os.environ.get("TINYTRAIN_TEST_FRESH_PROCESS") == "1":
            return False
        differing = self.differs(env)
        for key in differing:
            self.fresh_because[key] = self.fresh_because.get(key, 0) + 1
        self.fresh += bool(differing)
        self.forked += not differing
        return not differing

    def differs(self, env: dict) -> list[str]:
        """The variables read at import that `env` sets otherwise than the zygote's start did, not
        counting those its own imports set (Lightning's PYTORCH_NVML_BASED_CUDA_CHECK, inductor's
        cache folder, ...): a worker that imported the same modules has them too. So the zygote is
        started first: before, what its imports add is unknown (and every command went fresh)."""
        with self._lock:
            self._start_unless_running()
        return import_time_differences(env, self._env, self._added_env)

    def close(self) -> None:
        """Stop the zygote (its children run on); a later command starts another."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()

    def popen(self, module: str, args: list[str], cwd: Path, env: dict, stdout: Path, stderr: Path | None = None, append: bool = False, new_session: bool = False, spare_ranks: int = 0) -> ZygoteProcess:
        """`python -m module args` in cwd; stdout (and stderr, or both into stdout) to files."""
        with self._lock:
            self._start_unless_running()
            self._next_id += 1
            request_id = self._next_id
            request = {"id": request_id, "module": module, "args": args, "cwd": str(cwd), "env": {**self._added_env, **env}, "stdout": str(stdout), "stderr": str(stderr or stdout), "append": append, "new_session": new_session, "spare_ranks": spare_ranks}
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
        child = ZygoteProcess(self, request_id, [sys.executable, "-m", module, *args])
        with self._lock:
            self._children[request_id] = child
            if (request_id, "status") in self._replies:
                child._ended(self._replies.pop((request_id, "status")))
        return child

    def run(self, module: str, args: list[str], cwd: Path, env: dict, timeout: float, spare_ranks: int = 0) -> subprocess.CompletedProcess:
        """subprocess.run(capture_output=True, text=True, timeout=timeout) of `python -m module args`."""
        out_dir = Path(tempfile.mkdtemp(prefix="zygote-"))
        out, err = out_dir / "stdout", out_dir / "stderr"
        child = self.popen(module, args, cwd, env, out, err, spare_ranks=spare_ranks)
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise subprocess.TimeoutExpired(child.args, timeout, output=out.read_text(errors="replace"), stderr=err.read_text(errors="replace")) from None
        result = subprocess.CompletedProcess(child.args, child.returncode, out.read_text(errors="replace"), err.read_text(errors="replace"))
        out.unlink()
        err.unlink()
        out_dir.rmdir()
        return result

    def _start_unless_running(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._env = dict(self._session_env)
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.zygote", *([] if self.lean_children else ["--plain"])], cwd=REPO, env=self._env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        ready = json.loads(self._proc.stdout.readline() or "{}")
        if "added_env" not in ready:
            raise RuntimeError(f"the test zygote did not start (exit {self._proc.wait()}); run with TINYTRAIN_TEST_FRESH_PROCESS=1 to do without it")
        self._added_env = ready["added_env"]
        threading.Thread(target=self._read_replies, args=(self._proc,), daemon=True).start()

    def _read_replies(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            reply = json.loads(line)
            with self._lock:
                if "status" in reply and reply["id"] in self._children:
                    self._children.pop(reply["id"])._ended(reply["status"])
                else:
                    self._replies[(reply["id"], "pid" if "pid" in reply else "status")] = reply.get("pid", reply.get("status"))
                self._replied.notify_all()

    def _await(self, request_id: int, what: str) -> int:
        with self._lock:
            while (request_id, what) not in self._replies:
                if not self._replied.wait(timeout=60):
                    raise RuntimeError("the test zygote did not answer within 60 s")
            return self._replies.pop((request_id, what))


def _child(request: dict) -> None:
    """In the forked child: become `python -m <module> <args>` in the request's folder and environment."""
    if request["new_session"]:
        os.setsid()
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if request["append"] else os.O_TRUNC)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(os.open(request["stdout"], flags, 0o644), 1)
    os.dup2(os.open(request["stderr"], flags, 0o644) if request["stderr"] != request["stdout"] else 1, 2)
    _settle(request["cwd"], request["env"])
    spares = []
    for _ in range(request.get("spare_ranks", 0)):
        spare = _fork_spare_rank()
        if spare is None:  # this process is the spare: a rank's request, or exit unused
            request = _become_rank()
            break
        spares.append(spare)
    else:
        if spares:
            _route_lightning_ranks(spares)
    # Rank 0 and every spare run their module from this one frame: CPython 3.11 allocates its frame
    # stack in 16 KiB chunks and frees one when the frame that opened it returns, so a call at a
    # chunk's edge mmaps and munmaps on every call. A spare started two frames deeper did so ~25 times
    # per forward pass and ran 7-10% slower than rank 0 in CPU time (the straggler tests compare it).
    _run_module(request["module"], request["args"])


def _settle(cwd: str, env: dict) -> None:
    """The interpreter's own streams on descriptors 0-2 (buffered as a fresh process's are with its
    output in a file), in the command's folder and environment."""
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1, errors="backslashreplace")  # noqa: SIM115
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)


def _run_module(module: str, args: list[str]) -> None:
    """`python -m module args` from here on, ending as the interpreter does."""
    import runpy

    sys.argv = [module, *args]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    # The interpreter's own exit: atexit handlers, buffered output, non-daemon threads, as `python -m`.
    sys.exit(code)


class SpareRank(PopenLike):
    """Rank 0's handle on a spare it handed a rank to: what Lightning uses of subprocess.Popen."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid, self.sock, self.args = pid, sock, []
        self.returncode: int | None = None
        self._lock = threading.Lock()  # Lightning's observer thread polls beside the main thread

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode


_SPARE_ENDS: list[socket.socket] = []  # this command's ends of its spares' sockets


_RANK_SOCKET: list[socket.socket] = []  # in a spare: its end of the socket its rank comes on


def _fork_spare_rank() -> SpareRank | None:
    """A child of this command, forked before it imports or starts anything more, waiting to become a
    rank: the command's handle on it, or None in the spare itself."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        for end in (*_SPARE_ENDS, ours):  # so a spare sees EOF once the command has ended
            end.close()
        _RANK_SOCKET.append(theirs)
        return None
    theirs.close()
    _SPARE_ENDS.append(ours)
    return SpareRank(pid, ours)


def _become_rank() -> dict:
    """In a spare: wait for a rank's request (module, args, env, cwd and its streams); exit if the
    command ends without sending one."""
    sock = _RANK_SOCKET.pop()
    message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
    sock.close()
    if not message:  # the command ended without starting this rank
        os._exit(0)
    request = json.loads(message)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    _settle(request["cwd"], request["env"])
    return request


def _route_lightning_ranks(spares: list[SpareRank]) -> None:
    """Lightning's launchers start each local rank with subprocess.Popen(command, env=, cwd=): give
    that command to a spare where it is `python -m` of a module and its environment reads at import
    what this command's did; anything else still gets a fresh process."""
    import types

    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from lightning.pytorch.strategies.launchers import subprocess_script as trainer_launcher

    started_with = dict(os.environ)

    def popen(command, env=None, cwd=None, **kwargs):
        env = dict(os.environ if env is None else env)
        same_imports = not import_time_differences(env, started_with, SET_BEFORE_RANKS_START)
        if kwargs or not spares or not same_imports or list(command[:2]) != [sys.executable, "-m"]:
            return subprocess.Popen(command, env=env, cwd=cwd, **kwargs)
        spare = spares.pop(0)
        spare.args = list(command)
        request = {"module": command[2], "args": list(command[3:]), "env": env, "cwd": cwd or os.getcwd()}
        sys.stdout.flush()
        sys.stderr.flush()
        socket.send_fds(spare.sock, [json.dumps(request).encode()], [0, 1, 2])
        return spare

    for launcher in (fabric_launcher, trainer_launcher):
        launcher.subprocess = types.SimpleNamespace(Popen=popen)


def _serve(lean_children: bool) -> None:
    # Replies go out on a copy of stdout; what the preloaded modules print (DeepSpeed's accelerator
    # notice) goes nowhere, as the zygote's stderr does.
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    before = dict(os.environ)
    # A fresh `python -m tinytrain` with its stderr not on a terminal sets this before transformers
    # is imported (tinytrain/cluster/library_notices.py); the preload comes first here.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import importlib

    for name in (*PRELOAD, *(PRELOAD_FOR_ZERO if lean_children else ())):
        importlib.import_module(name)
    if threading.active_count() != 1:  # a fork copies only this thread: the others' locks could hang a child
        raise SystemExit(f"a preloaded module started a thread: {threading.enumerate()}")
    if lean_children:
        # The preloaded heap (~600k objects) out of the collector's reach: a full collection in a
        # child (DeepSpeed calls gc.collect) took 0.3-0.4 s walking it, copying its pages; now ~1 ms.
        gc.freeze()
    print(json.dumps({"added_env": {k: v for k, v in os.environ.items() if before.get(k) != v}}), file=replies)
    children: dict[int, int] = {}  # pid -> request id
    stdin = sys.stdin.fileno()
    pending = b""
    while True:
        ready, _, _ = select.select([stdin], [], [], 0.05 if children else None)
        if ready:
            data = os.read(stdin, 1 << 16)
            if not data:  # the test worker is gone; its children's owners too
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                sys.stdout.flush()  # nothing buffered here may reach a child's output
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    replies.close()
                    _child(request)
                children[pid] = request["id"]
                print(json.dumps({"id": request["id"], "pid": pid}), file=replies)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            print(json.dumps({"id": children.pop(pid), "status": os.waitstatus_to_exitcode(status)}), file=replies)


if __name__ == "__main__":
    _serve(lean_children="--plain" not in sys.argv[1:])
