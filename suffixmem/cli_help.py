"""How the command line's help reads: Typer's rich help keeps a docstring's line breaks, so a
docstring wrapped at 100 columns would show lines cut mid-sentence, in the command list above
all. ``unwrap_help`` gives each command its docstring with every paragraph joined."""

from __future__ import annotations

import inspect

import typer


def _paragraphs(doc: str) -> str:
    """``doc`` with each paragraph's lines joined: Typer's rich help keeps a docstring's line
    breaks, so a docstring wrapped at 100 columns would show broken lines. List items and
    indented lines keep their own line."""
    out = []
    for para in inspect.cleandoc(doc).split("\n\n"):
        lines: list[str] = []
        for line in para.splitlines():
            if lines and not line.startswith((" ", "-", "*", "|")):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line)
        out.append("\n".join(lines))
    return "\n\n".join(out)


def unwrap_help(typer_app: typer.Typer) -> None:
    """Give every command of ``typer_app`` (sub-apps included) a help text built from its
    docstring by ``_paragraphs``, unless it names its own."""
    for info in typer_app.registered_commands:
        if info.help is None and info.callback is not None and info.callback.__doc__:
            info.help = _paragraphs(info.callback.__doc__)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            unwrap_help(group.typer_instance)
