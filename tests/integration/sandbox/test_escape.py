"""The escape suite: what an agent would try to leave its sandbox, against every backend (issue #37).

Each test is one attempt, run against `LocalSandbox` (bubblewrap) and `DockerSandbox` (the private
engine; those cases are marked `engine`) through the public Sandbox API only. Each asserts the way
the attempt is refused or contained, and its message says which ("refused: read-only file system",
"contained: invisible", "contained: stopped at the pids limit", ...). Where it is safe the same
attempt first runs unsandboxed on the host (a positive control), and the programs an attempt uses
are checked inside first, so no test passes because a command is missing or aimed at nothing.

Boxes: one shared per backend for attempts that do not damage it, fresh ones for those that may
(fork and memory bombs, disk fill, killing pid 1) or that need two episodes at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import random
import secrets
import shlex
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import pytest

from producers.sandbox.base import Sandbox, ToolResult
from producers.sandbox.errors import SandboxError

REPO = Path(__file__).resolve().parents[3]
MARGIN_S = 10.0  # how far past its timeout a timed-out call may return (docker restarts its container)
GRACE_S = 1.0  # how long a killed process may take to leave /proc once the call has returned
FORK_BOUND = 2000  # a fork loop that gets this far has no pids limit worth the name
MEMORY_MIB = 4096
DISK_BOUND = 4 << 30  # a disk fill that gets this far is not capped "well below the host's free space"
REFUSED_FS = ("Read-only file system", "Permission denied", "No such file or directory", "nonexistent")


# --- boxes -------------------------------------------------------------------------------------


def _new_box(kind: str, request) -> Sandbox:
    if kind == "local":
        from producers.sandbox.local import LocalSandbox

        return LocalSandbox()
    from producers.sandbox.docker import DockerConfig, DockerSandbox

    engine = request.getfixturevalue("sandbox_engine")
    return DockerSandbox(DockerConfig(docker_host=engine.docker_host, image=engine.image))


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.engine)])
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def backend_box(backend, request):
    """One sandbox per backend, shared by the attempts that leave it as they found it."""
    box = _new_box(backend, request)
    yield box
    box.close()


@pytest.fixture
def new_box(backend, request):
    """A factory of fresh sandboxes of the module's backend, all closed at the end of the test."""
    made: list[Sandbox] = []

    def make() -> Sandbox:
        made.append(_new_box(backend, request))
        return made[-1]

    yield make
    for box in made:
        box.close()


# --- helpers -----------------------------------------------------------------------------------


def sh(box: Sandbox, command: str | list[str], timeout_s: float = 60, **params) -> ToolResult:
    return box.run("shell", {"command": command, "timeout_s": timeout_s, **params})


def text(result: ToolResult) -> str:
    return f"{result.output}{result.error or ''}"


def show(result: ToolResult) -> str:
    return (
        f"exit={result.exit_code} timed_out={result.timed_out} "
        f"output={result.output[-300:]!r} error={(result.error or '')[-300:]!r}"
    )


_FOUND: weakref.WeakKeyDictionary[Sandbox, set[str]] = weakref.WeakKeyDictionary()


def need(box: Sandbox, *programs: str) -> None:
    """The attempt's programs exist inside: a missing one would make the attempt fail for nothing."""
    wanted = [p for p in programs if p not in _FOUND.get(box, set())]
    if not wanted:
        return
    found = sh(box, "for p in " + " ".join(wanted) + "; do command -v $p >/dev/null || echo $p; done")
    assert found.ok and not found.output.strip(), f"missing inside the sandbox: {show(found)}"
    _FOUND.setdefault(box, set()).update(wanted)


def host(argv: list[str], uid: int | None = None, **kw) -> subprocess.CompletedProcess:
    """The attempt unsandboxed (the positive control), as this process's user or as `uid`."""
    who = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, **who, **kw)


def marker() -> tuple[str, str]:
    """A `sleep` argument only this attempt uses, and a shell expression that makes it without spelling
    it (so the script's own command line never matches a search for it)."""
    digits = random.randint(100_000, 999_999)
    part = random.randint(1, digits - 1)
    return f"300.{digits}", f"300.$(({part}+{digits - part}))"


def host_processes(arg: str, whole: bool = True) -> list[str]:
    """Host processes (containers' and namespaces' included) with `arg` as an argument (`whole`) or in one."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        hit = arg.encode() in argv if whole else any(arg.encode() in a for a in argv)
        if hit and entry.name != str(os.getpid()):
            found.append(f"pid {entry.name}: {b' '.join(argv).decode(errors='replace')[:200]}")
    return found


def survivors(arg: str, whole: bool = True) -> list[str]:
    deadline = time.monotonic() + GRACE_S
    while (left := host_processes(arg, whole)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def find_on_host(name: str, budget_s: float = 20) -> Path | None:
    """Where a file the sandbox wrote lies on the host, if on a host filesystem we can walk in time."""
    deadline = time.monotonic() + budget_s
    for root in ("/var/tmp", "/tmp", "/dev/shm", "/run"):
        for folder, dirs, files in os.walk(root):
            if name in files:
                return Path(folder, name)
            if time.monotonic() > deadline:
                return None
            dirs[:] = [d for d in dirs if d not in ("proc", "sys")]
    return None


@dataclass
class Secret:
    path: Path
    secret: str  # text that appears in the output only if the file was read
    pattern: str  # a regular expression that finds it, and does not itself contain it


@dataclass
class HostFiles:
    token: str
    dir: Path  # a world-writable host dir under /tmp: any unsandboxed uid reaches it
    targets: dict[str, Secret]


@pytest.fixture(scope="module")
def host_files():
    """Marker files on the host: in a /tmp dir, in the project's data dir (inside the checkout), in the
    home dir; and the checkout's own pyproject.toml."""
    token = secrets.token_hex(8)
    secret = f"SECRET-{token}"
    folder = Path(tempfile.mkdtemp(prefix="agentstream-escape-", dir="/tmp"))
    folder.chmod(0o777)
    data_dir = REPO / ".agentstream"
    made_data_dir = not data_dir.exists()
    data_dir.mkdir(exist_ok=True)
    paths = {
        "host_tmp": folder / "secret.txt",
        "data_dir": data_dir / f"escape-{token}.txt",
        "home": Path.home() / f".agentstream-escape-{token}",
    }
    for path in paths.values():
        path.write_text(secret + "\n")
        path.chmod(0o644)
    targets = {name: Secret(path, secret, "SECRET-[0-9a-f]{16}") for name, path in paths.items()}
    targets["checkout"] = Secret(REPO / "pyproject.toml", 'name = "agentstream"', '^name = "agent')
    try:
        yield HostFiles(token, folder, targets)
    finally:
        for path in paths.values():
            path.unlink(missing_ok=True)
        if made_data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)


