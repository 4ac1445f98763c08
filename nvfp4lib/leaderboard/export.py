"""One-file leaderboard submissions, exported from nvfp4lib's own source.

The leaderboard takes a single Python file that defines ``custom_kernel(data)``; nothing of this
package is installed there. ``python -m nvfp4lib.leaderboard.export --path hybrid --out submission.py``
writes such a file for one kernel path. Its code is not a hand-kept copy: starting from the path's
entry function, the exporter follows every module-level name the code uses (through
``from nvfp4lib.x import y``, relative and function-local imports included), takes the defining
statements' source from the package as it is now, and lays them out module by module in import
order, with the third-party imports at the top. A name clash between modules, a name that cannot
be found, or a reference to the package itself stops the export with an error that names it, and
the finished file is checked to refer to no undefined name before it is written.

The CuTe and hybrid files choose their kernel once, at import time, so that no timed call pays for
probing or compiling: they inline `nvfp4lib.leaderboard.runtime` (the code that runs in a
submission, kept apart from this exporter) and, for each path they may run, the registry's own
`unavailable` and `build` functions from `nvfp4lib.paths`. The choice is `fallback.first_working`'s,
the dispatcher's chooser: the file's path, then the rest of `paths.FILE_FALLBACK_ORDER`, the first that
can run here, builds and passes its self-check. With ``--standalone`` (`STANDALONE`) a file holds the
path's kernel alone, built by the registry's `unchecked` builder: no validation, self-check or
fallback, for a competitor to edit. `sections` reads a generated file's sections back.

A class comes with its fields, class attributes and dunders, and each method or property whose name the inlined
code uses as an attribute (``x.name``) or a string (``hasattr(x, "name")``); a member brings what it uses, until
nothing new is read. Sound for this package, which never reaches a member by a computed name.

Rendering: statements keep their source, comments and layout (one blank line between definitions). A module's
section opens with one line, `RULE`, its file and its docstring's first paragraph (cut with " ..." to fit); each
docstring is one line, its first sentence (cut likewise), as the file's header says."""

from __future__ import annotations

import argparse
import ast
import builtins
import functools
import importlib
import importlib.util
import inspect
import os
import re
import symtable
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import nvfp4lib
from nvfp4lib.paths import FILE_FALLBACK_ORDER, IN_A_FILE, PATHS, TRANSPOSED_STREAMS
from nvfp4lib.scaled_mm import describe_backend
from nvfp4lib.leaderboard.runtime import choose_kernel
from nvfp4lib.leaderboard.submission_file import DIRECTIVE, PACKAGE

TASK_IMPORT = "from task import input_t, output_t"


class ExportError(RuntimeError):
    """The submission file cannot be built; the message says which name or path is at fault."""


# ---------------------------------------------------------------------------------------------
# The paths


@dataclass(frozen=True)
class ExportPath:
    """What `custom_kernel` runs: ``entry(data, **kwargs)``; or, with `candidates`, the kernel that
    `runtime.choose_kernel` picks from those paths, once, at import."""

    entry: Callable
    summary: str
    kwargs: dict = field(default_factory=dict)
    candidates: tuple[str, ...] = ()
    needs_cuda: bool = False  # its own kernel needs a CUDA GPU (elsewhere the file runs its fallback)
    standalone: bool = False  # `entry()` builds the kernel alone, nothing checked; the file declares NEEDS_CUDA


def _with_fallback(first: str | None = None) -> tuple[str, ...]:
    """`first`, then the paths of paths.FILE_FALLBACK_ORDER that are not of its family (the name's first
    word; all of them without `first`): the order the file tries at import."""
    rest = tuple(p for p in FILE_FALLBACK_ORDER if first is None or p.split("_")[0] != first.split("_")[0])
    return ((first,) if first else ()) + rest


HYBRID = "hybrid"
HYBRID_SUMMARY = ("the dispatcher's choice without a measured table: the first path of the fallback order that "
                  f"passes its self-check here ({', '.join(FILE_FALLBACK_ORDER)})")


