"""The module tree of an engine's model, read from its source without importing it.

``python -m parity.engines.module_tree FILE.py [FILE.py ...] --package NAME==VERSION --out TREE.json``
records, for every class in the files, the sub-modules its methods assign (``self.attn = Cls(...)``,
``self.layers = make_layers(n, lambda prefix: Cls(...))``, ``nn.ModuleList([Cls(...) ...])``), the
builder methods that return one class (``def _build_attn(self): return Cls(...)``: a sub-class that
overrides the builder holds another class under the same name), the module-level aliases
(``Layer = CudaLayer if _is_cuda else CpuLayer``: the first is the CUDA choice) and the sha256 of each
file. :func:`resolve_path` walks a dotted module path through the tree. Engines that cannot be installed on these machines (vLLM, SGLang: CUDA
builds) are checked this way: a probe table (``vllm_map.py``) must resolve, attribute by attribute,
in the tree of the pinned version (tests/parity/test_engine_maps.py). Facts only: names and the
classes they hold, no code."""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
from pathlib import Path
from typing import Any


def _callee(node: ast.AST) -> str | None:
    """The class (or factory) a call constructs: ``Cls(...)`` / ``mod.Cls(...)`` / ``factory(...)(...)``."""
    if not isinstance(node, ast.Call):
        return None
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr if not (isinstance(f.value, ast.Name) and f.value.id == "self") else f"self.{f.attr}"
    if isinstance(f, ast.Call):   # _select_cls(config)(...): the factory's name stands for the class
        inner = _callee(f)
        return f"{inner}()" if inner else None
    return None


def _held(node: ast.AST) -> tuple[str | None, bool]:
    """(class, is_list) of an assigned value."""
    name = _callee(node)
    if name in ("make_layers", "make_pp_layers", "ModuleList") and isinstance(node, ast.Call):
        for sub in ast.walk(node):
            if sub is not node and isinstance(sub, ast.Call):
                inner = _callee(sub)
                if inner and inner[0].isupper():
                    return inner, True
        return None, True
    return name, False


def _builders(cls: ast.ClassDef) -> dict[str, str]:
    """Methods of the class whose every return is one capitalized class's call."""
    out = {}
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef):
            made = {_callee(r.value) for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None}
            if len(made) == 1 and (name := made.pop()) and name[0].isupper():
                out[fn.name] = name
    return out


def aliases_of(source: str) -> dict[str, list[str]]:
    """Module-level ``Name = Cls`` / ``Name = A if cond else B`` of classes (in source order)."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            v = node.value
            picks = [v.body, v.orelse] if isinstance(v, ast.IfExp) else [v]
            names = [x.id for x in picks if isinstance(x, ast.Name) and x.id[0].isupper()]
            if names and len(names) == len(picks):
                out[node.targets[0].id] = names
    return out


def classes_of(source: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for cls in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)):
        attrs: dict[str, dict[str, Any]] = {}
        for node in ast.walk(cls):
            if not isinstance(node, ast.Assign):
                continue
            held, is_list = _held(node.value)
            if held is None:
                continue
            targets = [t for tgt in node.targets for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])]
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    if is_list and len(targets) > 1 and t.attr.startswith(("start", "end")):
                        continue   # start, end, layers = make_layers(...) (or layers, start, end): the list
                    entry = attrs.setdefault(t.attr, {"classes": [], "list": is_list})
                    if held not in entry["classes"]:
                        entry["classes"].append(held)
        out[cls.name] = {"bases": [ast.unparse(b) for b in cls.bases], "attrs": attrs, "builders": _builders(cls)}
    return out


def _mro(tree: dict[str, Any], cls: str) -> list[str]:
    """The class and its bases known to the tree, depth first (enough for these trees' mixins)."""
    seen: list[str] = []
    todo = [cls]
    while todo:
        c = todo.pop(0)
        if c in tree["classes"] and c not in seen:
            seen.append(c)
            todo[:0] = [b.split(".")[-1] for b in tree["classes"][c]["bases"]]
    return seen


def resolve_path(tree: dict[str, Any], root: str, path: str, factories: dict[str, str] | None = None) -> str:
    """The class held at ``path`` (dots; a digit steps into a list) under class ``root``.

    An attribute is looked up through the class's bases; a builder call (``self._build_x``) is
    resolved on the class that holds the attribute (an override wins), an alias takes its first
    (CUDA) class, and ``factories`` names the class of a factory the source does not spell out.
    Raises ``LookupError`` naming the step that does not resolve."""
    factories = factories or {}
    aliases = tree.get("aliases", {})
    cls = root
    for step in path.split("."):
        if step.isdigit():
            continue
        mro = _mro(tree, cls)
        entry = next((tree["classes"][c]["attrs"][step] for c in mro if step in tree["classes"][c]["attrs"]), None)
        if entry is None:
            raise LookupError(f"{cls} (bases {mro[1:]}) has no sub-module {step!r} (path {path})")
        held = []
        for c in entry["classes"]:
            if c.startswith("self.") and c[5:] not in factories:
                c = next((tree["classes"][m]["builders"][c[5:]] for m in mro
                          if c[5:] in tree["classes"][m].get("builders", {})), c)
            c = factories.get(c, c)
            held.append(aliases.get(c, [c])[0])
        known = [c for c in held if c in tree["classes"]]
        cls = known[0] if known else held[0]
    return cls


def build_tree(files: list[Path], package: str, root: Path) -> dict[str, Any]:
    classes: dict[str, Any] = {}
    aliases: dict[str, list[str]] = {}
    sources = {}
    for f in files:
        text = f.read_text(encoding="utf-8")
        sources[str(f.resolve().relative_to(root.resolve()))] = hashlib.sha256(text.encode()).hexdigest()
        for name, c in classes_of(text).items():
            classes.setdefault(name, c)
        for name, a in aliases_of(text).items():
            aliases.setdefault(name, a)
    return {"package": package, "files": sources, "classes": classes, "aliases": aliases}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity.engines.module_tree", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--package", required=True, help="NAME==VERSION the files come from")
    p.add_argument("--root", default=".", help="paths are recorded relative to this directory")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    tree = build_tree([Path(f) for f in a.files], a.package, Path(a.root))
    Path(a.out).write_text(json.dumps(tree, indent=1, sort_keys=True) + "\n")
    print(f"wrote {a.out}: {len(tree['classes'])} classes from {len(tree['files'])} files of {a.package}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