def test_isolation_report_claims_every_boundary(backend, backend_box):
    """The report is honest and complete: every boundary on, a non-root uid, nothing missing."""
    iso = backend_box.isolation
    assert iso["backend"] == backend
    for key in ("filesystem", "network", "processes", "memory", "disk", "per_episode"):
        assert iso[key] is True, f"isolation[{key!r}] is {iso[key]!r}; missing: {iso.get('missing')}"
    assert isinstance(iso["user"], int) and iso["user"] != 0, iso
    assert iso["missing"] == [], iso


# --- the host's files --------------------------------------------------------------------------

READS = {
    "shell_cat": lambda box, s: sh(box, ["cat", str(s.path)]),
    "file_read": lambda box, s: box.run("file_read", {"path": str(s.path)}),
    "file_read_dotdot": lambda box, s: box.run("file_read", {"path": "../" * 12 + str(s.path).lstrip("/")}),
    "proc_1_root": lambda box, s: sh(box, ["cat", f"/proc/1/root{s.path}"]),
    "proc_self_root": lambda box, s: sh(box, ["cat", f"/proc/self/root{s.path}"]),
    "shell_work_dir": lambda box, s: sh(box, ["cat", s.path.name], work_dir=str(s.path.parent)),
    "search": lambda box, s: box.run("search", {"pattern": s.pattern, "path": str(s.path.parent)}),
}


@pytest.mark.parametrize("way", READS)
@pytest.mark.parametrize("target", ["host_tmp", "data_dir", "home", "checkout"])
def test_read_a_host_file(backend_box, host_files, target, way):
    """Refused ("outside the workspace" for the file tools) or contained: the host file is invisible."""
    secret = host_files.targets[target]
    control = host(["cat", str(secret.path)])
    assert secret.secret in control.stdout, f"control: the host reads {secret.path}: {control.stderr}"
    need(backend_box, "cat")
    result = READS[way](backend_box, secret)
    assert secret.secret not in text(result), f"ESCAPED: {way} read {secret.path}: {show(result)}"
    assert result.exit_code != 0, f"{way} of {secret.path} should fail: {show(result)}"


def test_read_etc_shadow(backend_box):
    """Refused: permission denied (or absent); the file tools refuse it as outside the workspace."""
    control = host(["cat", "/etc/shadow"])
    assert control.returncode == 0 and "root:" in control.stdout, "control: root reads the host's shadow"
    need(backend_box, "cat")
    result = sh(backend_box, ["cat", "/etc/shadow"])
    assert result.exit_code != 0 and "root:" not in result.output, f"ESCAPED: cat /etc/shadow: {show(result)}"
    assert any(r in text(result) for r in ("Permission denied", "No such file")), show(result)
    via_tool = backend_box.run("file_read", {"path": "/etc/shadow"})
    assert via_tool.exit_code == 1 and "outside the workspace" in (via_tool.error or ""), show(via_tool)


def test_list_root_home(backend_box, host_files):
    """Contained: the host's /root (its dot files, the marker) is not what `ls -a /root` shows inside."""
    marker_name = host_files.targets["home"].path.name
    control = host(["ls", "-a", "/root"])
    assert marker_name in control.stdout, "control: the host lists its own home"
    need(backend_box, "ls")
    result = sh(backend_box, "ls -a /root /proc/1/root/root 2>&1; true")
    assert marker_name not in result.output, f"ESCAPED: ls -a /root: {show(result)}"


PROC_LISTING = """import os
for pid in os.listdir("/proc"):
    try:
        print(pid, open(f"/proc/{pid}/cmdline").read())
    except OSError:
        pass
"""


def test_host_processes_are_invisible_and_unkillable(backend_box):
    """Contained: a host process is not in the sandbox's /proc, and killing its host pid inside misses."""
    arg, _ = marker()
    proc = subprocess.Popen(["sleep", arg])
    try:
        deadline = time.monotonic() + 5
        while not host_processes(arg) and time.monotonic() < deadline:  # until `sleep` has exec'd
            time.sleep(0.02)
        assert host_processes(arg), "control: the host sees its own marker process"
        need(backend_box, "python3", "kill")
        seen = sh(backend_box, ["python3", "-c", PROC_LISTING])
        assert seen.ok and "python3" in seen.output, f"control: the listing shows itself: {show(seen)}"
        assert arg not in seen.output, f"ESCAPED: the host process is visible inside: {show(seen)}"
        sh(backend_box, f"kill -9 {proc.pid}; true")
        assert proc.poll() is None, f"ESCAPED: `kill -9 {proc.pid}` inside killed the host's process"
    finally:
        proc.kill()
        proc.wait()


# --- writing outside the workspace ------------------------------------------------------------

WRITES = ["root_dir", "usr", "etc", "var", "host_tmp", "host_tmp_via_proc_1_root", "data_dir", "checkout"]


def _write_target(where: str, files: HostFiles) -> tuple[Path, str]:
    """(the host path that must stay absent, the path the agent writes to)."""
    name = f"escape-{files.token}-{where}"
    folder = {
        "root_dir": Path("/"),
        "usr": Path("/usr"),
        "etc": Path("/etc"),
        "var": Path("/var"),
        "data_dir": REPO / ".agentstream",
        "checkout": REPO,
    }.get(where, files.dir)
    inside = f"/proc/1/root{folder / name}" if where.endswith("via_proc_1_root") else str(folder / name)
    return folder / name, inside


