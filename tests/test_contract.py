"""The input contract (nvfp4lib.contract): every way the GEMV 7-tuple can be wrong is reported,
naming the argument; the named tuple the package hands around; and the contract as the package's
bottom layer, in an import graph without cycles or borrowed private names."""

import ast
import os
import re
import subprocess
import sys

import pytest
import torch

from nvfp4lib.contract import (DTYPES, NAMES, SCALE_ATOM_BYTES, SCALE_TILE_COLS, SCALE_TILE_ROWS, GemvInput,
                               NVFP4InputError, Shape, permuted_strides, plain_strides, scale_tile_counts, shape_of,
                               strides_match, validate_gemv_input)
from nvfp4lib.locations import PACKAGE_DIR
from nvfp4lib.problem import generate_input
from nvfp4lib.reference import reference_gemv


def replaced(data, name, tensor):
    """The 7 tensors as a plain tuple, the one called `name` replaced."""
    return tuple(tensor if field == name else t for field, t in zip(NAMES, data))


@pytest.fixture
def data():
    return generate_input(256, 128, 2)


# ------------------------------------------------------------------------------ the named tuple


def test_generate_input_returns_a_gemv_input_that_is_still_a_tuple():
    data = generate_input(256, 128, 2, seed=1)
    assert isinstance(data, GemvInput) and isinstance(data, tuple) and len(data) == 7
    assert NAMES == GemvInput._fields == ("a", "b", "sfa", "sfb", "sfa_permuted", "sfb_permuted", "c")
    for position, name in enumerate(NAMES):
        tensor = getattr(data, name)
        assert tensor is data[position], f"field {name} is not element {position}"
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == DTYPES[name], name
    a, b, sfa, sfb, sfa_permuted, sfb_permuted, c = data  # unpacks like the leaderboard's tuple
    assert (a, c) == (data.a, data.c) and tuple(data) == (a, b, sfa, sfb, sfa_permuted, sfb_permuted, c)
    assert validate_gemv_input(data) == shape_of(data) == Shape(256, 128, 2)


def test_shape_of_reads_a_and_gives_the_validators_error_when_it_cannot():
    data = generate_input(384, 192, 3)
    assert shape_of(data) == shape_of(list(data)) == Shape(384, 192, 3)
    with pytest.raises(NVFP4InputError, match=r"^data: expected a 7-tuple .*got NoneType"):
        shape_of(None)
    with pytest.raises(NVFP4InputError, match=r"^a: expected a torch\.Tensor, got str"):
        shape_of(replaced(data, "a", "not a tensor"))


