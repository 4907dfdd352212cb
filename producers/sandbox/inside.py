"""The program that runs INSIDE a local sandbox: PID 1 of its bubblewrap namespace for the
sandbox's whole life (or, unisolated, a plain child process on the host).

It owns everything done inside the boundary: running commands (their rlimits, the wall-clock
timeout, and killing every other process after each command so `setsid`, double forks and `nohup`
leave nothing behind), the file tools with their path checks (a path's realpath must stay under the
workspace, so a symlink planted by the agent is followed here, inside, never on the host), search,
the workspace's tar in and out, and the wipe of the workspace and /tmp.

Wire format on stdin/stdout: frames of a 4-byte big-endian length and that many bytes. A request is
a JSON header frame, its body frames, an empty frame; a response is its body frames, an empty frame,
then a JSON header frame (`{"error": ..., "refused": bool}` when it failed).

It must stay standard-library only and never import the project: `local` runs it as
`python3 -I -S -c <this file's source>` with the system python inside the namespace. The host
imports it too, for the frame helpers.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import selectors
import shutil
import signal
import stat
import struct
import sys
import tarfile
import time

FRAME = struct.Struct(">I")
CHUNK = 1 << 20  # the largest body frame either side writes
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
PRLIMIT = "/usr/bin/prlimit"
LIMITS = {
    "cpu": "RLIMIT_CPU", "as": "RLIMIT_AS", "fsize": "RLIMIT_FSIZE",
    "nproc": "RLIMIT_NPROC", "core": "RLIMIT_CORE",
}  # fmt: skip


class Refused(Exception):
    """A request the sandbox refuses (a path outside the workspace, a bad pattern)."""


class Failed(Exception):
    """A request that could not be done (a missing file); the agent sees the message."""


def write_frame(fd: int, data: bytes) -> None:
    """One frame: the length, then the bytes (a short write is retried)."""
    view = memoryview(FRAME.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


class Body:
    """A body being written: `write` cuts it into frames; `finish` writes the empty end frame."""

    def __init__(self, fd: int):
        self.fd, self.pending = fd, bytearray()

    def write(self, data: bytes) -> int:
        self.pending += data
        while len(self.pending) >= CHUNK:
            write_frame(self.fd, bytes(self.pending[:CHUNK]))
            del self.pending[:CHUNK]
        return len(data)

    def finish(self) -> None:
        if self.pending:
            write_frame(self.fd, bytes(self.pending))
        self.pending = bytearray()
        write_frame(self.fd, b"")


class Incoming:
    """Blocking reads of the host's frames: a header, then a body as a file (`read(n)`)."""

    def __init__(self, fd: int):
        self.fd, self.left, self.pos, self.ended = fd, b"", 0, True

    def exact(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            piece = os.read(self.fd, n - len(data))
            if not piece:
                return None
            data += piece
        return data

    def frame(self) -> bytes | None:
        head = self.exact(FRAME.size)
        return None if head is None else self.exact(FRAME.unpack(head)[0])

    def start_body(self) -> None:
        self.left, self.pos, self.ended = b"", 0, False

    def read(self, n: int = -1) -> bytes:
        while not self.ended and (n < 0 or len(self.left) - self.pos < n):
            piece = self.frame()
            if piece is None:
                raise EOFError("the host closed the channel mid-body")
            self.ended = not piece
            self.left, self.pos = self.left[self.pos :] + piece, 0  # copies once per frame, not per read
        end = len(self.left) if n < 0 else min(len(self.left), self.pos + n)
        data, self.pos = self.left[self.pos : end], end
        return data

    def drain(self) -> None:
        while not self.ended:
            self.read(CHUNK)


class Inside:
    """The request loop and its handlers (one instance per sandbox)."""

    def __init__(self, workspace: str, tmp_dirs: list[str], pid1: bool, channel: tuple[int, int]):
        self.ws, self.tmp_dirs, self.pid1 = workspace, tmp_dirs, pid1
        self.incoming, self.out_fd = Incoming(channel[0]), channel[1]
        self.env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workspace, "LANG": "C.UTF-8"}
        self.env["TMPDIR"] = tmp_dirs[0]
        self.handlers = {
            "hello": self.hello, "check": self.check, "exec": self.exec, "read": self.read,
            "write": self.write, "wipe": self.wipe, "tar_in": self.tar_in, "tar_out": self.tar_out,
        }  # fmt: skip

    def serve(self) -> None:
        while (raw := self.incoming.frame()) is not None:
            self.incoming.start_body()
            out = Body(self.out_fd)
            try:
                request = json.loads(raw)
                if request["op"] not in ("write", "tar_in"):
                    self.incoming.drain()  # then stdin turns readable only if the host goes away
                reply = self.handlers[request["op"]](request, out)
            except Refused as exc:
                reply = {"error": str(exc), "refused": True}
            except Failed as exc:
                reply = {"error": str(exc), "refused": False}
            except Exception as exc:  # a hostile filesystem can fail anything: report, keep serving
                reply = {"error": f"{type(exc).__name__}: {exc}", "refused": False}
            self.incoming.drain()
            out.finish()
            write_frame(self.out_fd, json.dumps(reply).encode())
        self.kill_all()  # the host went away: nothing of ours outlives it

    def resolve(self, path: object, what: str = "path") -> str:
        """`path` against the workspace with every symlink followed; refused if it leaves it."""
        if not isinstance(path, str) or "\x00" in path:
            raise Refused(f"{what} must be a str without NUL, got {path!r}")
        full = os.path.realpath(os.path.join(self.ws, path))
        if full != self.ws and not full.startswith(self.ws + "/"):
            raise Refused(f"{what} {path!r} is outside the workspace {self.ws}")
        return full

    def hello(self, request: dict, out: Body) -> dict:
        return {"pid": os.getpid(), "uid": os.getuid(), "workspace": self.ws}

    def check(self, request: dict, out: Body) -> dict:
        return {"path": self.resolve(request["path"])}

    def exec(self, request: dict, out: Body) -> dict:
        """Run an argv in the workspace; every process is killed afterwards (and at the deadline)."""
        argv, cwd = request["argv"], self.resolve(request.get("cwd") or ".", "work_dir")
        if not os.path.isdir(cwd):
            raise Failed(f"work_dir {request.get('cwd')!r} is not a directory in the workspace")
        if not _findable(argv[0], cwd, self.env["PATH"]):
            return {"code": 127, "timed_out": False, "error": f"not found (PATH is {self.env['PATH']})"}
        out_r, out_w = os.pipe()
        try:
            pid = self.start(argv, cwd, request["rlimits"], out_w)
        except OSError as exc:
            os.close(out_r)
            return {"code": 127, "timed_out": False, "error": str(exc)}
        finally:
            os.close(out_w)
        output, status, timed_out = self.collect(pid, out_r, float(request["timeout_s"]), int(request["cap"]))
        out.write(output)
        code = os.waitstatus_to_exitcode(status) if status is not None else -signal.SIGKILL
        return {"code": code, "timed_out": timed_out}

    def start(self, argv: list[str], cwd: str, rlimits: dict, out_w: int) -> int:
        """The command in a session of its own, its hard rlimits set, output to `out_w`. Through
        prlimit(1) with posix_spawn (no copy of this process: the cheap path), else a fork."""
        if not os.access(PRLIMIT, os.X_OK):
            return _fork_exec(argv, cwd, rlimits, out_w, self.env)
        flags = [f"--{LIMITS[name][7:].lower()}={int(v)}:{int(v)}" for name, v in rlimits.items()]
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
        actions += [(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, out_w, 2)]
        os.chdir(cwd)
        try:
            pid = os.posix_spawn(
                PRLIMIT, [PRLIMIT, *flags, "--core=0:0", "--", *argv], self.env, file_actions=actions,
                setsid=True, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT),
            )  # fmt: skip
        finally:
            os.chdir("/")
        try:  # killed first when the episode's cgroup runs out of memory, never this program
            with open(f"/proc/{pid}/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass
        return pid

    def collect(self, pid: int, out_r: int, timeout: float, cap: int) -> tuple[bytes, int | None, bool]:
        """Read the child's output (kept up to `cap` + 1 bytes) until it exits or the deadline."""
        kept = bytearray()
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        os.set_blocking(out_r, False)
        sel.register(out_r, selectors.EVENT_READ, "out")
        sel.register(self.incoming.fd, selectors.EVENT_READ, "host")  # readable only when it went away
        pidfd = os.pidfd_open(pid)
        sel.register(pidfd, selectors.EVENT_READ, "exit")
        status, timed_out = None, False
        try:
            while status is None and not timed_out:
                left = deadline - time.monotonic()
                timed_out = left <= 0
                for key, _ in sel.select(max(left, 0)):
                    if key.data == "out" and not _read_into(out_r, kept, cap):
                        sel.unregister(out_r)
                    elif key.data == "exit":
                        status = os.waitpid(pid, 0)[1]
                    elif key.data == "host":
                        self.kill_all()
                        os._exit(0)
            reaped = self.kill_all(pid)
            status = reaped if status is None else status
            os.set_blocking(out_r, True)
            while _read_into(out_r, kept, cap):
                pass
        finally:
            sel.close()
            os.close(pidfd)
            os.close(out_r)
        return bytes(kept), status, timed_out

    def kill_all(self, main: int | None = None) -> int | None:
        """SIGKILL every process but this one and reap them all; `main`'s wait status if reaped here."""
        status = None
        while self.signal_all():
            while True:
                try:
                    pid, st = os.waitpid(-1, 0)
                except ChildProcessError:
                    break
                if pid == main:
                    status = st
        return status

    def signal_all(self) -> bool:
        """True while something was left to kill. As PID 1 of the namespace `kill(-1)` reaches every
        other process in it; on the host (a subreaper) only our descendants are ours to kill."""
        if self.pid1:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                return False
            return True
        found = descendants(os.getpid())
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        return bool(found)

    def read(self, request: dict, out: Body) -> dict:
        """A file's bytes, or lines first..last (1-based), up to `cap` + 1 bytes."""
        path, cap = self.resolve(request["path"]), int(request["cap"])
        if not os.path.isfile(path):
            raise Failed(f"file_read: {request['path']!r} is not a file in the workspace")
        first, last = request.get("start_line") or 1, request.get("end_line")
        with open(path, "rb") as f:
            if first == 1 and last is None:
                out.write(f.read(cap + 1))
                return {}
            kept, lineno = bytearray(), 1
            while (last is None or lineno <= last) and len(kept) <= cap:
                piece = f.readline(65536)
                if not piece:
                    break
                if lineno >= first:
                    kept += piece[: cap + 1 - len(kept)]
                lineno += piece.endswith(b"\n")
        out.write(bytes(kept))
        return {}

    def write(self, request: dict, out: Body) -> dict:
        """The body written to a file; parents made when `create_dirs`."""
        path = self.resolve(request["path"])
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            if not request.get("create_dirs", True):
                raise Failed(f"file_write: directory of {request['path']!r} does not exist")
            os.makedirs(parent, exist_ok=True)
        if os.path.lexists(path) and not os.path.isfile(path):  # a fifo would block us forever
            raise Failed(f"file_write: {request['path']!r} exists and is not a regular file")
        limit = int(request["max_bytes"])
        try:
            with open(path, "wb") as f:
                while data := self.incoming.read(CHUNK):
                    limit -= len(data)
                    if limit < 0:
                        raise Failed(f"file_write: content over {request['max_bytes']} bytes")
                    f.write(data)
        except OSError as exc:
            raise Failed(f"file_write: cannot write {request['path']!r}: {exc.strerror or exc}") from None
        return {}

    def wipe(self, request: dict | None = None, out: Body | None = None) -> dict:
        """Every process killed; the workspace and the temp dirs emptied."""
        self.kill_all()
        for root in [self.ws, *self.tmp_dirs]:
            os.chmod(root, 0o700 if not self.pid1 else 0o755)
            for entry in os.scandir(root):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, onerror=_make_removable)
                else:
                    os.unlink(entry.path)
        return {}

    def tar_in(self, request: dict, out: Body) -> dict:
        """A fresh workspace from the tar stream in the body (names checked against the workspace)."""
        self.wipe()
        with tarfile.open(fileobj=self.incoming, mode="r|") as tar:
            options = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
            tar.extractall(self.ws, members=self._checked(tar), **options)
        return {}

    def _checked(self, tar: tarfile.TarFile):
        for member in tar:
            name = os.path.normpath(member.name)
            if name.startswith(("/", "../")) or name == "..":
                raise Refused(f"tar member {member.name!r} is outside the workspace")
            if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
                continue  # devices and fifos are not workspace files
            if member.islnk():
                self.resolve(member.linkname, "tar link")
            if os.path.islink(os.path.join(self.ws, name)):
                raise Refused(f"tar member {member.name!r} would be written through a symlink")
            self.resolve(os.path.dirname(name) or ".", "tar member")
            yield member

    def tar_out(self, request: dict, out: Body) -> dict:
        """The workspace as a tar stream (modes kept, symlinks as links); unreadable files are skipped
        and named in the reply."""
        skipped: list[str] = []
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for dirpath, dirnames, filenames in os.walk(
                self.ws, onerror=lambda e: skipped.append(e.filename)
            ):
                dirnames.sort()
                for name in [*dirnames, *sorted(filenames)]:
                    _add(tar, os.path.join(dirpath, name), self.ws, skipped)
        return {"skipped": skipped[:100]}