@pytest.mark.parametrize("where", WRITES)
def test_write_outside_the_workspace(backend_box, host_files, where):
    """Refused (read-only file system, permission denied, no such directory) and nothing on the host."""
    on_host, inside = _write_target(where, host_files)
    if where.startswith("host_tmp"):
        probe = host_files.dir / f"control-{host_files.token}"
        control = host(["sh", "-c", f"echo x > {shlex.quote(str(probe))}"], uid=backend_box.isolation["user"])
        assert control.returncode == 0 and probe.exists(), (
            f"control: the sandbox's uid writes there: {control}"
        )
        probe.unlink()
    try:
        by_shell = sh(backend_box, f"echo pwned > {shlex.quote(inside)}")
        by_tool = backend_box.run("file_write", {"path": inside, "content": "pwned"})
        assert not on_host.exists(), f"ESCAPED: wrote {on_host} ({show(by_shell)} / {show(by_tool)})"
        assert by_shell.exit_code != 0 and any(r in text(by_shell) for r in REFUSED_FS), show(by_shell)
        assert by_tool.exit_code == 1 and "outside the workspace" in (by_tool.error or ""), show(by_tool)
    finally:
        if on_host.exists() and on_host.is_file():
            on_host.unlink()


def test_write_into_a_private_copy_of_the_host_tmp_dir(backend_box, host_files):
    """Contained: `mkdir -p` of the host dir's path may succeed inside, in the sandbox's own /tmp; the host
    dir stays as it was."""
    before = sorted(p.name for p in host_files.dir.iterdir())
    folder = shlex.quote(str(host_files.dir))
    sh(backend_box, f"mkdir -p {folder} && echo pwned > {folder}/pwned")
    assert sorted(p.name for p in host_files.dir.iterdir()) == before, "ESCAPED: the host's /tmp dir changed"


FIND = "find / \\( -path /proc -o -path /sys -o -path /usr \\) -prune -o -name {name} -print; true"


def test_another_episodes_workspace_is_out_of_reach(new_box, host_files):
    """Contained: episode B finds nothing of episode A's workspace and cannot write to it: by A's host
    path (when it has one), by the host pid of A's processes (/proc/PID/root), by /proc/*/root, by
    searching the whole filesystem or by the old layout."""
    first, second = new_box(), new_box()
    name = f"secret-{host_files.token}-ws.txt"
    secret = f"WORKSPACE-{host_files.token}"
    assert first.run("file_write", {"path": name, "content": secret}).ok
    need(second, "cat", "find")
    assert second.run("file_write", {"path": f"own-{name}", "content": "mine"}).ok
    own = sh(second, FIND.format(name=f"own-{name}"))
    assert f"/workspace/own-{name}" in own.output, f"control: the search finds B's own file: {show(own)}"
    attempts = {  # the paths the attacker tries; an error message may echo them, so only a path
        # that `find` prints (a leading "/") or the file's content counts as found
        "find": FIND.format(name=name),
        "proc_root": f"cat /proc/[0-9]*/root/workspace/{name}",
        "old_local_layout": f"cat /tmp/agentstream-sandbox-*/workspace/{name}",
    }
    pids = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    seeing = [pid for pid in pids if os.path.exists(f"/proc/{pid}/root/workspace/{name}")]
    assert seeing, "control: the host finds a process of episode A (its /proc/PID/root shows A's file)"
    attempts["host_pid_root_read"] = f"cat /proc/{seeing[0]}/root/workspace/{name}"
    attempts["host_pid_root_write"] = f"echo pwned > /proc/{seeing[0]}/root/workspace/pwned"
    on_host = find_on_host(name)
    if on_host is not None:  # the attacker's best case: it knows where A's workspace lies on the host
        assert secret in on_host.read_text(), f"control: the host reads A's file at {on_host}"
        quoted = shlex.quote(str(on_host))
        attempts["host_path_read"] = f"cat {quoted}"
        attempts["host_path_overwrite"] = f"echo pwned > {quoted}"
        attempts["host_path_new_file"] = f"echo pwned > {shlex.quote(str(on_host.parent / 'pwned'))}"
        for way, params in {
            "file_read_host_path": ("file_read", {"path": str(on_host)}),
            "file_write_host_path": ("file_write", {"path": str(on_host.parent / "pwned2"), "content": "x"}),
        }.items():
            result = second.run(*params)
            assert secret not in text(result) and result.exit_code == 1, f"ESCAPED: {way}: {show(result)}"
    for way, command in attempts.items():
        result = sh(second, command)
        found = secret in result.output or (way == "find" and f"/{name}" in result.output)
        assert not found, f"ESCAPED: {way}: {show(result)}"
    listing = sh(first, "ls -a /workspace; cat /workspace/" + name)
    assert listing.output.split() == [".", "..", name, secret], (
        f"ESCAPED: A's workspace changed: {show(listing)}"
    )


# --- links -------------------------------------------------------------------------------------


def test_symlink_to_a_host_file_reads_nothing(backend_box, host_files):
    """Contained: the link's target is resolved inside the boundary, where the host file is invisible."""
    secret = host_files.targets["host_tmp"]
    need(backend_box, "ln", "cat")
    planted = sh(
        backend_box,
        f"ln -sfn {shlex.quote(str(secret.path))} link && ln -sfn /proc/1/root{secret.path} link2",
    )
    assert planted.ok, show(planted)
    for result in (
        backend_box.run("file_read", {"path": "link"}),
        backend_box.run("file_read", {"path": "link2"}),
        sh(backend_box, "cat link link2"),
        backend_box.run("search", {"pattern": secret.pattern}),
    ):
        assert secret.secret not in text(result), f"ESCAPED: read through a planted symlink: {show(result)}"
    sh(backend_box, "rm -f link link2")


def test_symlink_to_a_host_dir_writes_nothing(backend_box, host_files):
    """Contained: writes through links to the host dir and to / land nowhere on the host (refused, or in
    the sandbox's own /tmp)."""
    token = host_files.token
    need(backend_box, "ln")
    planted = sh(backend_box, f"ln -sfn {shlex.quote(str(host_files.dir))} dlink && ln -sfn / rootlink")
    assert planted.ok, show(planted)
    before = sorted(p.name for p in host_files.dir.iterdir())
    backend_box.run("file_write", {"path": "dlink/pwned", "content": "x"})
    backend_box.run("file_write", {"path": f"rootlink/etc/escape-{token}", "content": "x"})
    backend_box.run("file_write", {"path": f"rootlink{host_files.dir}/pwned2", "content": "x"})
    sh(backend_box, f"echo x > dlink/pwned3; echo x > rootlink/escape-{token}")
    assert sorted(p.name for p in host_files.dir.iterdir()) == before, "ESCAPED: wrote into the host dir"
    assert not Path(f"/etc/escape-{token}").exists() and not Path(f"/escape-{token}").exists(), "ESCAPED"
    shadow = backend_box.run("file_read", {"path": "rootlink/etc/shadow"})
    assert "root:" not in shadow.output, f"ESCAPED: read /etc/shadow through a link to /: {show(shadow)}"
    sh(backend_box, "rm -f dlink rootlink")


