"""Every name a labkit module (or script) reads as a global is defined there or is a builtin.

Catches, without running anything, the NameError that `labkit bench all` hit at run time in
labkit.quant.bench (``format_rows`` used, never imported): a path no unit test executes."""

from __future__ import annotations

import builtins
import symtable
from pathlib import Path

import pytest

import labkit

# Attributes every module has without assigning them.
MODULE_ATTRS = {"__file__", "__name__", "__doc__", "__spec__", "__package__", "__loader__",
                "__path__", "__builtins__", "__annotations__", "__dict__", "__class__"}
ROOT = Path(labkit.__file__).parent.parent
SOURCES = sorted([*(ROOT / "labkit").rglob("*.py"), *(ROOT / "scripts").glob("*.py")])


def undefined_globals(source: str, filename: str = "<src>") -> set[str]:
    """Names read as globals (module level, or from a function or class body) that the
    module never binds (assignment, import, def, class) and that are not builtins."""
    top = symtable.symtable(source, filename, "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    known = bound | set(dir(builtins)) | MODULE_ATTRS
    missing: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for s in table.get_symbols():
            reads_global = s.is_referenced() and (table is top or s.is_global())
            if reads_global and s.get_name() not in known:
                missing.add(s.get_name())
        for child in table.get_children():
            walk(child)
    walk(top)
    return missing


def test_the_check_finds_an_undefined_name():
    src = "import os\n\ndef f(x):\n    y = os.sep\n    return format_rows(x) + y\n\nclass C:\n    z = oops\n"
    assert undefined_globals(src) == {"format_rows", "oops"}
    assert undefined_globals("from a import format_rows\nprint(format_rows, len([]))\n") == set()


def test_no_star_imports_hide_names():
    starred = [p.name for p in SOURCES if "import *" in p.read_text()]
    assert not starred, f"star imports defeat the undefined-name check: {starred}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_defines_every_global_it_reads(path):
    assert undefined_globals(path.read_text(), str(path)) == set()
