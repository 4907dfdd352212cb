"""Tool-name normalisation shared by the adapters: one vocabulary across agent frameworks.

The vocabulary is the one the rule rewarder's coding profile knows (streams/rules/profiles.py, after
the seed's adapter maps): `bash`, `ipython`, `read_file`, `write_file`, `edit_file`, `search`,
`browse_url`, `submit`, `finish`, `think`, `message` (a text reply with no tool), `delegate`.
Any other name passes through lower-cased, so nothing is lost.
"""

from __future__ import annotations

from typing import Any

# Names as the agents write them -> our name. Keys are compared lower-cased.
TOOL_NAMES: dict[str, str] = {
    # shells
    "bash": "bash",
    "run": "bash",
    "execute_bash": "bash",
    "shell": "bash",
    "terminal": "bash",
    "run_command": "bash",
    "execute_command": "bash",
    "run_ipython": "ipython",
    "execute_ipython_cell": "ipython",
    "python": "ipython",
    # files (OpenHands actions, SWE-agent commands, Claude Code tools)
    "read": "read_file",
    "read_file": "read_file",
    "open": "read_file",
    "goto": "read_file",
    "scroll_up": "read_file",
    "scroll_down": "read_file",
    "view": "read_file",
    "notebookread": "read_file",
    "write": "write_file",
    "write_file": "write_file",
    "create": "write_file",
    "create_file": "write_file",
    "edit": "edit_file",
    "edit_file": "edit_file",
    "insert": "edit_file",
    "str_replace": "edit_file",
    "undo_edit": "edit_file",
    "multiedit": "edit_file",
    "notebookedit": "edit_file",
    "apply_patch": "edit_file",
    # search
    "search": "search",
    "search_dir": "search",
    "search_file": "search",
    "find_file": "search",
    "grep": "search",
    "glob": "search",
    "websearch": "search",
    "web_search": "search",
    # web
    "browse": "browse_url",
    "browse_interactive": "browse_url",
    "browser": "browse_url",
    "webfetch": "browse_url",
    "fetch": "browse_url",
    # control
    "submit": "submit",
    "finish": "finish",
    "exit": "finish",
    "exit_forfeit": "finish",
    "think": "think",
    "message": "message",
    "delegate": "delegate",
    "task": "delegate",
}

# Editor tools whose sub-command (`command` param) decides the action.
EDITOR_TOOLS = {"str_replace_editor", "str_replace_based_edit_tool", "text_editor", "edit_tool"}
EDITOR_COMMANDS = {
    "view": "read_file",
    "create": "write_file",
    "str_replace": "edit_file",
    "insert": "edit_file",
    "undo_edit": "edit_file",
}


def normalise_tool(name: str, params: dict[str, Any] | None = None) -> str:
    """Our name for a tool call `name(params)`.

    >>> normalise_tool("execute_bash"), normalise_tool("Read"), normalise_tool("my_tool")
    ('bash', 'read_file', 'my_tool')
    >>> normalise_tool("str_replace_editor", {"command": "view", "path": "/a.py"})
    'read_file'
    """
    lowered = (name or "").strip().lower()
    if lowered in EDITOR_TOOLS:
        command = str((params or {}).get("command", "")).lower()
        return EDITOR_COMMANDS.get(command, "edit_file")
    return TOOL_NAMES.get(lowered, lowered)