def test_hardlinks_to_host_and_system_files(backend_box, host_files):
    """Refused: a hard link to an invisible host file has no source, one to /etc/passwd or /etc/shadow
    crosses a mount (EXDEV) or is not the agent's file (EPERM); the host's files are unchanged."""
    secret = host_files.targets["host_tmp"]
    passwd, shadow = sha(Path("/etc/passwd")), sha(Path("/etc/shadow"))
    need(backend_box, "ln")
    made = sh(
        backend_box, f"ln {shlex.quote(str(secret.path))} hl; ln /etc/passwd pw; ln /etc/shadow sd; true"
    )
    for path in ("hl", "pw", "sd"):
        backend_box.run("file_write", {"path": path, "content": "root::0:0::/root:/bin/sh\n"})
    read = backend_box.run("file_read", {"path": "hl"})
    assert secret.secret not in text(read) + text(made), f"ESCAPED: read through a hard link: {show(read)}"
    assert sha(Path("/etc/passwd")) == passwd and sha(Path("/etc/shadow")) == shadow, (
        "ESCAPED: host /etc changed"
    )
    sh(backend_box, "rm -f hl pw sd")


def test_snapshot_does_not_follow_planted_links(backend_box, host_files, tmp_path):
    """Contained: snapshot copies links as links (or refuses them); nothing lands outside its target."""
    need(backend_box, "ln", "mkdir")
    plant = f"ln -sfn {shlex.quote(str(host_files.dir))} out && ln -sfn /etc/passwd pw && ln -sfn / root"
    assert sh(backend_box, plant + " && mkdir -p d && ln -sfn ../../../../../../.. d/up").ok
    before = sorted(p.name for p in host_files.dir.iterdir())
    with contextlib.suppress(SandboxError):
        backend_box.snapshot(tmp_path / "snap")
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["snap"]), "ESCAPED: wrote beside the target"
    assert sorted(p.name for p in host_files.dir.iterdir()) == before, "ESCAPED: wrote into the host dir"
    for name in ("out", "pw", "root", "d/up"):
        copied = tmp_path / "snap" / name
        assert copied.is_symlink() or not copied.exists(), f"ESCAPED: snapshot followed the link {name}"
    backend_box.reset()


def test_reset_from_a_dir_with_a_link_to_a_host_file(backend_box, host_files, tmp_path):
    """Contained: a link sent in by reset points at a path invisible inside (or reset refuses it)."""
    secret = host_files.targets["host_tmp"]
    source = tmp_path / "src"
    source.mkdir()
    (source / "link").symlink_to(secret.path)
    (source / "ok.txt").write_text("copied")
    try:
        backend_box.reset(source)
    except SandboxError:
        backend_box.reset()
        return
    assert backend_box.run("file_read", {"path": "ok.txt"}).output == "copied", (
        "control: reset copied the dir"
    )
    for result in (backend_box.run("file_read", {"path": "link"}), sh(backend_box, "cat link")):
        assert secret.secret not in text(result), (
            f"ESCAPED: read through a link sent in by reset: {show(result)}"
        )
    backend_box.reset()


# --- the host's network and sockets ------------------------------------------------------------

CONNECT = """import socket, sys
kind, where = sys.argv[1], sys.argv[2]
try:
    if kind == "tcp":
        socket.create_connection((where.split(":")[0], int(where.split(":")[1])), 3).close()
    else:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(3)
        s.connect("\\0" + where[1:] if where.startswith("@") else where)
        s.close()
except OSError as exc:
    print("REFUSED", exc.errno, type(exc).__name__)
    sys.exit(3)
print("CONNECTED")
"""


class Listener:
    """A host server that counts the connections it accepts (TCP on 127.0.0.1, or a Unix socket)."""

    def __init__(self, family: int, address):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(address)
        self.sock.listen(16)
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(5)


def _listen(kind: str, folder: Path) -> tuple[Listener, str]:
    if kind in ("tcp_free_port", "tcp_broker_port"):
        for port in ([9092] if kind == "tcp_broker_port" else []) + [0]:
            with contextlib.suppress(OSError):
                listener = Listener(socket.AF_INET, ("127.0.0.1", port))
                return listener, f"127.0.0.1:{listener.sock.getsockname()[1]}"
        raise AssertionError("no port for the host listener")
    if kind == "unix_path":
        path = folder / f"host-{secrets.token_hex(4)}.sock"
        listener = Listener(socket.AF_UNIX, str(path))
        path.chmod(0o777)
        return listener, str(path)
    name = f"agentstream-escape-{secrets.token_hex(8)}"
    return Listener(socket.AF_UNIX, "\0" + name), "@" + name


@pytest.mark.parametrize("kind", ["tcp_free_port", "tcp_broker_port", "unix_path", "unix_abstract"])
def test_reach_a_host_service(backend_box, host_files, kind):
    """Contained: the sandbox has its own (empty) loopback and none of the host's sockets; the host
    server accepts nothing."""
    listener, where = _listen(kind, host_files.dir)
    try:
        uid = backend_box.isolation["user"]
        control = host(["python3", "-c", CONNECT, kind.split("_")[0], where], uid=uid)
        assert "CONNECTED" in control.stdout and listener.accepted == 1, f"control as uid {uid}: {control}"
        need(backend_box, "python3")
        result = sh(backend_box, ["python3", "-c", CONNECT, kind.split("_")[0], where])
        assert "REFUSED" in result.output, f"the attempt did not run as expected: {show(result)}"
        assert listener.accepted == 1, f"ESCAPED: the host's {kind} {where} accepted a sandbox connection"
    finally:
        listener.close()


