"""The product's modules, as the house rules on code see them (tests/test_code_size.py,
tests/test_code_notes.py): the product packages and the deployment recipes' scripts under
infra/ (shipped and run as they are), the catalog's migrations (generated history) aside."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "core",
    "sapiens",
    "storage",
    "schemas",
    "tasks",
    "publish",
    "flows",
    "api",
    "cli",
    "infra",
)
EXEMPT = (Path("schemas/catalog/migrations"),)


def product_files(root: Path) -> list[Path]:
    """Every product module below ``root``, migrations aside, as paths relative to ``root``."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if not any(relative.is_relative_to(exempt) for exempt in EXEMPT):
                found.append(relative)
    return found
