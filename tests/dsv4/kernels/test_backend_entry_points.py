"""Built-in backends register through the same entry-point group a user's backend uses: the registry
imports none of them (no import cycle), and an installed plugin is loaded the same way."""
from __future__ import annotations

import ast
from pathlib import Path

import dsv4.kernels.registry as registry


def test_registry_imports_no_backend_module():
    tree = ast.parse(Path(registry.__file__).read_text())
    imported = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            imported |= {f"{'.' * n.level}{n.module or ''}.{a.name}" for a in n.names}
        elif isinstance(n, ast.Import):
            imported |= {a.name for a in n.names}
    assert not [m for m in imported if "emulated" in m or "cutedsl" in m], imported


def test_builtin_entry_points_match_the_package_metadata():
    import tomllib

    pyproject = tomllib.loads((Path(registry.__file__).parents[2] / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"][registry.ENTRY_POINT_GROUP]
    assert declared == registry.BUILTIN_ENTRY_POINTS
    assert {"emulated", "cutedsl_sm90", "cutedsl_sm100"} <= set(registry.available_backends())
