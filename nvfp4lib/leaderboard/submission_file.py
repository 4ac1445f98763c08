"""A one-file leaderboard submission as a file: its text, its directive line, the stand-in `task`
module it imports its types from, and an import of it where nvfp4lib is out of reach.

The local leaderboard (nvfp4lib.leaderboard.modes) reads files with `read_submission` and runs them in a
process of their own (nvfp4lib.leaderboard.child) built on these pieces; `load_submission` imports one into
this process for notebooks and tests. Both refuse nvfp4lib with the one guard, `child.refusal`."""

from __future__ import annotations

import builtins
import importlib.util
import itertools
import os
import stat
import sys
import types
from pathlib import Path

from nvfp4lib.leaderboard.child import refusal

PACKAGE = "nvfp4lib"
DIRECTIVE = "#!POPCORN leaderboard nvfp4_gemv"
MISSING_PACKAGE = ("No module named {name!r}: the leaderboard machine does not have " + PACKAGE
                   + "; export the submission with `python -m " + PACKAGE + ".leaderboard.export`, which inlines the "
                   "code it needs")

MAX_SUBMISSION_BYTES = 16 << 20  # the exported files are about 100 KB
_loaded = itertools.count()


class SubmissionError(RuntimeError):
    """The file cannot be loaded as a submission (the message says why)."""


TASK_SOURCE = '''"""Stand-in for the leaderboard's task module: the type aliases a submission imports."""
import torch

input_t = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
output_t = torch.Tensor
'''


def task_module() -> types.ModuleType:
    task = types.ModuleType("task")
    exec(TASK_SOURCE, task.__dict__)
    return task


def read_submission(path) -> str:
    """The file's text, or a SubmissionError saying why it cannot be a submission. The file is opened
    without blocking (a FIFO or a device is refused, not waited on) and read up to MAX_SUBMISSION_BYTES."""
    path = Path(path)
    if path.suffix != ".py" and path.is_file():
        raise SubmissionError(f"{path}: expected a Python file ending in .py")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise SubmissionError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SubmissionError(f"{path}: not a regular file") from None
    except OSError as err:
        raise SubmissionError(f"{path}: cannot be read: {err.strerror or err}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SubmissionError(f"{path}: not a regular file")
        if path.suffix != ".py":
            raise SubmissionError(f"{path}: expected a Python file ending in .py")
        if info.st_size > MAX_SUBMISSION_BYTES:
            raise SubmissionError(f"{path}: {info.st_size} bytes, more than the {MAX_SUBMISSION_BYTES} a submission "
                                  f"may have")
        chunks, size = [], 0
        while size <= MAX_SUBMISSION_BYTES:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        raw = b"".join(chunks)
    except OSError as err:
        raise SubmissionError(f"{path}: cannot be read: {err.strerror or err}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_SUBMISSION_BYTES:
        raise SubmissionError(f"{path}: more than the {MAX_SUBMISSION_BYTES} bytes a submission may have")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise SubmissionError(f"{path}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); "
                              f"the leaderboard reads the file as UTF-8") from None


def has_directive(source: str) -> bool:
    """Whether the leading comment lines include the leaderboard directive."""
    for line in source.splitlines():
        if line.strip() == DIRECTIVE:
            return True
        if line.strip() and not line.lstrip().startswith("#"):
            return False
    return False


def _without_package() -> dict:
    """Builtins whose ``__import__`` refuses nvfp4lib: every import statement of the submission
    (at import time and inside its functions) goes through it, even though this process has
    nvfp4lib loaded."""
    real_import = builtins.__import__

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        err = refusal(name, PACKAGE, MISSING_PACKAGE) if level == 0 else None
        if err is not None:
            raise err
        return real_import(name, globals, locals, fromlist, level)

    table = dict(vars(builtins))
    table["__import__"] = guarded_import
    return table


def load_submission(path) -> types.ModuleType:
    """Import the file into this process as a fresh module whose import statements cannot reach
    nvfp4lib; it must define custom_kernel. For notebooks and tests that want the module object:
    it shares this process with nvfp4lib (a route other than an import statement reaches it), so
    `evaluate` does not use it: it runs the file in a process where nvfp4lib is out of reach."""
    read_submission(path)
    path = Path(path)
    name = f"leaderboard_submission_{next(_loaded)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__builtins__ = _without_package()
    sys.modules.setdefault("task", task_module())
    sys.modules[name] = module  # dataclasses and the CuTe DSL look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - whatever it is, the file does not load
        del sys.modules[name]
        raise SubmissionError(f"{path}: importing it failed: {type(err).__name__}: {err}") from err
    if not callable(getattr(module, "custom_kernel", None)):
        raise SubmissionError(f"{path}: defines no function custom_kernel(data)")
    return module