def _add(tar: tarfile.TarFile, path: str, root: str, skipped: list[str]) -> None:
    rel = os.path.relpath(path, root)
    try:
        info = tar.gettarinfo(path, rel)
        if info.isreg():
            with open(path, "rb") as f:
                tar.addfile(info, f)
        elif info.isdir() or info.issym() or info.islnk():
            tar.addfile(info)
    except OSError:
        skipped.append(rel)


def _fork_exec(argv: list[str], cwd: str, rlimits: dict, out_w: int, env: dict) -> int:
    """The path without prlimit(1): fork, set the limits in the child, exec; an exec error comes
    back through a close-on-exec pipe (as `subprocess` does it) and is raised here."""
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            for name, value in [*rlimits.items(), ("core", 0)]:
                resource.setrlimit(getattr(resource, LIMITS[name]), (int(value), int(value)))
            os.chdir(cwd)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        except BaseException as exc:
            os.write(err_w, str(exc).encode(errors="replace")[:2000])
        os._exit(127)
    os.close(err_w)
    failure = b"".join(iter(lambda: os.read(err_r, 4096), b""))  # empty once exec closed it
    os.close(err_r)
    if failure:
        os.waitpid(pid, 0)
        raise OSError(failure.decode(errors="replace"))
    return pid


def _findable(program: str, cwd: str, path: str) -> bool:
    """Whether exec can find `program` (a name on PATH, or a path from `cwd`)."""
    if "/" in program:
        return os.path.exists(os.path.join(cwd, program))
    return any(os.access(os.path.join(d, program), os.X_OK) for d in path.split(":"))


