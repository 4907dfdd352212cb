"""The sandbox tools as an agent sees them: files, shell, search, git, submit, refused paths
(symlinks and hardlinks planted by the agent included), reset, snapshot and close."""

from __future__ import annotations

import os

import pytest

from producers.sandbox.base import TOOLS
from producers.sandbox.errors import SandboxError
from producers.sandbox.local import Limits, LocalSandbox


@pytest.fixture
def box():
    with LocalSandbox(limits=Limits(timeout_s=20)) as sandbox:
        yield sandbox


def test_write_then_read_whole_file_and_line_ranges(box):
    assert box.run("file_write", {"path": "pkg/mod.py", "content": "a\nb\nc\nd\n"}).ok
    assert box.run("file_read", {"path": "pkg/mod.py"}).output == "a\nb\nc\nd\n"
    assert box.run("file_read", {"path": "pkg/mod.py", "start_line": 2, "end_line": 3}).output == "b\nc\n"
    assert box.run("file_read", {"path": "pkg/mod.py", "start_line": 4}).output == "d\n"
    refused = box.run("file_read", {"path": "pkg/mod.py", "start_line": 0})
    assert refused.exit_code == 1 and "start_line" in refused.error


def test_write_without_create_dirs_into_a_missing_directory_fails(box):
    result = box.run("file_write", {"path": "no/such/f.txt", "content": "x", "create_dirs": False})
    assert result.exit_code == 1 and "does not exist" in result.error


def test_reading_a_missing_file_is_an_error_result(box):
    result = box.run("file_read", {"path": "missing.txt"})
    assert result.exit_code == 1 and "missing.txt" in result.error


def test_search_finds_matching_lines_with_file_filter(box):
    box.run("file_write", {"path": "src/a.py", "content": "def foo():\n    return 1\n"})
    box.run("file_write", {"path": "src/b.txt", "content": "foo here\n"})
    assert box.run("search", {"pattern": r"def \w+"}).output == "src/a.py:1:def foo():"
    result = box.run("search", {"pattern": "foo", "path": "src", "file_pattern": "*.txt"})
    assert result.output == "src/b.txt:1:foo here"
    assert box.run("search", {"pattern": "nothing-matches"}).ok


def test_search_with_a_bad_regex_is_refused(box):
    result = box.run("search", {"pattern": "("})
    assert result.exit_code == 1 and "regular expression" in result.error


def test_shell_runs_argv_lists_and_strings_in_the_workspace(box, sandbox_python):
    listed = box.run("shell", {"command": [sandbox_python, "-c", "import os; print(os.getcwd())"]})
    assert listed.ok and listed.output.strip() == str(box.workspace)
    scripted = box.run("shell", {"command": "echo one; echo two >&2; exit 3"})
    assert scripted.exit_code == 3 and "one" in scripted.output and "two" in scripted.output
    assert scripted.error == "command exited with code 3"


def test_shell_str_is_one_sh_argument_and_list_args_are_not_shell_parsed(box):
    box.run("file_write", {"path": "marker", "content": ""})
    listed = box.run("shell", {"command": ["echo", "$(rm marker); `rm marker`"]})
    assert listed.output == "$(rm marker); `rm marker`\n"
    assert box.run("file_read", {"path": "marker"}).ok


def test_shell_work_dir_is_inside_the_workspace(box):
    box.run("file_write", {"path": "sub/x.txt", "content": "x"})
    assert box.run("shell", {"command": ["ls"], "work_dir": "sub"}).output == "x.txt\n"
    refused = box.run("shell", {"command": ["ls"], "work_dir": ".."})
    assert refused.exit_code == 1 and "outside the workspace" in refused.error


def test_git_init_add_and_status(box):
    assert box.run("git", {"subcommand": "init", "args": ["-q"]}).ok
    box.run("file_write", {"path": "README.md", "content": "hi\n"})
    assert box.run("git", {"subcommand": "status", "args": ["--short"]}).output == "?? README.md\n"
    box.run("git", {"subcommand": "add", "args": ["README.md"]})
    assert box.run("git", {"subcommand": "status", "args": ["--short"]}).output == "A  README.md\n"


def test_git_subcommand_that_is_an_option_is_refused(box):
    result = box.run("git", {"subcommand": "-c", "args": ["core.pager=evil", "log"]})
    assert result.exit_code == 1 and "subcommand" in result.error


def test_submit_marks_the_sandbox_submitted(box):
    assert not box.submitted
    result = box.run("submit", {"answer": "done"})
    assert result.ok and box.submitted and box.answer == "done"


def test_unknown_tool_names_the_tool_and_the_known_ones(box):
    result = box.run("rm_rf", {})
    assert result.exit_code == 1 and "'rm_rf'" in result.error
    assert all(tool in result.error for tool in TOOLS)


def test_bad_parameters_are_an_error_result(box):
    result = box.run("file_read", {"pathh": "x"})
    assert result.exit_code == 1 and "file_read" in result.error


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x", "/tmp/x"])
def test_paths_outside_the_workspace_are_refused(box, path):
    for tool, params in [("file_read", {}), ("file_write", {"content": "x"}), ("search", {"pattern": "x"})]:
        result = box.run(tool, {"path": path, **params})
        assert result.exit_code == 1 and "outside the workspace" in result.error, tool
    assert box.run("shell", {"command": "ls -d /x /tmp/x"}).exit_code != 0  # nothing was written


