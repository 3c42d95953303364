"""Nothing Shoal runs passes through a shell it builds from strings.

Job scripts, names, arguments, image names and probe commands reach processes only as argv
lists. This test reads every module under src/shoal and refuses the ways a string becomes a
shell command line: ``shell=True``, ``os.system``/``os.popen``, ``subprocess.getoutput``,
``asyncio.create_subprocess_shell``, and argv literals that start ``sh -c`` / ``bash -c``.
(The ``#!/bin/sh`` line sbatch --wrap writes heads the user's own script, run as the user.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import shoal

SRC = Path(shoal.__file__).parent
SHELL_FUNCS = {("os", "system"), ("os", "popen"), ("subprocess", "getoutput"), ("subprocess", "getstatusoutput"),
               ("asyncio", "create_subprocess_shell")}
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/sh", "/usr/bin/bash", "zsh", "dash"}


def shell_uses(source: str, filename: str = "<src>") -> list[str]:
    """Each place in ``source`` where a command line may go through a shell, as 'file:line: what'."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    found.append(f"{filename}:{node.lineno}: shell={ast.unparse(kw.value)}")
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in SHELL_FUNCS:
                found.append(f"{filename}:{node.lineno}: {f.value.id}.{f.attr}()")
            if isinstance(f, ast.Name) and f.id in {"system", "popen", "getoutput", "create_subprocess_shell"}:
                found.append(f"{filename}:{node.lineno}: {f.id}()")
        if isinstance(node, (ast.List, ast.Tuple)):
            words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            for a, b in zip(words, words[1:]):
                if a in SHELLS and b == "-c":
                    found.append(f"{filename}:{node.lineno}: [{a!r}, '-c', ...]")
    return found


def test_no_module_runs_a_command_through_a_shell():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        found += shell_uses(path.read_text(encoding="utf-8"), str(path.relative_to(SRC.parent)))
    assert not found, "commands must be argv lists, never shell strings:\n" + "\n".join(found)


def test_the_check_finds_each_way_in():
    source = """
import os, subprocess, asyncio
from os import system
subprocess.run(cmd, shell=True)
subprocess.Popen(cmd, shell=flag)
subprocess.run(["ls"], shell=False)
os.system("ls " + name)
os.popen(cmd)
system(cmd)
subprocess.getoutput(cmd)
asyncio.create_subprocess_shell(cmd)
subprocess.Popen(["sh", "-c", script])
argv = ("/bin/bash", "-c", f"echo {name}")
"""
    found = shell_uses(source)
    assert sorted(f.split(": ", 1)[1] for f in found) == sorted([
        "shell=True", "shell=flag", "os.system()", "os.popen()", "system()", "subprocess.getoutput()",
        "asyncio.create_subprocess_shell()", "['sh', '-c', ...]", "['/bin/bash', '-c', ...]"])
