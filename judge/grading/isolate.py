"""The sandbox one submission is judged in.

Every submission's judge (`judge.py chNN --notebook F --json`, which runs the learner's code in its
own pytest process) is started with:

* resource limits (`setrlimit` before exec, inherited by every process it starts): address space
  (memory), CPU seconds, the size of any file written, no core files; the number of processes
  through a pids cgroup of its own when one can be made (as root), else RLIMIT_NPROC (which Linux
  does not apply to root, hence the cgroup);
* a minimal environment (PATH, HOME, TMPDIR, PYTHONPATH, LANG): none of the teacher's variables;
* where `unshare` works (root, or unprivileged user namespaces): its own network namespace (no
  network, not even the teacher's loopback), PID namespace (it sees and can signal only its own
  processes; the grader kills the whole namespace at once), and mount namespace in which the
  judge's checkout is read-only, the submissions folders and the reports folder are covered by
  empty read-only mounts, and /tmp is a small private tmpfs holding the submission's only copy of
  its notebook (passed on stdin, so no path to it exists outside); capabilities are dropped before
  the judge starts, so the learner's code cannot undo those mounts.

What it does not do: files elsewhere stay readable as their permissions allow, and a kernel bug
is a way out. A container (the grader's Dockerfile) is the boundary for hostile code.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_NAME = "submission.ipynb"
SCRATCH = "/tmp/work"  # inside the mount namespace


@dataclass(frozen=True)
class Limits:
    """What one submission may use. The defaults fit a chapter of this workbook on a CPU."""

    memory_mb: int = 6144  # address space of each process (torch maps a lot it never touches)
    cpu_s: int = 600  # CPU seconds of each process
    wall_s: float = 600.0  # the whole judging of the submission
    file_mb: int = 64  # the largest file it may write
    processes: int = 128  # processes and threads together (torch starts a few threads each)
    scratch_mb: int = 256  # its private /tmp

    def __post_init__(self) -> None:
        for name in ("memory_mb", "cpu_s", "wall_s", "file_mb", "processes", "scratch_mb"):
            value = getattr(self, name)
            if not value > 0:
                option = "--" + name.replace("_", "-")  # the command line's name for it
                raise ValueError(f"{option} must be positive, got {value!r}")


@dataclass(frozen=True)
class Containment:
    """Which of the sandbox's layers this machine allows (found once by `probe`)."""

    namespaces: bool  # unshare: network, PID and mount namespaces
    user_namespace: bool  # the namespaces need a user namespace (not root)
    pids_cgroup: Optional[Path]  # where a pids cgroup per submission can be made
    notes: List[str] = field(default_factory=list)

    def describe(self) -> List[str]:
        lines = [
            "resource limits: memory, CPU time, file size (setrlimit)",
            "processes: "
            + (
                f"a pids cgroup per submission under {self.pids_cgroup}"
                if self.pids_cgroup
                else "RLIMIT_NPROC (counts all of this user's processes; not applied to root)"
            ),
            "environment: minimal (PATH, HOME, TMPDIR, PYTHONPATH, LANG)",
        ]
        if self.namespaces:
            lines.append(
                "namespaces: no network, own PIDs, read-only checkout, submissions and reports "
                "hidden, private /tmp" + (" (in a user namespace)" if self.user_namespace else "")
            )
        else:
            lines.append("namespaces: NOT available (unshare failed): network and files are open")
        return lines + self.notes


def _unshare_flags(user: bool) -> List[str]:
    flags = ["--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc"]
    return (["--user", "--map-root-user"] if user else []) + flags


def _pids_cgroup_root() -> Optional[Path]:
    """The pids controller's folder of this process's cgroup, if this process may make children
    there (cgroup v1's pids hierarchy, or v2 with the pids controller enabled)."""
    if os.geteuid() != 0:
        return None
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            root = Path("/sys/fs/cgroup/pids") / path.lstrip("/")
        elif controllers == "" and "pids" in _read("/sys/fs/cgroup/cgroup.controllers").split():
            root = Path("/sys/fs/cgroup") / path.lstrip("/")
        else:
            continue
        probe = root / f"minisgl-grade-probe-{os.getpid()}"
        try:
            probe.mkdir()
            (probe / "pids.max").write_text("8")
            probe.rmdir()
            return root
        except OSError:
            try:
                probe.rmdir()
            except OSError:
                pass
    return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def probe() -> Containment:
    notes = []
    unshare = shutil.which("unshare")
    setpriv = shutil.which("setpriv")
    namespaces = user = False
    if unshare and setpriv:
        for user in ([False] if os.geteuid() == 0 else []) + [True]:
            ok = subprocess.run(
                [unshare, *_unshare_flags(user), "true"], capture_output=True, timeout=30
            )
            if ok.returncode == 0:
                namespaces = True
                break
        if not namespaces:
            notes.append(
                "unshare exists but namespaces are refused here (a container may forbid them)"
            )
    else:
        notes.append("unshare/setpriv (util-linux) not found")
    return Containment(namespaces, namespaces and user, _pids_cgroup_root(), notes)