def export_path(name: str, standalone: bool = False) -> ExportPath:
    """How the file for `name` (an exportable path of nvfp4lib.paths, or "hybrid") runs its path; with
    `standalone`, the path's kernel alone (its registry's `unchecked` builder)."""
    if standalone:
        unchecked = PATHS[name].unchecked if name in PATHS else None
        if unchecked is None:
            raise ExportError(f"--standalone: only for {', '.join(STANDALONE)}, not {name!r}")
        return ExportPath(unchecked, f"{PATHS[name].summary}; the kernel, its launch and custom_kernel alone (no "
                          "input validation, no self-check, no fallback), to edit", standalone=True)
    if name == HYBRID:
        return ExportPath(choose_kernel, HYBRID_SUMMARY, candidates=_with_fallback())
    path = PATHS[name]
    if name.startswith("cute_"):
        return ExportPath(choose_kernel, f"{path.summary}; compiled and self-checked at import (needs a CUDA "
                          "GPU; else, or if it fails, the fallback order)", candidates=_with_fallback(name),
                          needs_cuda=True)
    fn = path.build()
    if isinstance(fn, functools.partial):
        return ExportPath(fn.func, path.summary, kwargs=dict(fn.keywords))
    return ExportPath(fn, path.summary)


EXPORTS = tuple(name for name, path in PATHS.items() if path.exportable) + (HYBRID,)
"""What `--path` takes: the exportable paths of nvfp4lib.paths, and "hybrid"."""
STANDALONE = tuple(name for name in EXPORTS if name in PATHS and PATHS[name].unchecked is not None)
"""What `--path` takes with `--standalone`: the paths with a kernel that runs alone."""
MAX_STREAMS = 64  # --streams: more would only add host cost (each stream is a CUDA stream of the pool)


# ---------------------------------------------------------------------------------------------
# Following names through the package


def _is_package_module(name: str | None) -> bool:
    return name is not None and (name == PACKAGE or name.startswith(PACKAGE + "."))


