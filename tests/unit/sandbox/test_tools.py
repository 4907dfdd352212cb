"""The sandbox tools as an agent sees them: files, shell, search, git, submit, and refused paths."""

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
    assert (box.workspace / "marker").exists()


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


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x"])
def test_paths_outside_the_workspace_are_refused(box, path):
    for tool, params in [("file_read", {}), ("file_write", {"content": "x"}), ("search", {"pattern": "x"})]:
        result = box.run(tool, {"path": path, **params})
        assert result.exit_code == 1 and "outside the workspace" in result.error, tool
    assert not (box.workspace.parent / "x").exists()


def test_a_symlink_pointing_out_of_the_workspace_is_refused(box, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    os.symlink(secret, box.workspace / "link")
    os.symlink(tmp_path, box.workspace / "dirlink")
    assert "outside the workspace" in box.run("file_read", {"path": "link"}).error
    assert "outside the workspace" in box.run("file_write", {"path": "dirlink/new", "content": "x"}).error
    assert not (tmp_path / "new").exists()
    assert "s3cret" not in box.run("search", {"pattern": "s3cret"}).output


def test_output_is_truncated_with_a_marker(sandbox_python):
    with LocalSandbox(limits=Limits(output_bytes=100)) as box:
        result = box.run("shell", {"command": [sandbox_python, "-c", "print('x' * 10_000)"]})
    assert result.output.startswith("x" * 100) and "truncated at 100 bytes" in result.output
    assert len(result.output) < 200


def test_reset_snapshot_and_close(tmp_path):
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "a.txt").write_text("seed\n")
    box = LocalSandbox()
    box.reset(seed)
    assert box.run("file_read", {"path": "a.txt"}).output == "seed\n"
    box.run("file_write", {"path": "b.txt", "content": "new"})
    box.run("submit", {})
    copy = box.snapshot(tmp_path / "copy")
    assert sorted(p.name for p in copy.iterdir()) == ["a.txt", "b.txt"]
    box.reset()
    assert list(box.workspace.iterdir()) == [] and not box.submitted
    box.close()
    assert not box.workspace.exists()
    assert box.run("shell", {"command": ["true"]}).exit_code == 1


def test_a_root_the_sandbox_user_cannot_traverse_is_refused_up_front(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root drops to uid 65534; as this user the workspace is always reachable")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(SandboxError, match="not traversable by uid 65534"):
        LocalSandbox(root=private)
    assert list(private.iterdir()) == []