# Runs as the namespaces' first process: covers what the submission must not see, then starts
# the judge without capabilities. Arguments: repo, scratch size, hidden folders..., "--", command.
PRELUDE = r"""
set -eu
repo=$1; scratch_mb=$2; under_tmp=$3; shift 3
mount --bind "$repo" "$repo"
mount -o remount,bind,ro "$repo"
while [ "$1" != "--" ]; do
  mount -t tmpfs -o size=4k,mode=000,ro tmpfs "$1"
  shift
done
shift
# the checkout or the interpreter may live under /tmp (a CI clone): held open across the private
# /tmp below and bound back, read-only, at the same path
[ -z "$under_tmp" ] || exec 9<"$under_tmp"
mount -t tmpfs -o "size=${scratch_mb}m,mode=1777" tmpfs /tmp
if [ -n "$under_tmp" ]; then
  mkdir -p "$under_tmp"
  mount --no-canonicalize --rbind /proc/self/fd/9 "$under_tmp"  # with the mounts inside it
  mount -o remount,bind,ro "$under_tmp"
  exec 9<&-
fi
mkdir -m 0777 /tmp/work /tmp/home
cat > /tmp/work/submission.ipynb
cd /tmp/work
# Not exec'd: this shell stays the namespace's first process, its init, and the judge is its
# child. The kernel drops every signal sent to an init from inside its namespace, so a judge that
# were init would survive a submission's kill (of its test process's parent or grandparent) and
# judge on as if it had not happened; as init's child it dies of it, without a verdict.
status=0
setpriv --no-new-privs --inh-caps=-all --bounding-set=-all "$@" < /dev/null || status=$?
exit "$status"
"""


def _kept_under_tmp() -> str:
    """The folder under /tmp that the judge needs inside the sandbox, or "": the one holding both
    the checkout and the interpreter's environment (a clone with its venv inside, as CI makes), else
    the checkout. An interpreter under /tmp apart from the checkout is not supported."""
    tmp = Path("/tmp").resolve()
    repo, prefix = REPO.resolve(), Path(sys.prefix).resolve()
    if not repo.is_relative_to(tmp):
        return ""
    if prefix.is_relative_to(tmp) and not prefix.is_relative_to(repo):
        common = Path(os.path.commonpath([repo, prefix]))
        return str(common) if common != tmp else str(repo)
    return str(repo)


def environment(home: str, tmp: str) -> dict:
    """The judge's whole environment: nothing of the teacher's."""
    return {
        "PATH": os.pathsep.join(
            [str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]
        ),
        "HOME": home,
        "TMPDIR": tmp,
        "PYTHONPATH": str(REPO),
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
        "COLUMNS": "120",
        "OMP_NUM_THREADS": "1",  # several submissions share the cores
        "MKL_NUM_THREADS": "1",
    }


@dataclass
class Outcome:
    returncode: Optional[int]
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool
    wall_limit_s: float = 0.0
    at_process_limit: bool = False  # stopped when its cgroup refused a fork
    process_limit: int = 0


