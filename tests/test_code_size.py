"""The house's size rules, checked on the source so they hold by themselves: no product module
over 500 lines and no function over 60 lines (a method or a nested function counts on its own,
from its first decorator to its last line). The catalog's migrations are generated history and
stay aside."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.product_code import ROOT, product_files

MODULE_LINES = 500
FUNCTION_LINES = 60


def function_lengths(source: str, filename: str) -> list[tuple[int, str, int]]:
    """(first line, qualified name, lines) of every def and async def in ``source``, nested
    ones and methods included; a function starts at its first decorator."""
    found: list[tuple[int, str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                end = child.end_lineno or child.lineno
                found.append((start, prefix + child.name, end - start + 1))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename), "")
    return found


def offenders(root: Path) -> list[str]:
    """One line per module or function over its limit: ``path:line name: N lines``."""
    wrong = []
    for relative in product_files(root):
        source = (root / relative).read_text()
        lines = len(source.splitlines())
        if lines > MODULE_LINES:
            wrong.append(f"{relative}:1 module: {lines} lines (limit {MODULE_LINES})")
        for line, name, length in function_lengths(source, str(relative)):
            if length > FUNCTION_LINES:
                wrong.append(f"{relative}:{line} {name}: {length} lines (limit {FUNCTION_LINES})")
    return wrong


def test_product_modules_and_functions_keep_to_their_size():
    wrong = offenders(ROOT)
    assert not wrong, "over the size rules:\n" + "\n".join(wrong)


def test_the_checker_sees_long_modules_and_functions(tmp_path: Path):
    def body(indent: str) -> str:
        return "\n".join(f"{indent}x{i} = {i}" for i in range(60))

    package = tmp_path / "tasks" / "inner"
    package.mkdir(parents=True)
    source = [
        "import functools",  # 1
        "",
        "",
        "class Holder:",
        "    @functools.cache",  # 5: the method starts at its decorator
        "    def method(self):",
        body("        "),  # 7-66
        "",
        "",
        "def short():",  # 69
        "    pass",
        "",
        "",
        "async def outer():",  # 73
        "    def inner():",  # 74
        body("        "),  # 75-134
    ]
    (package / "long.py").write_text("\n".join(source) + "\n")
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "big.py").write_text("x = 1\n" * 501)
    (tmp_path / "core" / "fine.py").write_text("x = 1\n" * 500)
    migrations = tmp_path / "schemas" / "catalog" / "migrations"
    migrations.mkdir(parents=True)
    (migrations / "0001_first.py").write_text("x = 1\n" * 600 + f"def upgrade():\n{body('    ')}\n")
    assert offenders(tmp_path) == [
        "core/big.py:1 module: 501 lines (limit 500)",
        "tasks/inner/long.py:5 Holder.method: 62 lines (limit 60)",
        "tasks/inner/long.py:73 outer: 62 lines (limit 60)",
        "tasks/inner/long.py:74 outer.inner: 61 lines (limit 60)",
    ]