def test_a_symlink_the_agent_plants_pointing_out_is_refused(box):
    planted = box.run(
        "shell", {"command": "echo s3cret > /tmp/secret && ln -s /tmp/secret link && ln -s /tmp dirlink"}
    )
    assert planted.ok, planted.output
    assert "outside the workspace" in box.run("file_read", {"path": "link"}).error
    assert "outside the workspace" in box.run("file_write", {"path": "dirlink/new", "content": "x"}).error
    assert "outside the workspace" in box.run("file_write", {"path": "link", "content": "x"}).error
    assert "outside the workspace" in box.run("shell", {"command": ["ls"], "work_dir": "dirlink"}).error
    assert "s3cret" not in box.run("search", {"pattern": "s3cret"}).output
    assert box.run("shell", {"command": "cat /tmp/secret; ls /tmp"}).output == "s3cret\nsecret\n"


def test_a_symlink_inside_the_workspace_is_followed(box):
    box.run("shell", {"command": "mkdir d && echo in > d/f && ln -s d/f inner && ln -s d dlink"})
    assert box.run("file_read", {"path": "inner"}).output == "in\n"
    assert box.run("file_write", {"path": "dlink/g", "content": "g"}).ok
    assert box.run("file_read", {"path": "d/g"}).output == "g"


def test_a_hardlink_to_a_file_outside_the_workspace_cannot_be_made(box):
    """The workspace is a mount of its own: a hardlink into it from /tmp, /etc or /usr is refused
    by the kernel, so no file outside can be reached through one."""
    for source in ("/tmp/t", "/etc/passwd", "/usr/bin/python3"):
        made = box.run("shell", {"command": f"touch /tmp/t; ln {source} hard"})
        assert made.exit_code != 0 and "ln:" in made.output, (source, made.output)
    assert box.run("shell", {"command": "ls -A"}).output == ""


def test_output_is_truncated_with_a_marker(sandbox_python):
    with LocalSandbox(limits=Limits(output_bytes=100)) as box:
        result = box.run("shell", {"command": [sandbox_python, "-c", "print('x' * 10_000)"]})
    assert result.output.startswith("x" * 100) and "truncated at 100 bytes" in result.output
    assert len(result.output) < 200


def test_reset_from_a_host_dir_snapshot_and_close(tmp_path):
    seed = tmp_path / "seed"
    (seed / "bin").mkdir(parents=True)
    (seed / "a.txt").write_text("seed\n")
    (seed / "bin" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (seed / "bin" / "run.sh").chmod(0o755)
    os.symlink("a.txt", seed / "alias")
    box = LocalSandbox()
    box.reset(seed)
    assert box.run("file_read", {"path": "alias"}).output == "seed\n"
    assert box.run("shell", {"command": ["bin/run.sh"]}).output == "ran\n"  # the mode came in
    box.run("file_write", {"path": "b.txt", "content": "new"})
    box.run("shell", {"command": "chmod 640 b.txt; ln -s /etc/passwd out; ln -s b.txt in; ln b.txt hard"})
    box.run("submit", {})
    copy = box.snapshot(tmp_path / "copy")
    assert sorted(p.name for p in copy.iterdir()) == [
        "a.txt",
        "alias",
        "b.txt",
        "bin",
        "hard",
        "in",
    ]  # no `out`
    assert (copy / "hard").read_text() == "new"
    assert os.readlink(copy / "in") == "b.txt" and (copy / "b.txt").stat().st_mode & 0o777 == 0o640
    assert os.access(copy / "bin" / "run.sh", os.X_OK)
    box.reset()
    assert box.run("shell", {"command": "ls -A"}).output == "" and not box.submitted
    box.close()
    closed = box.run("shell", {"command": ["true"]})
    assert closed.exit_code == 1 and "closed" in closed.error


def test_a_snapshot_target_that_exists_is_refused(box, tmp_path):
    with pytest.raises(SandboxError, match="already exists"):
        box.snapshot(tmp_path)


def test_a_reset_from_a_missing_dir_is_refused(box, tmp_path):
    with pytest.raises(SandboxError, match="not a directory"):
        box.reset(tmp_path / "nope")


def test_a_big_workspace_goes_in_and_out_intact(tmp_path):
    seed = tmp_path / "seed"
    (seed / "many").mkdir(parents=True)
    blob = os.urandom(20 * 1024 * 1024)
    (seed / "blob.bin").write_bytes(blob)
    for i in range(300):
        (seed / "many" / f"f{i}.txt").write_text(f"{i}\n")
    with LocalSandbox() as box:
        box.reset(seed)
        counted = box.run("shell", {"command": "ls many | wc -l; stat -c %s blob.bin"}).output.split()
        assert counted == ["300", str(len(blob))]
        copy = box.snapshot(tmp_path / "copy")
    assert (copy / "blob.bin").read_bytes() == blob and len(list((copy / "many").iterdir())) == 300


def test_a_fifo_the_agent_made_does_not_hang_the_file_tools(box):
    assert box.run("shell", {"command": "mkfifo pipe && echo text > plain"}).ok
    assert "not a regular file" in box.run("file_write", {"path": "pipe", "content": "x"}).error
    assert "not a file" in box.run("file_read", {"path": "pipe"}).error
    assert box.run("search", {"pattern": "text"}).output == "plain:1:text"