class Sandbox:
    """Starts one submission's judge under `limits`; `run` waits for it and cleans up."""

    def __init__(self, containment: Containment, limits: Limits, hidden: Sequence[Path]):
        self.containment = containment
        self.limits = limits
        self.hidden = [Path(p).resolve() for p in hidden]
        for path in self.hidden:
            if REPO == path or REPO.is_relative_to(path):
                raise ValueError(
                    f"{path} holds the judge's checkout ({REPO}); keep submissions and reports "
                    "in a folder of their own"
                )

    def command(self, chapter: str, notebook: str) -> List[str]:
        return [sys.executable, str(REPO / "judge.py"), chapter, "--notebook", notebook, "--json"]

    def run(self, chapter: str, notebook: bytes, workdir: Path, name: str) -> Outcome:
        """Judge `notebook` (its bytes) for `chapter`. `workdir` is the grader's own folder for
        this submission (its output files; in the fallback also the scratch folder)."""
        workdir.mkdir(parents=True, exist_ok=True)
        cgroup = self._make_cgroup(name)
        if self.containment.namespaces:
            scratch = SCRATCH
            argv = [
                shutil.which("unshare") or "unshare",
                *_unshare_flags(self.containment.user_namespace),
                "sh", "-c", PRELUDE, "prelude", str(REPO), str(self.limits.scratch_mb),
                _kept_under_tmp(),
                *[str(p) for p in self.hidden], "--",
                "env", "-i",
                *[f"{k}={v}" for k, v in environment("/tmp/home", "/tmp").items()],
                *self.command(chapter, f"{scratch}/{NOTEBOOK_NAME}"),
            ]  # fmt: skip
            env, cwd, stdin = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, workdir, notebook
        else:
            scratch_dir = workdir / "scratch"
            (scratch_dir / "home").mkdir(parents=True, exist_ok=True)
            (scratch_dir / NOTEBOOK_NAME).write_bytes(notebook)
            argv = self.command(chapter, str(scratch_dir / NOTEBOOK_NAME))
            env = environment(str(scratch_dir / "home"), str(scratch_dir))
            cwd, stdin = scratch_dir, b""
        out_path, err_path = workdir / "stdout", workdir / "stderr"
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=cwd, env=env,
                start_new_session=True, preexec_fn=self._preexec(cgroup), close_fds=True,
            )  # fmt: skip
            try:
                stopped = self._wait(proc, stdin, cgroup, start)
            finally:
                self._kill(proc, cgroup)
        timed_out = stopped == "wall"
        return Outcome(
            None if stopped else proc.returncode,
            _tail(out_path, 8 << 20),
            _tail(err_path, 64 << 10),
            time.monotonic() - start,
            timed_out,
            self.limits.wall_s,
            at_process_limit=stopped == "processes",
            process_limit=self.limits.processes,
        )

    def _wait(self, proc: subprocess.Popen, stdin: bytes, cgroup: Optional[Path], start: float):
        """None when the judge ended by itself; "wall" past the wall-time limit; "processes" once
        its cgroup refused a fork (a fork bomb: its processes would spin until the wall-time
        limit, on every core, so they are stopped at once)."""
        data: Optional[bytes] = stdin
        while True:
            left = self.limits.wall_s - (time.monotonic() - start)
            if left <= 0:
                return "wall"
            try:
                proc.communicate(data, timeout=min(left, 0.5))
                return None
            except subprocess.TimeoutExpired:
                data = None  # given once; communicate keeps feeding what is left of it
            if cgroup is not None and _refused_forks(cgroup):
                return "processes"

    def _make_cgroup(self, name: str) -> Optional[Path]:
        root = self.containment.pids_cgroup
        if root is None:
            return None
        path = root / f"minisgl-grade-{os.getpid()}-{name}"
        path.mkdir(exist_ok=True)
        (path / "pids.max").write_text(str(self.limits.processes))
        return path

    def _preexec(self, cgroup: Optional[Path]):
        limits = self.limits
        # RLIMIT_NPROC counts every process and thread of the user, so it allows what the
        # user runs already plus the submission's share (it binds no root process: the cgroup).
        nproc = _user_tasks() + limits.processes if cgroup is None else None
        procs_file = str(cgroup / "cgroup.procs") if cgroup else None

        def preexec() -> None:  # in the child, between fork and exec: no allocation-heavy work
            mb = 1 << 20
            resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb,) * 2)
            resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
            resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * mb,) * 2)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if procs_file:
                with open(procs_file, "w") as f:
                    f.write(str(os.getpid()))
            if nproc is not None:
                resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

        return preexec

    def _kill(self, proc: subprocess.Popen, cgroup: Optional[Path]) -> None:
        """Everything the submission started dies with it: its session, its PID namespace (the
        first process's death ends it) and every process left in its cgroup."""
        for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait()
        if cgroup is None:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids = _read(str(cgroup / "cgroup.procs")).split()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        try:
            cgroup.rmdir()
        except OSError:
            pass


def _refused_forks(cgroup: Path) -> int:
    """How many forks the cgroup's pids.max refused ("max N" in pids.events)."""
    for line in _read(str(cgroup / "pids.events")).splitlines():
        key, _, count = line.partition(" ")
        if key == "max":
            return int(count or 0)
    return 0


def _user_tasks() -> int:
    """How many processes and threads this user runs now (what RLIMIT_NPROC counts)."""
    uid, count = os.getuid(), 0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if proc.stat().st_uid == uid:
                    count += len(os.listdir(proc / "task"))
            except OSError:
                pass
    return count


def _tail(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - limit))
        return f.read().decode("utf-8", "replace")