def _read_into(fd: int, kept: bytearray, cap: int) -> bool:
    """One read into `kept` (bytes past `cap` + 1 are dropped); False at end of file."""
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        return True
    if len(kept) <= cap:
        kept += data[: cap + 1 - len(kept)]
    return bool(data)


def descendants(root: int) -> list[int]:
    """Every process below `root`, from the parent pids in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            found.append(pid)
            todo.append(pid)
    return found


def _make_removable(function, path: str, exc_info) -> None:
    """rmtree's error hook: a directory the agent made unwritable is made writable, then retried."""
    parent = os.path.dirname(path)
    os.chmod(parent, stat.S_IRWXU)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, stat.S_IRWXU)
        shutil.rmtree(path, onerror=_make_removable)
    else:
        os.unlink(path)


def main(argv: list[str]) -> None:
    """`WORKSPACE pid1|host TMPDIR...`: harden this process, then serve the host until it goes."""
    workspace, pid1, tmp_dirs = argv[0], argv[1] == "pid1", argv[2:]
    if pid1 and os.getpid() != 1:  # kill(-1) outside a namespace would kill every process we may signal
        sys.exit("inside.py: 'pid1' mode runs only as PID 1 of a new pid namespace")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the agent (same uid) cannot ptrace us or read our memory
    if not pid1:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of commands come back to us
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as PID 1, a default disposition is immune from inside
    channel = (os.dup(0), os.dup(1))  # close-on-exec: no command inherits the channel
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    Inside(workspace, tmp_dirs, pid1, channel).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