def test_scale_tiles_and_strides_describe_generated_inputs(data):
    assert (SCALE_TILE_ROWS, SCALE_TILE_COLS, SCALE_ATOM_BYTES) == (128, 4, 512)
    assert scale_tile_counts(256, 8) == (2, 2) and scale_tile_counts(129, 9) == (2, 3)
    m, k, l = 256, 128, 2
    assert strides_match(data.a, plain_strides(m, k // 2, l))
    assert strides_match(data.sfa_permuted, permuted_strides(*scale_tile_counts(m, k // 16), l))
    assert not strides_match(data.sfa_permuted.contiguous(), permuted_strides(*scale_tile_counts(m, k // 16), l))


# ------------------------------------------------------------------------------ bad tuples


def test_valid_input_returns_shape(data):
    assert validate_gemv_input(data) == Shape(256, 128, 2)
    assert validate_gemv_input(list(data), device="cpu") == Shape(256, 128, 2)


def test_m_multiple_can_be_relaxed():
    odd = generate_input(200, 128, 1)
    with pytest.raises(NVFP4InputError, match="^a: expected M a multiple of 128, got M = 200"):
        validate_gemv_input(odd)
    assert validate_gemv_input(odd, need_m_multiple=None) == Shape(200, 128, 1)


@pytest.mark.parametrize("bad, match", [
    (lambda d: tuple(d)[:6], r"^data: expected a 7-tuple .*got tuple of length 6"),
    (lambda d: tuple(d) + (d.c,), r"^data: expected a 7-tuple .*got tuple of length 8"),
    (lambda d: None, r"^data: expected a 7-tuple .*got NoneType"),
    (lambda d: replaced(d, "b", None), r"^b: expected a torch.Tensor, got NoneType"),
])
def test_tuple_errors(data, bad, match):
    with pytest.raises(NVFP4InputError, match=match):
        validate_gemv_input(bad(data))


@pytest.mark.parametrize("name, convert, match", [
    ("a", lambda t: t.view(torch.uint8), r"^a: expected dtype torch.float4_e2m1fn_x2, got torch.uint8"),
    ("sfb", lambda t: t.float(), r"^sfb: expected dtype torch.float8_e4m3fn, got torch.float32"),
    ("sfa_permuted", lambda t: t.view(torch.uint8), r"^sfa_permuted: expected dtype torch.float8_e4m3fn"),
    ("c", lambda t: t.float(), r"^c: expected dtype torch.float16, got torch.float32"),
])
def test_wrong_dtype(data, name, convert, match):
    with pytest.raises(NVFP4InputError, match=match):
        validate_gemv_input(replaced(data, name, convert(getattr(data, name))))


@pytest.mark.parametrize("name, convert, match", [
    ("a", lambda t: t[:, :, 0], r"^a: expected rank 3, got shape \(256, 64\)"),
    ("c", lambda t: t[:, 0, :], r"^c: expected rank 3"),
    ("sfb_permuted", lambda t: t[..., 0], r"^sfb_permuted: expected rank 6"),
])
def test_wrong_rank(data, name, convert, match):
    with pytest.raises(NVFP4InputError, match=match):
        validate_gemv_input(replaced(data, name, convert(getattr(data, name))))


def test_mismatched_k_between_a_and_b(data):
    other = generate_input(256, 256, 2)
    with pytest.raises(NVFP4InputError, match=r"^b: expected K/2 = 64 \(from a\)"):
        validate_gemv_input(replaced(data, "b", other.b))


def test_mismatched_l_between_a_and_b(data):
    other = generate_input(256, 128, 1)
    with pytest.raises(NVFP4InputError, match=r"^b: expected L = 2 \(from a\)"):
        validate_gemv_input(replaced(data, "b", other.b))


def test_k_not_multiple_of_64():
    with pytest.raises(NVFP4InputError, match="^a: expected K a multiple of 64, got K = 96"):
        validate_gemv_input(generate_input(128, 96, 1))


@pytest.mark.parametrize("name, source, match", [
    ("sfa", (128, 128, 2), r"^sfa: expected shape \(256, 8, 2\), got \(128, 8, 2\)"),
    ("sfa_permuted", (128, 128, 2), r"^sfa_permuted: expected shape \(32, 4, 2, 4, 2, 2\)"),
    ("c", (128, 128, 2), r"^c: expected shape \(256, 1, 2\)"),
])
def test_inconsistent_shapes(data, name, source, match):
    with pytest.raises(NVFP4InputError, match=match):
        validate_gemv_input(replaced(data, name, getattr(generate_input(*source), name)))


@pytest.mark.parametrize("name", NAMES)
def test_wrong_strides(data, name):
    """Same shape and values, but contiguous in the logical order: a raw-pointer kernel would misread it."""
    made_contiguous = getattr(data, name).contiguous()
    with pytest.raises(NVFP4InputError,
                       match=rf"^{name}: expected strides .*, got {re.escape(str(made_contiguous.stride()))}"):
        validate_gemv_input(replaced(data, name, made_contiguous))


def test_mixed_devices(data):
    with pytest.raises(NVFP4InputError, match="^data: expected all tensors on one device"):
        validate_gemv_input(replaced(data, "c", data.c.to("meta")))


def test_required_device(data):
    with pytest.raises(NVFP4InputError, match="^data: expected tensors on cuda, got cpu"):
        validate_gemv_input(data, device="cuda")


@pytest.mark.gpu
def test_valid_cuda_input():
    data = generate_input(256, 128, 2, device="cuda")
    assert validate_gemv_input(data, device="cuda") == Shape(256, 128, 2)
    with pytest.raises(NVFP4InputError, match="^data: expected all tensors on one device"):
        validate_gemv_input(replaced(data, "a", data.a.cpu()))


def zero_sized(data, dim: int):
    """The tuple with one of M (dim 0), K (dim 1) or L (dim 2) cut to zero wherever it appears."""
    cut = {}
    for name in ("a", "b", "sfa", "sfb", "c"):  # [rows, K-ish, L]
        if dim == 0 and name in ("b", "sfb"):
            continue  # b and sfb keep their 128 rows
        if dim == 1 and name == "c":
            continue  # c has no K
        cut[name] = getattr(data, name).narrow(dim, 0, 0)
    return tuple(cut.get(name, t) for name, t in zip(NAMES, data))


@pytest.mark.parametrize("dim, label", [(0, "M"), (1, "K"), (2, "L")])
@pytest.mark.parametrize("entry", [validate_gemv_input, reference_gemv])
def test_zero_sizes_are_refused_by_name(data, dim, label, entry):
    with pytest.raises(NVFP4InputError, match=rf"^a: expected M, K and L >= 1, got {label} = 0"):
        entry(zero_sized(data, dim))


def bytes_of(t: torch.Tensor) -> torch.Tensor:
    """All bytes of t's storage, as a flat uint8 tensor over the same memory."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def c_inside(t: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A float16 tensor with like's shape and strides whose bytes lie in t's storage from `offset`."""
    raw = bytes_of(t)[offset:offset + 2 * like.numel()]
    return raw.view(torch.float16).as_strided(like.shape, like.stride())


@pytest.mark.parametrize("name", NAMES[:-1])
def test_c_sharing_memory_with_an_input_is_refused(data, name):
    aliased = c_inside(getattr(data, name), 0, data.c)
    with pytest.raises(NVFP4InputError, match=rf"^c: expected memory of its own .*shares storage bytes with {name}$"):
        validate_gemv_input(replaced(data, "c", aliased))


def test_c_in_another_part_of_an_inputs_storage_is_refused(data):
    """Not the same elements, but the same allocation: refused all the same."""
    storage = bytes_of(data.a)
    aliased = c_inside(data.a, storage.numel() - 2 * data.c.numel(), data.c)
    with pytest.raises(NVFP4InputError, match=r"^c: .*shares storage bytes with a$"):
        validate_gemv_input(replaced(data, "c", aliased))
    with pytest.raises(NVFP4InputError, match=r"^c: .*shares storage bytes with a$"):
        reference_gemv(replaced(data, "c", aliased))


def test_c_with_memory_of_its_own_is_accepted(data):
    fresh = torch.empty_like(data.c.permute(2, 0, 1)).permute(1, 2, 0)
    assert validate_gemv_input(replaced(data, "c", fresh)) == Shape(256, 128, 2)


# ------------------------------------------------------------------------------ the import graph

PACKAGE = "nvfp4lib"
WINGS = tuple(f"{PACKAGE}.{wing}" for wing in ("bench", "leaderboard", "study"))


def _module_name(path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULE_FILES = {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}
PACKAGES = {name for name, path in MODULE_FILES.items() if path.name == "__init__.py"}


def _in_wing(module: str) -> bool:
    return any(module == wing or module.startswith(wing + ".") for wing in WINGS)


CORE = sorted(m for m in MODULE_FILES if not _in_wing(m))  # nvfp4lib/*.py and nvfp4lib/cute/


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_package_module(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """(nvfp4lib module imported, name taken from it or None, line) for every import of the package in
    `module`, at the top level or inside functions. ``from nvfp4lib.x import y`` imports module
    nvfp4lib.x.y where that is a module, else takes y from nvfp4lib.x; relative imports are resolved;
    ``importlib.import_module("nvfp4lib.x")`` counts too."""
    tree = ast.parse(MODULE_FILES[module].read_text(), filename=str(MODULE_FILES[module]))
    here = module if module in PACKAGES else module.rpartition(".")[0]  # the package `module` is in
    found = []
    aliases = {}  # local name -> nvfp4lib module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_package_module(alias.name):
                    found.append((alias.name, None, node.lineno))
                    if alias.asname:
                        aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:  # relative to the package this module is in
                base = here.split(".")[:len(here.split(".")) - node.level + 1]
                source = ".".join(base + ([source] if source else []))
            if not _is_package_module(source):
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in MODULE_FILES:
                    found.append((submodule, None, node.lineno))
                    aliases[alias.asname or alias.name] = submodule
                else:
                    found.append((source, alias.name, node.lineno))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and _is_package_module(str(node.args[0].value))):
            found.append((node.args[0].value, None, node.lineno))
    for node in ast.walk(tree):  # names read off an imported module: `x._name`
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.append((aliases[node.value.id], node.attr, node.lineno))
    return found


IMPORTS = {module: _imports(module) for module in MODULE_FILES}


def test_the_import_graph_sees_the_package():
    assert len(MODULE_FILES) > 30 and {f"{PACKAGE}.contract", f"{PACKAGE}.cute.gemv"} <= set(MODULE_FILES)
    assert set(WINGS) <= PACKAGES and f"{PACKAGE}.cute" in PACKAGES
    edges = {(m, target) for m, found in IMPORTS.items() for target, _, _ in found}
    assert (f"{PACKAGE}.dispatch", f"{PACKAGE}.paths") in edges
    assert (f"{PACKAGE}.paths", f"{PACKAGE}.cute.gemv") in edges, "an import inside a function counts"
    assert (f"{PACKAGE}.bench.peers", f"{PACKAGE}.bench.triton_gemv") in edges, "`from nvfp4lib.bench import x` counts"
    assert (f"{PACKAGE}.cute.decode", f"{PACKAGE}.cute.constants") in edges


def test_every_imported_module_exists():
    missing = [f"{m}:{line} imports {target}" for m, found in IMPORTS.items() for target, _, line in found
               if target not in MODULE_FILES]
    assert not missing, missing


def test_the_contract_imports_nothing_of_the_package():
    assert IMPORTS[f"{PACKAGE}.contract"] == []


def test_no_import_cycle():
    graph = {m: sorted({t for t, _, _ in found if t != m and t in MODULE_FILES}) for m, found in IMPORTS.items()}
    state: dict[str, str] = {}  # module -> "open" while on the DFS stack, "done" after

    def cycle_from(module: str, stack: list[str]) -> list[str] | None:
        state[module] = "open"
        stack.append(module)
        for target in graph[module]:
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = cycle_from(target, stack)
                if found:
                    return found
        stack.pop()
        state[module] = "done"
        return None

    for module in graph:
        if module not in state:
            cycle = cycle_from(module, [])
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_module_takes_another_modules_private_names():
    borrowed = [f"{m}:{line} uses {target}.{name}" for m, found in IMPORTS.items() for target, name, line in found
                if target != m and name is not None and _is_private(name)]
    assert not borrowed, "\n".join(borrowed)


def test_the_core_imports_no_wing():
    """nvfp4lib/*.py and nvfp4lib/cute/ never import bench, leaderboard or study: not at the top, not
    inside a function, not by importlib.import_module."""
    assert f"{PACKAGE}.dispatch" in CORE and f"{PACKAGE}.cute.gemv" in CORE and f"{PACKAGE}.bench.suite" not in CORE
    crossing = [f"{m}:{line} imports {target}" for m in CORE for target, _, line in IMPORTS[m] if _in_wing(target)]
    assert not crossing, "\n".join(crossing)


def _loaded_by(module: str) -> list[str]:
    """The nvfp4lib modules that importing `module` in a fresh interpreter loads."""
    code = f"import sys, {module}; print(*sorted(m for m in sys.modules if m.startswith('{PACKAGE}')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE_DIR.parent, env=dict(os.environ, PYTHONPATH=str(PACKAGE_DIR.parent)))
    return out.stdout.split()


@pytest.mark.parametrize("module, forbidden", [(f"{PACKAGE}.dispatch", WINGS),
                                               (f"{PACKAGE}.cute.gemv", (f"{PACKAGE}.study",))])
def test_importing_the_entry_point_or_the_kernels_loads_no_wing(module, forbidden):
    """The product entry point runs without the measuring, judging and teaching code; the kernels
    never load their own verification models."""
    loaded = _loaded_by(module)
    assert module in loaded
    assert not [m for m in loaded if any(m == w or m.startswith(w + ".") for w in forbidden)], loaded