def _package_target(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    """The nvfp4lib module an ImportFrom reads from (relative imports resolved), or None."""
    if node.level:
        parts = module.split(".")
        base = parts[:len(parts) - node.level + is_package]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module if _is_package_module(node.module) else None


def _bound_names(stmt: ast.stmt) -> set[str]:
    """Names a top-level statement binds (not looking inside function or class bodies)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    names = set()
    for node in ast.iter_child_nodes(stmt):
        if isinstance(node, ast.stmt):
            names |= _bound_names(node)
        elif isinstance(node, ast.excepthandler):
            names |= {node.name} if node.name else set()
            for inner in node.body:
                names |= _bound_names(inner)
        else:
            names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return names


def _global_references(source: str) -> set[str]:
    """Module-level names that a piece of top-level code reads (in any nested scope)."""
    found = set()

    def walk(table):
        for sym in table.get_symbols():
            if (sym.is_referenced() if table.get_type() == "module" else sym.is_global()):
                found.add(sym.get_name())
        for child in table.get_children():
            walk(child)

    walk(symtable.symtable(source, "<inlined>", "exec"))
    return found


def _is_main_guard(stmt: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (a command line, never part of a submission)."""
    test = getattr(stmt, "test", None)
    return (isinstance(stmt, ast.If) and isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__")


def _is_import_block(stmt: ast.stmt) -> bool:
    """A top-level try/if whose job is importing (e.g. an optional dependency with a fallback)."""
    return isinstance(stmt, (ast.Try, ast.If)) and any(
        isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(stmt))


class _Module:
    """One nvfp4lib module's top level, indexed by the names it binds."""

    def __init__(self, name: str):
        self.name = name
        try:
            module = importlib.import_module(name)
        except ImportError as err:
            raise ExportError(f"cannot inline from {name}: {err}") from err
        self.is_package = hasattr(module, "__path__")
        self.file = name.replace(".", "/") + ("/__init__.py" if self.is_package else ".py")
        self.lines = inspect.getsource(module).splitlines()
        tree = ast.parse("\n".join(self.lines))
        self.docstring = ast.get_docstring(tree) or ""
        self.body = tree.body
        self.statements: dict[str, list[ast.stmt]] = {}  # name -> the statements binding it
        self.imports: dict[str, tuple] = {}  # name -> (module or None, name, asname): not nvfp4lib
        self.from_package: dict[str, tuple[str, str]] = {}  # name -> (nvfp4lib module, its name there)
        self.requires: list[str] = []  # nvfp4lib modules imported at top level (they run first)
        for stmt in tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                self._index_import(stmt)
            elif not (_is_docstring(stmt) or _is_main_guard(stmt)):
                names = _bound_names(stmt)
                if not names:
                    raise ExportError(f"{self.file}:{stmt.lineno}: a top-level statement that binds no name cannot "
                                      f"be inlined (it would only run for its side effect); move it into a function")
                for name in names:
                    self.statements.setdefault(name, []).append(stmt)

    def _index_import(self, stmt: ast.Import | ast.ImportFrom) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                bound = alias.asname or alias.name.split(".")[0]
                if _is_package_module(alias.name):
                    self.from_package[bound] = (PACKAGE, "")  # the package object itself
                else:
                    self.imports[bound] = (None, alias.name, alias.asname)
            return
        if stmt.module == "__future__":
            return
        target = _package_target(self.name, self.is_package, stmt)
        for alias in stmt.names:
            if target is None:
                self.imports[alias.asname or alias.name] = (stmt.module, alias.name, alias.asname)
            elif alias.asname and alias.asname != alias.name:
                raise ExportError(f"{self.file}:{stmt.lineno}: 'import {alias.name} as {alias.asname}' from "
                                  f"{target}: a renamed import cannot be inlined; import the name as it is")
            else:
                self.from_package[alias.name] = (target, alias.name)
        if target is not None and target not in self.requires:
            self.requires.append(target)

    def first_line(self, node: ast.stmt) -> int:
        """Where a definition's text starts: its decorators and the comment lines right above it."""
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        while first > 1 and self.lines[first - 2].lstrip().startswith("#"):
            first -= 1
        return first

    def text(self, stmt: ast.stmt, drop=()) -> tuple[str, list[tuple[str, str]]]:
        """The statement's source (with its decorators, the comment lines right above it and an
        attribute docstring right below), minus function-local nvfp4lib imports, which are
        returned as (module, name) pairs to inline instead, and minus the class members of `drop`."""
        first = self.first_line(stmt)
        last = stmt.end_lineno
        following = self.body[self.body.index(stmt) + 1:][:1]
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and following and _is_docstring(following[0]):
            last = following[0].end_lineno
        lines = {n: self.lines[n - 1] for n in range(first, last + 1)}
        for member in drop:
            _drop_lines(lines, self.first_line(member), member.end_lineno)
        needed = []
        for parent in _walk(stmt, drop):
            for body in (getattr(parent, f, None) for f in ("body", "orelse", "finalbody")):
                for node in body if isinstance(body, list) else ():
                    target = self._local_package_import(node)
                    if target is None or node is stmt:
                        continue
                    needed += [(target, alias.name) for alias in node.names]
                    for n in range(node.lineno, node.end_lineno + 1):
                        del lines[n]
                    if not lines.get(node.end_lineno + 1, "x").strip():  # and the blank line after it
                        del lines[node.end_lineno + 1]
                    if len(body) == 1:  # the import was the whole block: keep the block valid
                        lines[node.lineno] = " " * node.col_offset + "pass"
        for node in _walk(stmt, drop):
            if isinstance(node, _DEFINITIONS) and _is_docstring(node.body[0]):
                _drop_docstring(lines, node.body[0], alone=len(node.body) == 1)
        for doc in following if last > stmt.end_lineno else ():
            _drop_docstring(lines, doc, alone=False)
        return "\n".join(lines[n] for n in sorted(lines)), needed

    def _local_package_import(self, node) -> str | None:
        """The nvfp4lib module a function-local import reads from; None for other statements."""
        if isinstance(node, ast.Import) and any(_is_package_module(a.name) for a in node.names):
            raise ExportError(f"{self.file}:{node.lineno}: inside a function only 'from {PACKAGE}.x import y' "
                              f"can be inlined")
        if not isinstance(node, ast.ImportFrom):
            return None
        target = _package_target(self.name, self.is_package, node)
        if target is not None and any(a.asname for a in node.names):
            raise ExportError(f"{self.file}:{node.lineno}: a renamed import cannot be inlined")
        return target


def _walk(node: ast.AST, skip=()):
    """`ast.walk`, not entering the nodes of `skip`."""
    todo = [node]
    while todo:
        node = todo.pop(0)
        if node not in skip:
            yield node
            todo.extend(ast.iter_child_nodes(node))


def _drop_lines(lines: dict[int, str], first: int, last: int) -> None:
    """Remove lines `first` to `last` of a statement's text, and the blank line that then doubles another (or
    ends the text)."""
    for n in range(first, last + 1):
        lines.pop(n, None)
    before = [n for n in lines if n < first]
    after = [n for n in lines if n > last]
    if after and before and not lines[min(after)].strip() and not lines[max(before)].strip():
        del lines[min(after)]
    while not after and before and not lines[before[-1]].strip():
        del lines[before.pop()]


def _members(cls: ast.ClassDef) -> dict[str, ast.stmt]:
    """The methods and properties of a class a file may leave out: all but the dunders (``__init__``,
    ``__call__``, ``__post_init__``, ...), which Python calls by itself."""
    return {node.name: node for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not (node.name.startswith("__") and node.name.endswith("__"))}


def _attribute_names(source: str) -> set[str]:
    """The attribute names a piece of code may read: every ``x.name``, and every string constant that is an
    identifier (``hasattr(x, "name")``, ``getattr(x, "name", None)``)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            names.add(node.value)
    return names


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _drop_docstring(lines: dict[int, str], doc: ast.Expr, alone: bool) -> None:
    """Leave the docstring out (and a blank line right after it); one that is its block's whole body stays, as one
    line: its first sentence, cut to the line (" ..." marks a cut)."""
    if not alone:
        _drop_lines(lines, doc.lineno, doc.end_lineno)
        if not lines.get(doc.end_lineno + 1, "x").strip():
            del lines[doc.end_lineno + 1]
        return
    text = " ".join(doc.value.value.split())
    if doc.lineno == doc.end_lineno or "\\" in text or '"""' in text:
        return  # already one line, or escapes that a rewrite could change
    sentence = re.split(r"(?<=\.)\s+(?=[A-Z])", text)[0]
    for n in range(doc.lineno + 1, doc.end_lineno + 1):
        del lines[n]
    indent = " " * doc.col_offset
    lines[doc.lineno] = f'{indent}"""{textwrap.shorten(sentence, 114 - len(indent), placeholder=" ...")}"""'


def _import_line(item: tuple) -> str:
    module, name, asname = item
    line = f"import {name}" if module is None else f"from {module} import {name}"
    return line + (f" as {asname}" if asname else "")


class _Inliner:
    """Collects the statements some nvfp4lib objects need, following names transitively."""

    def __init__(self, reserved: tuple[str, ...] = ()):
        self.modules: dict[str, _Module] = {}
        self.taken: dict[str, dict[int, ast.stmt]] = {}  # module -> {id(stmt): stmt}, in order taken
        self.texts: dict[int, str] = {}  # id(stmt) -> its source as inlined
        self.imports: set[tuple] = set()  # third-party and standard-library imports
        self.owner: dict[str, str] = {name: "the generated entry point" for name in reserved}
        self._done: set[tuple[str, str]] = set()
        self.attributes: set[str] = set()  # attribute names the taken code reads (`_attribute_names`)
        self.classes: dict[int, tuple[_Module, ast.ClassDef, str]] = {}  # id(stmt) -> (module, class, label)

    def module(self, name: str) -> _Module:
        if name not in self.modules:
            self.modules[name] = _Module(name)
        return self.modules[name]

    def _claim(self, name: str, owner: str, where: str) -> None:
        """One file is one namespace: a name may come from one place only."""
        previous = self.owner.setdefault(name, owner)
        if previous != owner:
            raise ExportError(f"name clash: {name!r} is defined by {previous} and by {owner} (needed by {where}); "
                              f"rename one of them")

    def need(self, module_name: str, name: str, where: str) -> None:
        """Take what defines `name` in `module_name` (and, recursively, what that uses)."""
        if (module_name, name) in self._done:
            return
        self._done.add((module_name, name))
        mod = self.module(module_name)
        if name in mod.from_package:
            target, original = mod.from_package[name]
            if not original or (self.module(target).is_package
                                and importlib.util.find_spec(f"{target}.{original}") is not None):
                what = f"the {PACKAGE} package" if not original else f"the module {target}.{original}"
                raise ExportError(f"{mod.file}: {where} uses {name!r}, {what} itself; only names imported from a "
                                  f"module (from {PACKAGE}.x import y) can be inlined")
            self.need(target, original, f"{module_name}.{name}")
        elif name in mod.statements:
            for stmt in mod.statements[name]:
                self._take(mod, stmt, f"{module_name}.{name}")
        elif name in mod.imports:
            self._claim(name, f"an import ({_import_line(mod.imports[name])})", where)
            self.imports.add(mod.imports[name])
        elif not hasattr(builtins, name):
            raise ExportError(f"{mod.file}: {where} uses {name!r}, which {module_name} does not define or import "
                              f"at module level")

    def _take(self, mod: _Module, stmt: ast.stmt, label: str) -> None:
        bound = _bound_names(stmt)
        for name in bound:
            self._claim(name, f"{mod.file} line {stmt.lineno}", label)
        taken = self.taken.setdefault(mod.name, {})
        if id(stmt) in taken:
            return
        taken[id(stmt)] = stmt
        if isinstance(stmt, ast.ClassDef):
            self.classes[id(stmt)] = (mod, stmt, label)
        self._render(mod, stmt, label)

    def _render(self, mod: _Module, stmt: ast.stmt, label: str) -> None:
        """Take the statement's text, and what it uses: for a class, the members some taken code may read."""
        drop = () if not isinstance(stmt, ast.ClassDef) else \
            [node for name, node in _members(stmt).items() if name not in self.attributes]
        text, local_imports = mod.text(stmt, drop)
        self.texts[id(stmt)] = text
        for target, original in local_imports:
            self.need(target, original, label)
        provided = _bound_names(stmt) | {original for _, original in local_imports}
        for ref in sorted(_global_references(text) - provided):
            self.need(mod.name, ref, label)
        new = _attribute_names(text) - self.attributes
        if new:  # members of the classes taken so far that the code may now read
            self.attributes |= new
            for key, (owner, cls, cls_label) in list(self.classes.items()):
                if new & set(_members(cls)):
                    self._render(owner, cls, cls_label)

    def module_order(self) -> list[str]:
        """Modules with the ones they import at top level first, as Python would run them: sorted
        by the length of their longest chain of top-level imports, then by name."""
        depth: dict[str, int] = {}

        def chain(name: str) -> int:
            if name not in depth:
                requires = self.modules[name].requires if name in self.modules else ()
                depth[name] = 1 + max((chain(dep) for dep in requires), default=-1)
            return depth[name]

        return sorted(self.taken, key=lambda name: (chain(name), name))

    def imports_section(self) -> str:
        """Standard library, then third-party imports, then import blocks (optional dependencies)."""
        plain = sorted(_import_line(item) for item in self.imports if item[0] is None)
        grouped: dict[str, list[str]] = {}
        for module, name, asname in sorted(self.imports - {i for i in self.imports if i[0] is None}):
            grouped.setdefault(module, []).append(name + (f" as {asname}" if asname else ""))
        lines = plain + [f"from {module} import {', '.join(names)}" for module, names in sorted(grouped.items())]
        stdlib = [line for line in lines if line.split()[1].split(".")[0] in sys.stdlib_module_names]
        groups = ["\n".join(stdlib), "\n".join(line for line in lines if line not in stdlib)]
        for module_name in self.module_order():
            groups += [self.texts[key] for key, stmt in self.taken[module_name].items() if _is_import_block(stmt)]
        return "\n\n".join(group for group in groups if group)

    def code_section(self) -> str:
        """The taken statements, module by module, each module headed by its file and summary."""
        sections = []
        for module_name in self.module_order():
            stmts = sorted((s for s in self.taken[module_name].values() if not _is_import_block(s)),
                           key=lambda s: s.lineno)
            if not stmts:
                continue
            mod = self.modules[module_name]
            summary = " ".join(mod.docstring.split("\n\n")[0].split())
            header = textwrap.shorten(f"{RULE}{mod.file}: {summary}", 114, placeholder=" ...")
            body = ""
            for previous, stmt in zip([None] + stmts, stmts):
                if previous is not None:  # simple statements one line apart, definitions one blank line
                    body += "\n" if not isinstance(stmt, _DEFINITIONS) and not isinstance(previous, _DEFINITIONS) \
                        else "\n\n"
                body += self.texts[id(stmt)]
            sections.append(header + "\n" + body)
        return "\n\n".join(sections)


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def inline_objects(objects: list, reserved: tuple[str, ...] = ()) -> tuple[str, str]:
    """(imports, code): the source of nvfp4lib `objects` and of everything they use, module by
    module in import order. `reserved` are names the caller defines itself (clashes are errors)."""
    inliner = _Inliner(reserved)
    for obj in objects:
        module = getattr(obj, "__module__", None)
        if not _is_package_module(module) or not hasattr(obj, "__name__"):
            raise ExportError(f"{obj!r}: only functions and classes defined in {PACKAGE} can be inlined")
        inliner.need(module, obj.__name__, "the entry point")
    return inliner.imports_section(), inliner.code_section()


# ---------------------------------------------------------------------------------------------
# The file


def _inlined_call(fn, what: str) -> tuple[Callable, str]:
    """(the function to inline, the expression a generated file calls) for a path's builder or
    availability check: a named function of the package, or a functools.partial of one with literal
    arguments. The registry's own functions, so that a file builds each path as the dispatcher does."""
    args: tuple = ()
    if isinstance(fn, functools.partial):
        if fn.keywords:
            raise ExportError(f"{what}: a functools.partial with keywords cannot be inlined; pass them positionally")
        fn, args = fn.func, fn.args
    if not _is_package_module(getattr(fn, "__module__", None)) or getattr(fn, "__name__", "<lambda>") == "<lambda>":
        raise ExportError(f"{what}: {fn!r} cannot be inlined; give it a name in {PACKAGE}.paths")
    return fn, (f"lambda: {fn.__name__}({', '.join(map(repr, args))})" if args else fn.__name__)


def _candidate_table(candidates) -> tuple[list, list[str]]:
    """(functions to inline, the lines of the dict literal name -> (unavailable, build)) for `choose_kernel`."""
    objects, lines = [], []
    for name in candidates:
        unavailable, build = IN_A_FILE.get(name) or (PATHS[name].unavailable, PATHS[name].build)
        unavailable, unavailable_text = _inlined_call(unavailable, f"{name}: unavailable")
        build, build_text = _inlined_call(build, f"{name}: build")
        objects += [unavailable, build]
        lines.append(f"    {name!r}: ({unavailable_text}, {build_text}),")
    return objects, lines


def export_source(path: str, *, streams: int | None = None, fail: tuple[str, ...] = (),
                  standalone: bool = False) -> str:
    """The text of a self-contained leaderboard file for `path` (one of `EXPORTS`; of `STANDALONE` with
    `standalone`: the kernel alone, for editing).

    `fail` names runtime paths of the file's fallback order that its self-check is to fail on
    purpose (to see the fallback work on a machine where every path would pass).
    """
    if path not in EXPORTS:
        raise ExportError(f"unknown path {path!r}; choose one of: {', '.join(EXPORTS)}")
    spec = export_path(path, standalone)
    kwargs = dict(spec.kwargs)
    if streams is not None:
        if "streams" not in kwargs:
            raise ExportError(f"--streams applies only to paths that take streams, not to {path!r}")
        if isinstance(streams, bool) or not isinstance(streams, int) or not 0 <= streams <= MAX_STREAMS:
            raise ExportError(f"--streams: expected an integer from 0 to {MAX_STREAMS} (0 = the caller's stream), "
                              f"got {streams!r}")
        kwargs["streams"] = streams
    unknown = [name for name in fail if name not in spec.candidates]
    if unknown:
        choices = ", ".join(spec.candidates) if spec.candidates else f"none: {path!r} has no fallback"
        raise ExportError(f"--fail-path {unknown[0]!r}: not a path of {path!r} (its paths: {choices})")
    generated = ("custom_kernel", "input_t", "output_t", "SUBMISSION_PATH", "NVFP4LIB_VERSION", "BACKEND", "KERNEL",
                 "NEEDS_CUDA")
    table, table_lines = _candidate_table(spec.candidates)
    if spec.standalone:
        entry, text = _inlined_call(spec.entry, f"{path}: unchecked")
        objects = [entry]
    else:
        objects = [spec.entry] + (table if spec.candidates else [describe_backend])
    imports, code = inline_objects(objects, reserved=generated)
    needs = "torch (and the CuTe DSL for the CuTe kernel)" if "import cutlass" in imports else "torch"
    command = " ".join([f"python -m nvfp4lib.leaderboard.export --path {path}"]
                       + ([f"--streams {streams}"] if streams is not None else [])
                       + (["--standalone"] if standalone else [])
                       + [f"--fail-path {name}" for name in fail])
    header = [
        DIRECTIVE,
        f"# Batched NVFP4 GEMV (GPU MODE leaderboard 'nvfp4_gemv'), path {path!r}:",
        *[f"#   {line}" for line in textwrap.wrap(spec.summary, 94)],
        f"# Generated by nvfp4lib {nvfp4lib.__version__}: `{command}`",
        *[f"# {line}" for line in textwrap.wrap(
            f"It needs only {needs}. Below the imports: nvfp4lib's own source, module by module (without its "
            "docstrings: each section names the file that has them), then the entry point.", 110)],
    ]
    if spec.standalone:
        setup = ["NEEDS_CUDA = True  # the local leaderboard skips this file where there is no CUDA GPU",
                 "KERNEL = " + (text.removeprefix("lambda: ") if text.startswith("lambda: ") else f"{text}()")
                 + "  # built now, for this GPU: no timed call compiles what it can compile here"]
        call = "KERNEL(data)"
    elif spec.candidates:
        options = f", fail={tuple(fail)!r}" if fail else ""
        setup = ["# Chosen once, now (BACKEND says what runs): the first of these paths (name: availability check, "
                 "builder, as in",
                 "# nvfp4lib.paths) that runs here and passes its self-check. Logged: cannot run at INFO, a failure as "
                 "a WARNING.",
                 f"KERNEL, BACKEND = {spec.entry.__name__}({{", *table_lines, f"}}{options})"]
        call = "KERNEL(data)"
    else:
        setup = ["BACKEND = describe_backend()  # probes the machine now, not inside the first timed call"]
        call = f"{spec.entry.__name__}({', '.join(['data'] + [f'{k}={v!r}' for k, v in kwargs.items()])})"
    tail = [
        RULE + ENTRY_POINT_TITLE,
        *setup, "",
        "def custom_kernel(data: input_t) -> output_t:",
        f'    """c[m, 0, l] = sum_k A * sfa * B[0] * sfb[0], written into c and returned ({path})."""',
        f"    return {call}",
    ]
    source = "\n".join([
        *header, "", "from __future__ import annotations", "", imports, "", TASK_IMPORT, "",
        f"SUBMISSION_PATH = {path!r}", f"NVFP4LIB_VERSION = {nvfp4lib.__version__!r}",
        "", code, "", *tail, ""])
    _check_self_contained(source, path)
    return source


def _check_self_contained(source: str, path: str) -> None:
    """The generated file must compile, import nothing from nvfp4lib and leave no name undefined."""
    try:
        tree = ast.parse(source)
        compile(tree, f"<{path}>", "exec")
    except SyntaxError as err:
        raise ExportError(f"the file generated for {path!r} does not compile: {err}") from err
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or _is_package_module(node.module)) or (
                isinstance(node, ast.Import) and any(_is_package_module(a.name) for a in node.names)):
            raise ExportError(f"the file generated for {path!r} still imports from {PACKAGE} (line {node.lineno})")
    top = symtable.symtable(source, f"<{path}>", "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    missing = sorted(_global_references(source) - defined - set(dir(builtins)))
    if missing:
        raise ExportError(f"the file generated for {path!r} uses undefined names: {', '.join(missing)}")


GENERATED = "header, imports, entry point"
"""The name `sections` gives a file's head (up to the first inlined module) and tail (the entry point)."""
ENTRY_POINT_TITLE = "the leaderboard entry point"
RULE = "# ==== "  # how each section's header line starts: a module's (its file and summary), then the entry point's


class Section(NamedTuple):
    name: str  # the inlined module's file ("nvfp4lib/scaled_mm.py"), or GENERATED
    lines: int


def sections(source: str) -> list[Section]:
    """The sections of a file `export_source` wrote, in order: each inlined module's (its header line to the next
    section's) under its file's name, `GENERATED` for the head and the tail; the counts add up to the file's."""
    lines, starts = source.splitlines(), [(0, GENERATED)]
    for i, line in enumerate(lines[:-1]):
        if line.startswith(f"{RULE}{PACKAGE}/"):
            starts.append((i, line.removeprefix(RULE).split(":")[0]))
        elif line == RULE + ENTRY_POINT_TITLE:
            starts.append((i, GENERATED))
    ends = [start for start, _ in starts[1:]] + [len(lines)]
    return [Section(name, end - start) for (start, name), end in zip(starts, ends) if end > start]


PACKAGE_FOLDER = Path(nvfp4lib.__file__).resolve().parent


def write_submission(path: str, out, *, streams: int | None = None, fail: tuple[str, ...] = (),
                     force: bool = False, standalone: bool = False) -> Path:
    """Write the file for `path` to `out` and return where it went. Missing folders are created; an existing
    file is replaced only with `force`, once the new text is complete (a scratch file beside it, renamed over
    it); a folder, a file where a folder should be, or a place inside the package's own folder (the source the
    exporter reads) is an ExportError that says so."""
    if str(out).endswith(("/", os.sep)) or Path(out).is_dir():
        raise ExportError(f"--out: {out} is a folder; name the file to write, e.g. {Path(out) / 'submission.py'}")
    out = Path(out)
    if PACKAGE_FOLDER in Path(os.path.realpath(out)).parents:  # a link into the package counts too
        raise ExportError(f"--out: {out} is inside the {PACKAGE} package ({PACKAGE_FOLDER}), whose files are the "
                          f"source the exporter reads; write the submission elsewhere")
    if out.exists() and not force:
        raise ExportError(f"--out: {out} exists; pass --force to overwrite it")
    source = export_source(path, streams=streams, fail=fail, standalone=standalone)
    scratch = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(scratch, "x", encoding="utf-8") as f:
                f.write(source)
            os.replace(scratch, out)
        finally:
            scratch.unlink(missing_ok=True)
    except OSError as err:
        where = f" ({err.filename})" if err.filename and str(err.filename) not in (str(out), str(scratch)) else ""
        raise ExportError(f"--out: cannot write {out}: {err.strerror or err}{where}") from err
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvfp4lib.leaderboard.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", help="which kernel path to export (see --list)")
    parser.add_argument("--out", default="submission.py", help="file to write (default: submission.py)")
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    parser.add_argument("--streams", type=int,
                        help=f"CUDA streams of scaled_mm_transposed (default {TRANSPOSED_STREAMS})")
    parser.add_argument("--fail-path", action="append", default=[], metavar="NAME",
                        help="make the file's self-check fail this path of its fallback order, to see the "
                             "fallback work (repeatable)")
    parser.add_argument("--standalone", action="store_true",
                        help=f"the kernel, its launch and custom_kernel alone, for editing: no input validation, "
                             f"self-check or fallback ({', '.join(STANDALONE)})")
    parser.add_argument("--list", action="store_true", help="list the paths and exit")
    args = parser.parse_args(argv)
    if args.list:
        width = max(map(len, EXPORTS))
        for name in EXPORTS:
            print(f"{name:<{width}}  {export_path(name).summary}")
        return 0
    if not args.path:
        parser.error(f"--path is required; one of: {', '.join(EXPORTS)}")
    try:
        out = write_submission(args.path, args.out, streams=args.streams, fail=tuple(args.fail_path),
                               force=args.force, standalone=args.standalone)
    except ExportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({args.path}{', standalone' if args.standalone else ''}, "
          f"{len(out.read_text().splitlines())} lines)")
    return 0


if __name__ == "__main__":
    # Run the package's module, not this __main__ copy: the exporter reads objects' home modules.
    from nvfp4lib.leaderboard.export import main as _main

    sys.exit(_main())