def test_reach_the_docker_engine_socket(backend, backend_box, request):
    """Contained: the engine's socket (root on the host, in effect) does not exist inside."""
    if backend == "docker":
        candidates = [request.getfixturevalue("sandbox_engine").docker_host]
    else:
        candidates = [os.environ.get(v, "") for v in ("AGENTSTREAM_SANDBOX_DOCKER_HOST", "DOCKER_HOST")]
        from infra.sandbox_engine.engine import SandboxEngine  # the private engine's default place

        candidates += [f"unix://{SandboxEngine().socket}", "unix:///var/run/docker.sock"]
    paths = [a.removeprefix("unix://") for a in candidates if a.startswith("unix://")]
    path = next((p for p in paths if Path(p).exists()), None)
    if path is None:
        pytest.skip(f"no engine socket on this host to attack (looked at {paths})")
    assert "CONNECTED" in host(["python3", "-c", CONNECT, "unix", path]).stdout, f"control: {path} answers"
    need(backend_box, "python3")
    result = sh(backend_box, ["python3", "-c", CONNECT, "unix", path])
    assert "REFUSED 2 FileNotFoundError" in result.output, f"ESCAPED or unexpected: {show(result)}"


def test_network_out(backend_box):
    """Contained: no route out at all (ENETUNREACH, 101), not a timeout or a filter."""
    need(backend_box, "python3")
    result = sh(backend_box, ["python3", "-c", CONNECT, "tcp", "1.1.1.1:53"])
    assert "REFUSED 101" in result.output, f"ESCAPED or unexpected: connect 1.1.1.1:53: {show(result)}"


def test_only_loopback_exists(backend_box):
    """Contained: `lo` is the only interface (the host has others)."""
    names = "import socket; print(' '.join(sorted(n for _, n in socket.if_nameindex())))"
    assert host(["python3", "-c", names]).stdout.split() != ["lo"], "control: the host has more than lo"
    need(backend_box, "python3")
    result = sh(backend_box, ["python3", "-c", names])
    assert result.ok and result.output.split() == ["lo"], f"ESCAPED: interfaces inside: {show(result)}"


# --- resources ---------------------------------------------------------------------------------

FORK_COUNT = """import os, sys, time
n = 0
while n < int(sys.argv[1]):
    try:
        pid = os.fork()
    except OSError as exc:
        print("REFUSED", n, exc.errno, flush=True)
        break
    if pid == 0:
        os.closerange(0, 3)
        time.sleep(60)
        os._exit(0)
    n += 1
else:
    print("UNBOUNDED", n, flush=True)
"""


def _fork_limit(box: Sandbox) -> ToolResult:
    need(box, "python3")
    return sh(box, ["python3", "-c", FORK_COUNT, str(FORK_BOUND)], timeout_s=60)


def test_fork_bomb_stops_at_the_pids_limit(new_box):
    """Contained: fork fails with EAGAIN (11) well before FORK_BOUND processes; the children die with the
    call."""
    result = _fork_limit(new_box())
    assert result.output.startswith("REFUSED") and result.output.split()[2] == "11", (
        f"ESCAPED: no pids limit: {show(result)}"
    )
    assert int(result.output.split()[1]) < FORK_BOUND


def test_fork_bomb_leaves_the_sandbox_and_host_usable(new_box):
    """Contained: a shell fork bomb ends with its call (its timeout at worst); the sandbox answers
    afterwards, the host still forks and no bomb process remains."""
    box = new_box()
    guard = _fork_limit(box)  # never start an unbounded bomb on a shared host
    if not guard.output.startswith("REFUSED"):
        pytest.fail(f"no pids limit (not starting a real fork bomb on this host): {show(guard)}")
    tag = f"bomb-{secrets.token_hex(6)}"
    start = time.monotonic()
    sh(box, f"f() {{ f | f & }}; f; sleep 3 # {tag}", timeout_s=5)
    elapsed = time.monotonic() - start
    assert elapsed < 5 + MARGIN_S, f"ESCAPED: the bomb held the call for {elapsed:.1f} s"
    assert not survivors(tag, whole=False), f"ESCAPED: bomb processes remain: {survivors(tag, whole=False)}"
    assert host(["true"]).returncode == 0, "the host cannot fork"
    after = sh(box, "echo alive")
    assert after.ok and after.output == "alive\n", f"the sandbox is broken after the bomb: {show(after)}"


MEMORY_BOMB = """held = []
for i in range({chunks}):
    held.append(b"x" * (64 << 20))  # bytes filled, so every page is touched
    print("MiB", (i + 1) * 64, flush=True)
print("ALLOCATED", flush=True)
"""


