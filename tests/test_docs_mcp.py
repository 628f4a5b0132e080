"""docs/mcp.md says what the code does (issue 37): the tool count, the datasette-mcp names and
whether the stdio server's access lines need ``-v``."""

import re
import subprocess
import sys
from pathlib import Path

from groundkit_datasette.surfaces.tools import BUILTIN_TOOLS

MCP_MD = (Path(__file__).resolve().parent.parent / "docs" / "mcp.md").read_text()
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
           "nine": 9, "ten": 10}


def test_every_count_of_the_tools_is_the_tool_tables():
    counts = re.findall(r"\b(\w+) tools\b", MCP_MD, flags=re.IGNORECASE)
    said = [NUMBERS[c.lower()] for c in counts if c.lower() in NUMBERS or c.isdigit()]
    assert said, "docs/mcp.md no longer counts the tools: drop this test"
    assert set(said) == {len(BUILTIN_TOOLS)}, said


def test_the_datasette_mcp_list_names_every_builtin_tool():
    section = MCP_MD.split("## Inside datasette-mcp", 1)[1]
    listed = set(re.findall(r"`groundkit_(\w+)`", section)) - {"name"}
    assert listed == {tool.name for tool in BUILTIN_TOOLS}


def test_stdio_access_lines_need_no_flag_as_the_doc_says(tmp_path):
    assert "on without any flag" in MCP_MD and "Use `groundkit -v mcp ...` to log" not in MCP_MD
    messages = [
        '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
        '"capabilities":{},"clientInfo":{"name":"t","version":"0"}}}',
        '{"jsonrpc":"2.0","method":"notifications/initialized"}',
        '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_collections","arguments":{}}}',
        "[1]",
    ]
    code = "from groundkit_datasette.cli import main; main()"
    result = subprocess.run([sys.executable, "-c", code, "mcp", "--index-dir", str(tmp_path)],
                            input="\n".join(messages) + "\n", capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert any("surface=mcp-stdio tool=list_collections status=200" in line for line in lines), lines
    assert any("surface=mcp-stdio refused" in line and "request_id=" in line for line in lines), lines
