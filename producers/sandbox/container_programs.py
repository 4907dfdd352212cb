"""The programs the Docker sandbox runs inside its container: the wrapper of every tool call and
the search tool's Python.

Every exec is `sh -c WRAPPER agentstream-sandbox OP DIR ARGS...` (an argv; nothing is spliced into
the script). The wrapper runs as the sandbox user (uid 65534). It first resolves DIR and any path
argument inside the container, where the agent's symlinks live (`realpath -m`), and refuses a path
that then leaves /workspace (exit code in `REFUSALS`, a line starting with `REFUSAL_PREFIX` on
stderr); then it runs OP:

- run ARGV...: the command, stdin from /dev/null;
- read PATH LINES LIMIT: a file (LINES "all" or a `sed -n` range "S,Ep"), at most LIMIT bytes;
- write PATH MKDIRS: stdin into the file (parents created when MKDIRS is 1);
- search ROOT PROGRAM PATTERN GLOB: `python3 -I` (the workspace is never on its import path);
- load HAS_TAR: empty /workspace, then extract the tar on stdin, modes kept (reset);
- dump: a tar of /workspace on stdout (snapshot).

Then it SIGKILLs every process in the container except PID 1 (docker-init), the keeper (PID 1's one
child, read at the start, before the command ran) and itself, until none is left, and exits with
OP's exit code. The host checks afterwards that this worked (`Container.leftovers`).

It must not hold Python logic of the tools: `docker.py` decides what to run and what it means.
"""

from __future__ import annotations

__all__ = ["REFUSALS", "REFUSAL_PREFIX", "SEARCH_PY", "WRAPPER"]

# What the wrapper exits with when it refused before running anything (stderr says so too).
REFUSALS = {
    240: "path {path!r} is outside the workspace /workspace (symlinks resolved in the sandbox)",
    241: "path {path!r} cannot be resolved in the sandbox",
    242: "{path!r} is not a directory in the workspace",
    243: "{path!r} is not a file in the workspace",
    244: "the directory of {path!r} does not exist (create_dirs=False)",
}
REFUSAL_PREFIX = "agentstream-sandbox: "
WRAPPER = r"""set -u
keeper=
read -r keeper _ </proc/1/task/1/children || :
say() { printf 'agentstream-sandbox: %s\n' "$2" >&2; exit "$1"; }
inside() {
  r=$(realpath -m -- "$1" && echo .) || say 241 "cannot resolve $1"
  r=${r%??}
  case $r in /workspace|/workspace/*) ;; *) say 240 "$1 is outside the workspace" ;; esac
}
op=$1
inside "$2"; [ -d "$r" ] || say 242 "$2 is not a directory"; cd -- "$r" || exit 242
shift 2
case $op in
run) "$@" </dev/null ;;
read) inside "$1"; [ -f "$r" ] || say 243 "$1 is not a file"
  if [ "$2" = all ]; then head -c "$3" -- "$r"; else sed -n -e "$2" -- "$r" | head -c "$3"; fi ;;
write) inside "$1"; [ "$r" != /workspace ] || say 243 "$1 is the workspace"; d=${r%/*}
  if [ ! -d "$d" ]; then [ "$2" = 1 ] || say 244 "no directory for $1"; mkdir -p -- "$d" || exit 1; fi
  cat >"$r" ;;
search) inside "$1"; python3 -I -S -c "$2" "$r" "$3" "$4" </dev/null ;;
load) chmod -R u+rwX /workspace && find /workspace -mindepth 1 -delete \
  && { [ "$1" = 0 ] || tar -x -p --no-same-owner -f - -C /workspace; } ;;
dump) tar -c -f - -C /workspace . </dev/null ;;
*) say 1 "unknown operation $op" ;;
esac
code=$?
n=0
while [ "$n" -lt 100 ]; do
  n=$((n + 1)); alive=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case $p in 1|"$keeper"|"$$") ;; *) kill -9 "$p" 2>/dev/null && alive=1 ;; esac
  done
  [ -n "$alive" ] || break
done
exit "$code"
"""
# The search tool inside the container (python3 -I: the workspace is never on its import path).
SEARCH_PY = r"""import fnmatch, os, re, sys
root, rx, glob = sys.argv[1], re.compile(sys.argv[2]), sys.argv[3]
def files():
    if os.path.isfile(root) and not os.path.islink(root):
        yield root
        return
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != ".git")
        for name in sorted(names):
            p = os.path.join(d, name)
            if (not glob or fnmatch.fnmatch(name, glob)) and not os.path.islink(p) and os.path.isfile(p):
                yield p
sep = ""
for p in files():
    try:
        if os.path.getsize(p) > 2_000_000:
            continue
        data = open(p, "rb").read()
    except OSError:
        continue
    if b"\0" in data[:8192]:
        continue
    rel = os.path.relpath(p, "/workspace")
    for i, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if rx.search(line):
            sys.stdout.write(f"{sep}{rel}:{i}:{line}")
            sep = "\n"
"""