def test_memory_bomb(new_box):
    """Contained: allocating (and touching) 4 GiB is killed (137) or refused (MemoryError); the
    sandbox and the host carry on."""
    box = new_box()
    need(box, "python3")
    bomb = MEMORY_BOMB.format(chunks=MEMORY_MIB // 64)
    result = sh(box, ["python3", "-c", bomb], timeout_s=120)
    assert "ALLOCATED" not in result.output and not result.ok, f"ESCAPED: 4 GiB allocated: {show(result)}"
    assert result.exit_code == 137 or "MemoryError" in text(result), f"unexpected end: {show(result)}"
    after = sh(box, "echo alive")
    assert after.ok and after.output == "alive\n", f"the sandbox is broken after the bomb: {show(after)}"


DISK_FILL = """import errno, os, sys
bound, chunk, total, errors = int(sys.argv[1]), b"\\1" * (1 << 20), 0, []
for folder in ("/workspace/fill", "/tmp/fill"):
    os.makedirs(folder, exist_ok=True)
    i = 0
    while total < bound:
        try:
            with open(f"{folder}/{i}", "wb") as f:
                for _ in range(16):
                    f.write(chunk)
                    total += len(chunk)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            errors.append(errno.errorcode.get(exc.errno, str(exc.errno)))
            break
        i += 1
print("WROTE", total, "ERRORS", *errors, flush=True)
"""


def test_disk_fill(new_box):
    """Contained: writing until failure (many 16 MiB files, so a per-file limit is no answer) stops with
    ENOSPC or EDQUOT below DISK_BOUND, in the workspace and /tmp together; the host's disk grew by less."""
    box = new_box()
    need(box, "python3")
    free_before = shutil.disk_usage("/").free
    assert free_before > 4 * DISK_BOUND, (
        f"the host has too little free space to try this safely ({free_before})"
    )
    result = sh(box, ["python3", "-c", DISK_FILL, str(DISK_BOUND)], timeout_s=240)
    grown = free_before - shutil.disk_usage("/").free
    try:
        words = result.output.split()
        assert words[:1] == ["WROTE"], f"the fill did not run to its end: {show(result)}"
        assert int(words[1]) < DISK_BOUND, f"ESCAPED: wrote {words[1]} bytes uncapped: {show(result)}"
        assert words[3:] and set(words[3:]) <= {"ENOSPC", "EDQUOT"}, f"unexpected stop: {show(result)}"
        assert grown < DISK_BOUND, f"ESCAPED: the host's disk lost {grown} bytes"
    finally:
        sh(box, "rm -rf /workspace/fill /tmp/fill")
    after = box.run("file_write", {"path": "after.txt", "content": "ok"})
    assert after.ok, f"the sandbox cannot write once the fill is gone: {show(after)}"


def test_flood_the_output(backend_box):
    """Contained: 200 MB of output comes back cut at the output limit (about 1 MB) with the marker; the
    call returns and the sandbox answers afterwards."""
    need(backend_box, "yes", "head")
    result = sh(backend_box, "yes | head -c 200000000; yes | head -c 200000000 >&2", timeout_s=60)
    assert not result.timed_out and "truncated" in result.output, f"the flood was not cut: {show(result)}"
    assert len(result.output) < 2_000_000, f"ESCAPED: {len(result.output)} characters came back"
    assert sh(backend_box, "echo alive").output == "alive\n", "the sandbox is broken after the flood"


# --- processes that outlive their call --------------------------------------------------------

DAEMON = """import os, time
os.fork() and os._exit(0)
os.setsid()
os.fork() and os._exit(0)
os.closerange(0, 3)
time.sleep(300)
"""
LEFT_BEHIND = {
    "setsid_background": 'setsid sleep "$m" >/dev/null 2>&1 </dev/null &',
    "setsid_fork": 'setsid -f sleep "$m" >/dev/null 2>&1 </dev/null',
    "double_fork": '( (sleep "$m" >/dev/null 2>&1 </dev/null &) & )',
    "nohup": 'nohup sleep "$m" >/dev/null 2>&1 </dev/null &',
    "python_daemon": f'python3 -c {shlex.quote(DAEMON)} "$m"',
    "background_holding_stdout": 'setsid sleep "$m" &',
    # then kill the parent (the backend's runner, whose clean-up would come after the command)
    "then_kills_its_parent": 'setsid sleep "$m" >/dev/null 2>&1 </dev/null & kill -9 "$PPID"',
}


@pytest.mark.parametrize("how", LEFT_BEHIND)
def test_leave_a_process_behind(backend_box, how):
    """Contained: the process was running when the command ended (the command says so) and is gone, from
    the host's /proc and from inside, once the call has returned."""
    arg, expression = marker()
    need(backend_box, "setsid", "nohup", "pgrep", "sleep", "python3")
    script = f'm={expression}; {LEFT_BEHIND[how]}\nsleep 0.5; pgrep -f "$m" >/dev/null && echo STARTED'
    start = time.monotonic()
    result = sh(backend_box, script, timeout_s=20)
    elapsed = time.monotonic() - start
    assert "STARTED" in result.output, f"the attempt did not start its process: {show(result)}"
    left = survivors(arg)
    assert not left, f"ESCAPED: {how} survived its call ({elapsed:.1f} s): {left}"
    digits = arg.split(".")[1]
    inside = sh(backend_box, ["pgrep", "-f", f"30[0].{digits}"])
    assert inside.exit_code == 1, f"ESCAPED: {how} is still running inside: {show(inside)}"


OUTLIVE = {
    "ignores_term": "trap '' TERM INT HUP; sleep \"$m\"",
    # its parent (a `timeout` or runner, when there is one; 0 under `docker exec`) and pid 1
    "kills_its_parent_and_pid1": '[ "$PPID" -gt 0 ] && kill -9 "$PPID"; kill -9 1; sleep "$m"',
    "new_session": 'setsid -w sleep "$m"',
    "background_ignores_term": "trap '' TERM INT HUP; sleep \"$m\" & wait",
    "python_new_session_ignores_term": (
        "python3 -c 'import os, signal, time\n"
        "for s in (1, 2, 15): signal.signal(s, signal.SIG_IGN)\n"
        'os.setsid(); time.sleep(300)\' "$m"'
    ),
}


@pytest.mark.parametrize("how", OUTLIVE)
def test_outlive_the_timeout(backend_box, how):
    """Contained: the call returns `timed_out` within its timeout plus a margin, nothing it started
    remains, and the sandbox (its workspace too) carries on."""
    arg, expression = marker()
    need(backend_box, "setsid", "sleep", "kill", "python3")
    assert backend_box.run("file_write", {"path": "kept.txt", "content": "kept"}).ok
    start = time.monotonic()
    result = sh(backend_box, f"m={expression}; {OUTLIVE[how]}", timeout_s=2)
    elapsed = time.monotonic() - start
    assert result.timed_out, f"the call did not time out: {show(result)}"
    assert elapsed < 2 + MARGIN_S, f"ESCAPED: the call took {elapsed:.1f} s with a 2 s timeout"
    assert not survivors(arg), f"ESCAPED: {how} outlived the timeout: {survivors(arg)}"
    after = backend_box.run("file_read", {"path": "kept.txt"})
    assert after.ok and after.output == "kept", f"the sandbox lost its workspace: {show(after)}"


# --- episodes ----------------------------------------------------------------------------------


def test_another_episodes_tmp_is_invisible(new_box):
    """Contained: each episode has its own /tmp; B lists its own and finds nothing of A's."""
    first, second = new_box(), new_box()
    token = secrets.token_hex(8)
    assert sh(first, f"echo TMP-{token} > /tmp/secret-{token}").ok
    control = sh(first, f"cat /tmp/secret-{token}")
    assert control.output == f"TMP-{token}\n", f"control: A's /tmp keeps its file: {show(control)}"
    need(second, "ls", "cat")
    seen = sh(second, "ls -la /tmp; cat /tmp/secret-*")
    assert token not in seen.output, f"ESCAPED: B sees A's /tmp: {show(seen)}"
    assert sh(second, "echo own > /tmp/own && cat /tmp/own").output == "own\n", "B's own /tmp is unusable"


def test_tmp_does_not_survive_reset(backend_box):
    """Contained: reset empties /tmp (and the workspace)."""
    token = secrets.token_hex(8)
    assert sh(backend_box, f"echo {token} > /tmp/kept-{token} && echo {token} > ws-{token}").ok
    kept = sh(backend_box, f"cat /tmp/kept-{token}")
    assert kept.output == f"{token}\n", f"control: /tmp persists between calls: {show(kept)}"
    backend_box.reset()
    gone = sh(backend_box, "ls -a /tmp /workspace")
    assert gone.ok and "/workspace:" in gone.output, f"control: the listing runs: {show(gone)}"
    assert token not in gone.output, f"ESCAPED: /tmp or the workspace survived reset: {show(gone)}"


# --- the environment and the sandbox's own supervisor -----------------------------------------


@pytest.fixture
def marked_env(monkeypatch, backend, request) -> dict[str, str]:
    """Secrets in this process's environment, set before the sandbox is made (so its processes could
    inherit them)."""
    token = secrets.token_hex(8)
    docker_host = (
        request.getfixturevalue("sandbox_engine").docker_host
        if backend == "docker"
        else f"unix:///run/escape-{token}.sock"
    )
    env = {
        "AGENTSTREAM_ESCAPE_MARKER": f"MARK-{token}",
        "AWS_SECRET_ACCESS_KEY": f"AWS-{token}",
        "AWS_ACCESS_KEY_ID": f"AKID-{token}",
        "DOCKER_HOST": docker_host,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    control = host(["env"]).stdout
    assert all(f"{k}={v}" in control for k, v in env.items()), "control: a child of the host inherits them"
    return env


def test_host_environment_does_not_leak(new_box, marked_env):
    """Contained: none of the host's variables (names or values) are in the commands' environment, nor in
    that of any process the sandbox can see."""
    box = new_box()
    need(box, "env", "cat")
    seen = sh(box, "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; true")
    for name, value in marked_env.items():
        assert f"{name}=" not in seen.output, f"ESCAPED: {name} leaks into the sandbox: {show(seen)}"
        assert value not in seen.output, f"ESCAPED: the value of {name} leaks into the sandbox"


PROC_MEM = """import sys
try:
    start = int(open("/proc/1/maps").readline().split("-")[0], 16)
    with open("/proc/1/mem", "rb") as f:
        f.seek(start)
        data = f.read(16)
except (OSError, ValueError) as exc:
    print("REFUSED", getattr(exc, "errno", None), type(exc).__name__)
    sys.exit(3)
print("READ", data.hex())
"""
PTRACE = """import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.ptrace(16, 1, 0, 0) != 0:
    print("REFUSED", ctypes.get_errno())
    sys.exit(3)
libc.ptrace(17, 1, 0, 0)
print("ATTACHED")
"""
SUPERVISOR = {
    "read_pid1_environ": "cat /proc/1/environ; true",
    "read_pid1_mem": ["python3", "-c", PROC_MEM],
    "ptrace_pid1": ["python3", "-c", PTRACE],
    # pid 1's pipes (a local sandbox's channel to the host): forge a frame, steal the next request
    "write_pid1_stdout": "printf '\\000\\000\\377\\377garbage' > /proc/1/fd/1; true",
    "read_pid1_stdin": "timeout 2 cat /proc/1/fd/0 > /dev/null; true",
    "kill_pid1": "kill -9 1; kill -TERM 1; sleep 0.5; true",
    "kill_everything": "kill -9 -1; sleep 0.5; true",
}


def _pid1_is_harmless(box: Sandbox, env: dict[str, str]) -> str | None:
    """Why the sandbox's pid 1 would be worth attacking (root inside, capabilities, the host's
    environment), or None."""
    status = sh(box, "cat /proc/1/status /proc/1/environ 2>/dev/null | tr '\\0' '\\n'; true").output
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if fields.get("Uid", "0").split()[:1] == ["0"]:
        return f"pid 1 runs as root inside: {fields.get('Uid')}"
    if int(fields.get("CapEff", "1").strip(), 16):
        return f"pid 1 has capabilities: {fields.get('CapEff')}"
    if any(value in status for value in env.values()):
        return "pid 1 carries the host's environment"
    return None


@pytest.mark.parametrize("attempt", SUPERVISOR)
def test_attack_the_sandboxs_pid1(new_box, marked_env, attempt):
    """Refused (EPERM/EACCES) or harmless (pid 1 is unprivileged and holds nothing of the host); the
    sandbox answers afterwards with its workspace intact."""
    box = new_box()
    need(box, "python3", "cat", "kill", "sleep", "timeout")
    assert box.run("file_write", {"path": "kept.txt", "content": "kept"}).ok
    result = sh(box, SUPERVISOR[attempt], timeout_s=20)
    assert not any(v in text(result) for v in marked_env.values()), f"ESCAPED: {attempt}: {show(result)}"
    if attempt in ("read_pid1_mem", "ptrace_pid1") and "REFUSED" not in result.output:
        why = _pid1_is_harmless(box, marked_env)
        assert why is None, f"ESCAPED: {attempt} succeeded and {why}: {show(result)}"
    after = box.run("file_read", {"path": "kept.txt"})
    assert after.ok and after.output == "kept", f"the sandbox is broken after {attempt}: {show(after)}"


HIJACK = r'''import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
NAMES = "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss"
NAMES += " fs_base gs_base ds es fs gs"  # x86_64's user_regs_struct


class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in NAMES.split()]


def hijack(pid, command):
    """Make `pid` execve /bin/sh -c command: attach, write the strings below its stack pointer and a
    syscall instruction where it stands, set the registers, detach."""
    if libc.ptrace(16, pid, None, None) != 0:
        return f"REFUSED {ctypes.get_errno()}"
    os.waitpid(pid, 0x40000000)  # __WALL
    regs = Regs()
    libc.ptrace(12, pid, None, ctypes.byref(regs))
    base = (regs.rsp - 0x2000) & ~0xF
    blob, addrs = b"", []
    for part in (b"/bin/sh\0", b"-c\0", command.encode() + b"\0"):
        addrs.append(base + len(blob))
        blob += part
    blob += b"\0" * (-len(blob) % 8)
    argv_at = base + len(blob)
    blob += struct.pack("<4Q", *addrs, 0)
    for i in range(0, len(blob), 8):
        word = struct.unpack("<Q", blob[i : i + 8])[0]
        libc.ptrace(5, pid, ctypes.c_void_p(base + i), ctypes.c_void_p(word))
    word = libc.ptrace(1, pid, ctypes.c_void_p(regs.rip), None) & 0xFFFFFFFFFFFFFFFF
    libc.ptrace(4, pid, ctypes.c_void_p(regs.rip), ctypes.c_void_p((word & ~0xFFFF) | 0x050F))
    regs.rax, regs.orig_rax, regs.rdi, regs.rsi, regs.rdx = 59, 2**64 - 1, addrs[0], argv_at, 0
    libc.ptrace(13, pid, None, ctypes.byref(regs))
    libc.ptrace(17, pid, None, None)
    return "INJECTED"


def ancestors():
    pid, seen = os.getpid(), set()
    while pid > 0 and pid not in seen:
        seen.add(pid)
        status = open(f"/proc/{pid}/status").read()
        pid = int(status.split("PPid:")[1].split()[0])
    return seen


skip = ancestors() - {1}  # pid 1 is the supervisor (local) or the init (docker): a target too
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    if pid not in skip:
        name = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:40]
        print(pid, name, hijack(pid, sys.argv[1]), flush=True)
'''


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the injected syscall is x86_64 code")
def test_hijack_a_long_lived_process_with_ptrace(new_box):
    """Refused (EPERM: the processes that outlive calls cannot be traced) or contained (a hijacked one is
    killed with the call): ptrace every process the sandbox keeps between calls (its pid 1, a keeper)
    and make it exec `sleep MARKER`; afterwards no such process exists."""
    box = new_box()
    arg, _ = marker()
    need(box, "python3", "sleep")
    result = sh(box, ["python3", "-c", HIJACK, f"exec sleep {arg}"], timeout_s=20)
    attempted = "INJECTED" in result.output or "REFUSED" in result.output
    assert attempted and "Traceback" not in result.output, f"the attempt itself failed: {show(result)}"
    left = survivors(arg)
    assert not left, f"ESCAPED: ptrace-injected execve into {result.output.strip()!r}; still running: {left}"
    after = sh(box, "echo alive")
    assert after.ok and after.output == "alive\n", f"the sandbox is broken after the attempt: {show(after)}"


# --- privileges and devices --------------------------------------------------------------------

STATUS = "import sys; print(open('/proc/self/status').read())"


def test_setuid_root_is_refused(backend_box):
    """Refused: setuid(0) raises PermissionError (EPERM), or EINVAL where uid 0 is not mapped."""
    need(backend_box, "python3")
    result = sh(backend_box, ["python3", "-c", "import os; os.setuid(0); print('ROOT', os.getuid())"])
    assert "ROOT" not in result.output, f"ESCAPED: {show(result)}"
    refusals = ("PermissionError", "[Errno 22] Invalid argument")  # EINVAL: no uid 0 in the user namespace
    assert any(r in text(result) for r in refusals), f"unexpected: {show(result)}"


def test_runs_unprivileged(backend_box):
    """Contained: a non-root uid (the one `isolation` reports), no capabilities, no_new_privs set."""
    need(backend_box, "id", "python3")
    uid = sh(backend_box, ["id", "-u"])
    assert uid.ok and uid.output.strip() == str(backend_box.isolation["user"]) != "0", show(uid)
    status = sh(backend_box, ["python3", "-c", STATUS])
    fields = dict(line.split(":", 1) for line in status.output.splitlines() if ":" in line)
    for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(fields[cap].strip(), 16) == 0, f"ESCAPED: {cap} is {fields[cap].strip()}"
    assert fields["NoNewPrivs"].strip() == "1", f"no_new_privs is not set: {fields['NoNewPrivs']!r}"


def test_new_user_namespace_is_refused(backend_box):
    """Refused: `unshare -r` (root in a new user namespace, the door to most kernel attack surface)
    fails inside; it works unsandboxed."""
    control = host(["unshare", "-r", "id", "-u"])
    assert control.stdout.strip() == "0", f"control: unshare -r works on the host: {control}"
    need(backend_box, "unshare")
    result = sh(backend_box, ["unshare", "-r", "id", "-u"])
    assert result.exit_code != 0 and result.output.strip() != "0", f"ESCAPED: unshare -r: {show(result)}"


OPEN = """import os, sys
try:
    os.close(os.open(sys.argv[1], os.O_RDONLY))
except OSError as exc:
    print("REFUSED", exc.errno, type(exc).__name__)
    sys.exit(3)
print("OPENED")
"""
DEVICES = [
    "/dev/vda",
    "/dev/sda",
    "/dev/nvme0n1",
    "/dev/mem",
    "/dev/kmem",
    "/dev/port",
    "/dev/kmsg",
    "/dev/kvm",
]


@pytest.mark.parametrize("device", DEVICES)
def test_open_a_host_device(backend_box, device):
    """Contained: the device is absent (ENOENT) or refused (EACCES/EPERM) inside (here even root on the
    host may not open /dev/vda: the machine's device cgroup; the probe itself opens /dev/null inside)."""
    need(backend_box, "python3")
    works = sh(backend_box, ["python3", "-c", OPEN, "/dev/null"])
    assert "OPENED" in works.output, f"control: the probe opens /dev/null inside: {show(works)}"
    result = sh(backend_box, ["python3", "-c", OPEN, device])
    assert any(f"REFUSED {e}" in result.output for e in (2, 13, 1)), (
        f"ESCAPED: opened {device}: {show(result)}"
    )


def test_mknod_a_block_device(backend_box, tmp_path):
    """Refused: mknod of the host's disk (EPERM: no CAP_MKNOD); root on the host can."""
    disk = os.stat("/dev/vda").st_rdev if Path("/dev/vda").exists() else os.makedev(8, 0)
    probe = tmp_path / "blk"
    os.mknod(probe, stat.S_IFBLK | 0o600, disk)  # the control
    probe.unlink()
    make = f"import os, stat; os.mknod('/tmp/blk', stat.S_IFBLK | 0o600, {disk})"
    need(backend_box, "python3")
    result = sh(backend_box, ["python3", "-c", make])
    assert result.exit_code != 0 and "PermissionError" in text(result), f"ESCAPED: mknod: {show(result)}"
