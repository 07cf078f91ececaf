"""What users read resolves: relative links in the README and docs point at files in the
repository, and neither the docs nor ``--help`` cite internal references (issue or seed
numbers, the project's planning folder) that no user can follow."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from pmemwal.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # (docs/notes: a log)
LINK = re.compile(r"\]\(([^)\s]+)\)")
INTERNAL = re.compile(r"\bissue \d+|\bseed \d{3}\b|\.\./shared/", re.IGNORECASE)


def _relative_links(doc: Path) -> list[str]:
    return [t for t in LINK.findall(doc.read_text())
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = [t for t in _relative_links(doc) if not (doc.parent / t.split("#")[0]).exists()]
    assert not broken, f"{doc.name}: {broken}"


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_the_docs_cite_no_internal_reference(doc: Path) -> None:
    assert not INTERNAL.findall(doc.read_text()), doc.name


def _commands(group: click.Group, ctx: click.Context):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        sub = click.Context(command, info_name=name, parent=ctx)
        yield name, command.get_help(sub)
        if isinstance(command, click.Group):
            yield from _commands(command, sub)


def test_help_cites_no_internal_reference() -> None:
    ctx = click.Context(main, info_name="pmemwal")
    helps = dict(_commands(main, ctx))
    assert "bench" in helps and "powerloss" in helps  # (the walk sees every command)
    cited = {name: INTERNAL.findall(text) for name, text in helps.items() if INTERNAL.search(text)}
    assert not cited
