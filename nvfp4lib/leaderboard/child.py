"""The submission's process: the program that holds one submission file and calls it when the
evaluator asks. nvfp4lib.leaderboard.process runs it by path,
``python -P -u child.py REQUESTS_FD ANSWERS_FD EVALUATOR_PID``, in an empty folder of its own.

Once the submission is loaded, everything in this process is the submission's to change, so the
evaluator takes nothing said here as a fact: this program sends back what it saw (the output's
description and bytes, copied on the caller's stream right after the call and again after the
device is idle; the inputs' bytes after the call; the times it measured) and the evaluator judges
them. Before the submission runs, it closes what it can:

* Landlock (Linux 5.13 and later, where the kernel has it): neither this process nor anything it
  starts can read, list, run or change anything in the package's folder; with Landlock ABI 6
  (Linux 6.12) none of them can signal a process outside either (the evaluator);
* the package's folder is taken off sys.path, a finder ahead of all others refuses its name (the
  error a file that still imports nvfp4lib gets on the leaderboard), and an audit hook refuses
  Python's opening of paths inside the folder;
* the kernel kills this process if the evaluator dies (PR_SET_PDEATHSIG).

Requests and answers are messages: an 8-byte little-endian length, then that many bytes of JSON;
tensors follow as frames of raw bytes (the same length prefix). The evaluator also imports this
module for what both sides share: the wire format and the package guard (`refusal`). It imports
only the standard library; torch comes in `main`, after Landlock is in place.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.abc
import importlib.machinery
import importlib.util
import json
import linecache
import os
import signal
import stat
import struct
import sys
import types

FRAME = struct.Struct("<Q")  # the length in front of every message and frame
TEXT_LIMIT = 2000            # characters of any text this process sends (an error, a name)

# Landlock (include/uapi/linux/landlock.h); the system call numbers are the same on every architecture
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_ACCESS_EXECUTE, _ACCESS_WRITE_FILE, _ACCESS_READ_FILE = 1 << 0, 1 << 1, 1 << 2
_ACCESS_REFER, _ACCESS_TRUNCATE, _ACCESS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_SCOPE_SIGNAL = 1 << 1
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_TOOL_CACHES = (".cache", ".nv", ".triton")  # made in an ancestor of the folder before it is closed
LANDLOCK_ENV_VAR = "NVFP4_EVALUATE_LANDLOCK"  # "off": Python's guards only (what a kernel without Landlock gets)


def pack_message(message: dict) -> bytes:
    """One message as sent: its length, then its JSON."""
    data = json.dumps(message, allow_nan=False, separators=(",", ":")).encode()
    return FRAME.pack(len(data)) + data


def refusal(name: str, package: str, missing: str) -> ModuleNotFoundError | None:
    """The error for importing `name` where `package` is out of reach (None if `name` is another
    package): the one guard of both the submission's process and an in-process load."""
    if name.partition(".")[0] == package:
        return ModuleNotFoundError(missing.format(name=name), name=name)
    return None


def text(value, limit: int = TEXT_LIMIT) -> str:
    """str(value), cut to `limit` characters; whatever its __str__ does, a string comes back."""
    try:
        result = value if type(value) is str else str(value)
        return result if type(result) is str and len(result) <= limit else str(result)[:limit]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        return "(it cannot be shown)"


def describe(err: BaseException) -> str:
    """What the submission did, in words: 'raised ValueError: ...', 'called sys.exit(0)'."""
    if isinstance(err, SystemExit):
        return text(f"called sys.exit({text(repr(err.code), 100)})")
    message = text(err)
    return text(f"raised {text(type(err).__name__, 200)}" + (f": {message}" if message else ""))


# ---------------------------------------------------------------------------------------------
# Landlock: the package's folder out of reach of this process and everything it starts


def _syscall(libc, number: int, *args) -> int:
    result = libc.syscall(ctypes.c_long(number), *args)
    return result if result >= 0 else -ctypes.get_errno()


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def landlock_abi() -> int:
    """The Landlock ABI this kernel offers (0: none)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        abi = _syscall(libc, _SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(abi, 0)


def package_folders(package: str, folder: str) -> list[str]:
    """`folder` and every other folder the import system here could load `package` from: a folder of
    that name on sys.path, or where a meta-path finder (an editable install's) would take it from."""
    found = [os.path.realpath(folder)]
    for entry in sys.path:
        candidate = os.path.realpath(os.path.join(entry or os.curdir, package))
        if os.path.isdir(candidate):
            found.append(candidate)
    for finder in sys.meta_path:
        try:
            spec = finder.find_spec(package, None)
        except Exception:  # noqa: BLE001 - a finder that fails finds nothing
            continue
        for location in getattr(spec, "submodule_search_locations", None) or ():
            found.append(os.path.realpath(location))
    return sorted(set(found))


def hide_folders(folders: list[str]) -> tuple[int, bool, str]:
    """Make `folders` unreachable for this process and its descendants with Landlock -> (Landlock ABI
    used, 0 if none; whether signals to processes outside are refused too; a note on what failed).

    Landlock grants, it cannot deny: every file-system right is handled, and granted beneath every
    entry of each folder on the way from / to a hidden folder, except those on the way. The folders
    on the way themselves get no rights (their listings and new entries are out of reach), and
    neither does an entry that resolves into a hidden folder or to a folder on the way."""
    if os.environ.get(LANDLOCK_ENV_VAR) == "off":
        return 0, False, f"{LANDLOCK_ENV_VAR}=off"
    abi = landlock_abi()
    if abi < 1:
        return 0, False, "the kernel offers no Landlock" if sys.platform.startswith("linux") else "Landlock needs Linux"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    handled = (1 << 13) - 1 | (_ACCESS_REFER if abi >= 2 else 0) | (_ACCESS_TRUNCATE if abi >= 3 else 0) | (
        _ACCESS_IOCTL_DEV if abi >= 5 else 0)
    file_rights = handled & (_ACCESS_EXECUTE | _ACCESS_WRITE_FILE | _ACCESS_READ_FILE | _ACCESS_TRUNCATE
                             | _ACCESS_IOCTL_DEV)
    scoped = abi >= 6
    attr = _RulesetAttr(handled, 0, _SCOPE_SIGNAL if scoped else 0)
    size = ctypes.sizeof(_RulesetAttr) if scoped else 8
    ruleset = _syscall(libc, _SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return 0, False, f"Landlock refused a ruleset ({os.strerror(-ruleset)})"
    try:
        hidden = [os.path.realpath(f) for f in folders]
        on_the_way = {os.sep}
        for folder in hidden:
            parts = [p for p in folder.split(os.sep) if p]
            on_the_way |= {os.sep + os.sep.join(parts[:i]) for i in range(1, len(parts))}
        home = os.path.realpath(os.path.expanduser("~"))
        if home in on_the_way:
            for name in _TOOL_CACHES:  # toolchains make these on first use: after this, nobody could
                os.makedirs(os.path.join(home, name), exist_ok=True)
        for current in sorted(on_the_way):
            with os.scandir(current) as entries:
                names = [e.name for e in entries]
            for name in names:
                path = os.path.join(current, name)
                real = os.path.realpath(path)
                if real in on_the_way or any(_inside(real, f) or _inside(f, real) for f in hidden):
                    continue  # a hidden folder, something in it, or a way back to a folder on the way
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # a dangling link, or gone
                try:
                    rights = handled if stat.S_ISDIR(os.fstat(fd).st_mode) else file_rights
                    rule = _PathBeneath(rights, fd)
                    _syscall(libc, _SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                             ctypes.byref(rule), ctypes.c_uint32(0))
                finally:
                    os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return 0, False, f"no_new_privs refused ({os.strerror(ctypes.get_errno())})"
        done = _syscall(libc, _SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
        if done < 0:
            return 0, False, f"Landlock refused to restrict this process ({os.strerror(-done)})"
    except OSError as err:
        return 0, False, f"the folders above {', '.join(folders)} could not be listed ({err.strerror or err})"
    finally:
        os.close(ruleset)
    return abi, scoped, ""


def _die_with_parent(parent: int) -> None:
    """Be killed when the evaluator dies (the setting does not pass to processes this one starts)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the setting took
        os._exit(1)


# ---------------------------------------------------------------------------------------------
# The runner


class Unreadable(Exception):
    """What the kernel returned (or left of its inputs) could not be copied out; the message says so."""


class Runner:
    """Answers the evaluator's requests; the submission's functions are called from here."""

    def __init__(self, requests: int, answers: int):
        self.requests, self.answers, self.torch = requests, answers, None
        self.kernel = None
        self.given = None
        self.timing = None
        self.device = None
        self.names: list[str] = []
        # the functions this runner relies on, taken before the submission can replace them
        self._write, self._readv, self._dumps = os.write, os.readv, json.dumps
        self._type, self._issubclass, self._str, self._getattr = type, issubclass, str, getattr

    # -- the wire

    def read_exact(self, n: int) -> bytearray:
        buffer = bytearray(n)
        view, done = memoryview(buffer), 0
        while done < n:
            got = self._readv(self.requests, [view[done:]])
            if got == 0:
                raise EOFError("the evaluator closed its request pipe")
            done += got
        return buffer

    def read_message(self):
        (n,) = FRAME.unpack(self.read_exact(FRAME.size))
        return json.loads(self.read_exact(n))

    def read_frame(self) -> bytearray:
        (n,) = FRAME.unpack(self.read_exact(FRAME.size))
        return self.read_exact(n)

    def write_all(self, data) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            view = view[self._write(self.answers, view):]

    def send(self, message: dict, frames=()) -> None:
        data = self._dumps(message, allow_nan=False, separators=(",", ":")).encode()
        self.write_all(FRAME.pack(len(data)) + data)
        for host in frames:  # CPU tensors, contiguous (checked by `serve`)
            nbytes = host.numel() * host.element_size()
            self.write_all(FRAME.pack(nbytes))
            if nbytes:
                self.write_all((ctypes.c_char * nbytes).from_address(host.data_ptr()))

    # -- requests

    def configure(self, config: dict, torch_module) -> None:
        torch = self.torch = torch_module
        self.device = torch.device(config["device"])
        base = torch._C.TensorBase  # an immutable type: its methods cannot be replaced, only shadowed in Tensor
        self.t = types.SimpleNamespace(  # what the copies out use, taken before the submission runs
            empty=torch.empty, frombuffer=torch.frombuffer, copy=base.copy_, detach=base.detach, set=base.set_,
            to=base.to, storage=base.untyped_storage, no_functions=torch._C.DisableTorchFunction,
            no_modes=torch.utils._python_dispatch._disable_current_modes, current_stream=torch.cuda.current_stream,
            set_stream=torch.cuda.set_stream, stream=torch.cuda.stream, synchronize=torch.cuda.synchronize,
            strided=torch.strided, uint8=torch.uint8, tensor=torch.Tensor)
        self.names = list(config["input_names"])
        timing = sys.modules["leaderboard_timing"] = types.ModuleType("leaderboard_timing")
        exec(compile(config["timing_source"], "<the timing code of nvfp4lib.bench.timing>", "exec"), timing.__dict__)
        del sys.modules["leaderboard_timing"]
        self.timing = timing
        task = sys.modules["task"] = types.ModuleType("task")
        exec(config["task_source"], task.__dict__)

    def load(self, request: dict) -> dict:
        path, source = request["path"], request["source"]
        linecache.cache[path] = (len(source), None, source.splitlines(True), path)  # for inspect.getsource
        spec = importlib.machinery.ModuleSpec("submission", None, origin=path)
        module = importlib.util.module_from_spec(spec)
        module.__file__ = path
        sys.modules["submission"] = module  # dataclasses and the CuTe DSL look the module up by name
        try:
            exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
        except BaseException:
            sys.modules.pop("submission", None)
            raise
        kernel = getattr(module, "custom_kernel", None)
        self.kernel = kernel
        answer = {"kind": "loaded", "has_kernel": callable(kernel),
                  "needs_cuda": bool(getattr(module, "NEEDS_CUDA", False)), "value": None}
        for key, name in (("submission_path", "SUBMISSION_PATH"), ("backend", "BACKEND")):
            value = getattr(module, name, None)
            answer[key] = None if value is None else text(value)
        if request["expression"] is not None:
            answer["value"] = text(eval(request["expression"], {"submission": module}), 65536)
        return answer

    def build(self, spec: dict, raw: bytearray):
        """An input tensor with the evaluator's layout from its storage bytes."""
        torch, t = self.torch, self.t
        flat = t.frombuffer(raw, dtype=t.uint8) if len(raw) else t.empty(0, dtype=t.uint8, device="cpu")
        flat = t.to(flat, self.device)
        return flat.view(getattr(torch, spec["dtype"].rpartition(".")[2])).as_strided(spec["shape"], spec["stride"])

    def _caller_stream(self):
        return self.t.current_stream() if self.device.type == "cuda" else None

    def _plain(self):
        """No torch function or dispatch mode, nor subclass handling, of the submission's in what follows."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.t.no_functions())
        stack.enter_context(self.t.no_modes())
        return stack

    def _bound(self, caller):
        """The kernel on the current tensors, leaving the caller's stream current whatever it set."""
        kernel, given, set_stream = self.kernel, self.given, self.t.set_stream

        def call():
            out = kernel(given)
            if caller is not None:
                set_stream(caller)
            return out
        return call

    def call(self, request: dict, frames: list[bytearray]) -> tuple[dict, list]:
        t = self.t
        with self._plain():
            fresh = [self.build(spec, raw) for spec, raw in zip(request["tensors"], frames)]
            if request["reuse"] and self.given is not None:  # the previous call's tensors, new values
                for dst, src in zip(self.given, fresh):
                    t.copy(self._storage_bytes(dst), self._storage_bytes(src))
            else:
                self.given = tuple(fresh)
            del fresh
            given = self.given
            ptrs = [t.storage(x).data_ptr() for x in given]
        caller = self._caller_stream()
        call, records, landing = self._bound(caller), [], self._landing()
        if request["timed"]:  # ranked mode: timed as the leaderboard times a call
            out, us = self.timing.time_one_call(
                call, after_end=lambda out: records.append(self.capture(out, caller, landing)))
        else:
            if caller is not None:
                t.synchronize()
            out, us = call(), None
            records.append(self.capture(out, caller, landing))
            if caller is not None:
                t.synchronize()  # the timed call ends synchronized already
        description, copies = self.settle(records[0])
        try:
            with self._plain():
                inputs, input_copies = self.inputs_after(given, request["tensors"], ptrs)
        except BaseException as err:  # noqa: BLE001 - e.g. a storage the kernel replaced
            raise Unreadable(f"its inputs could not be read here after the call: {describe(err)}") from None
        return ({"kind": "called", "us": us, "device": str(given[-1].device), "output": description,
                 "inputs": inputs}, copies + input_copies)

    def _landing(self):
        """Before a call: where the copy of its output made right after it lands (`capture`). On CUDA
        that is page-locked memory, and allocating page-locked memory is one of CUDA's implicit
        synchronizations: allocated after the call, it could let work the caller's stream never
        waited for finish before the copy is enqueued. None on a CPU (an allocation there waits
        for nothing)."""
        if self.device.type != "cuda":
            return None
        c, t = self.given[-1], self.t
        with self._plain():
            return t.empty(tuple(c.shape), dtype=c.dtype, device="cpu", pin_memory=True)

    def capture(self, out, stream, landing) -> dict:
        """Right after the call: what `out` is and, when it is a tensor like c, a copy of its values
        enqueued on the caller's stream (into `landing`, made before the call by `_landing`, so that
        nothing between the return and the copy waits for the device): ordered after the call, as the
        public harness's check is, and before anything the caller's stream never waited for."""
        t, c = self.t, self.given[-1]
        record = {"type": "object", "tensor": False, "exact": False, "layout": None, "device": None, "dtype": None,
                  "shape": None, "shares": [], "values": False}
        try:
            with self._plain():
                host = self._capture(out, stream, landing, record, t, c)
        except BaseException as err:  # noqa: BLE001 - a hostile object
            return {"description": record, "error": f"its output could not be read here: {describe(err)}"}
        if host is None:
            return {"description": record}
        record["values"] = True
        return {"description": record, "at_return": host, "out": out}

    def _capture(self, out, stream, landing, record, t, c):
        """`capture`'s work: fills `record` in, returns the copy of the values (None if none can be made)."""
        kind = self._type(out)
        record["type"] = text(self._getattr(kind, "__name__", "object"), 200)
        if not self._issubclass(kind, t.tensor):
            return None
        record["tensor"], record["exact"] = True, kind is t.tensor
        if not record["exact"]:
            return None
        record.update(layout=self._str(out.layout), device=self._str(out.device), dtype=self._str(out.dtype),
                      shape=[int(n) for n in out.shape])
        if out.layout != t.strided or out.device != c.device:
            return None
        storage = t.storage(out)
        start, size = storage.data_ptr(), storage.nbytes()
        for name, given in zip(self.names, self.given[:-1]):
            other = t.storage(given)
            begin, n = other.data_ptr(), other.nbytes()
            if size and n and start < begin + n and begin < start + size:
                record["shares"].append(name)
        if out.dtype != c.dtype or tuple(out.shape) != tuple(c.shape):
            return None
        if landing is not None:
            with t.stream(stream):
                return t.copy(landing, t.detach(out), non_blocking=True)
        return t.copy(t.empty(tuple(c.shape), dtype=c.dtype, device="cpu"), t.detach(out))

    def settle(self, record: dict) -> tuple[dict, list]:
        """After the device is idle: the output's description, and the copy made at return with one made now."""
        if "error" in record:
            raise Unreadable(record["error"])
        if not record["description"]["values"]:
            return record["description"], []
        c, t = self.given[-1], self.t
        with self._plain():
            settled = t.copy(t.empty(tuple(c.shape), dtype=c.dtype, device="cpu"), t.detach(record["out"]))
        return record["description"], [record["at_return"], settled]

    def _storage_bytes(self, x):
        t = self.t
        return t.set(t.empty(0, dtype=t.uint8, device=x.device), t.storage(x))

    def inputs_after(self, given, specs, ptrs) -> tuple[list, list]:
        """What each input is after the call, and the bytes of its storage when that has its size."""
        found, copies = [], []
        for x, spec, ptr in zip(given[:-1], specs, ptrs):
            storage = self.t.storage(x)
            entry = {"dtype": str(x.dtype), "shape": [int(n) for n in x.shape], "stride": [int(n) for n in x.stride()],
                     "offset": int(x.storage_offset()), "device": str(x.device), "nbytes": int(storage.nbytes()),
                     "moved": storage.data_ptr() != ptr, "bytes": storage.nbytes() == spec["nbytes"]}
            found.append(entry)
            if entry["bytes"]:
                raw = self._storage_bytes(x)
                copies.append(self.t.to(raw, "cpu") if raw.device.type != "cpu" else raw)
        return found, copies

    def time_calls(self, request: dict) -> tuple[dict, list]:
        """Benchmark mode: leaderboard time of the kernel on the last call's tensors; each call's output
        copied on the caller's stream right after the call and again after the device is idle."""
        timing, caller = self.timing, self._caller_stream()
        records, descriptions, copies = [], [], []
        landing = self._landing()  # one for every call, made before the first: each copy leaves it once settled

        def settled(out):
            description, pair = self.settle(records.pop())
            if pair and landing is not None:  # the device is idle: the copy in `landing` is complete
                with self._plain():
                    pair[0] = self.t.copy(self.t.empty(tuple(landing.shape), dtype=landing.dtype), landing)
            descriptions.append(description)
            copies.extend(pair)

        def time_call(f):
            return timing.time_one_call(f, after_end=lambda out: records.append(self.capture(out, caller, landing)))

        result = timing.leaderboard_time(self._bound(caller), timing.StoppingRule(**request["rule"]), after=settled,
                                         time_call=time_call)
        return ({"kind": "timed", "samples_us": [float(x) for x in result.samples],
                 "device": str(self.given[-1].device), "outputs": descriptions}, copies)

    def serve(self) -> None:
        handlers = {"load": lambda request, frames: (self.load(request), []), "call": self.call,
                    "time": lambda request, frames: self.time_calls(request)}
        while True:
            request = self.read_message()
            if request["kind"] == "stop":
                return
            frames = [self.read_frame() for _ in request.get("tensors", ())]
            try:
                answer, copies = handlers[request["kind"]](request, frames)
                if not all(c.device.type == "cpu" and c.is_contiguous() for c in copies):
                    raise Unreadable("a copy made here is not a contiguous CPU tensor (were torch's defaults changed?)")
            except Unreadable as err:
                answer, copies = {"kind": "error", "error": text(err.args[0])}, []
            except BaseException as err:  # noqa: BLE001 - whatever the submission does, the evaluator gets an answer
                answer, copies = {"kind": "error", "error": describe(err)}, []
            del frames
            answer["seq"] = request["seq"]
            self.send(answer, copies)


def _guard(config: dict, folders: list[str]) -> None:
    """The package out of reach of Python's import system and file opening in this process."""
    package, missing = config["package"], config["missing"]
    parents = {os.path.dirname(folder) for folder in folders}

    class RefusePackage(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            err = refusal(name, package, missing)
            if err is not None:
                raise err

    def refuse_package_files(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.realpath(os.fsdecode(args[0]))
            if any(_inside(path, folder) for folder in folders):
                raise PermissionError(f"{os.fsdecode(args[0])}: a submission cannot read {package}'s files")

    def reaches(entry: str) -> bool:
        real = os.path.realpath(entry or os.curdir)
        return real in parents or any(_inside(real, folder) for folder in folders)

    sys.path[:] = [p for p in sys.path if not reaches(p)]
    sys.path_importer_cache.clear()
    for name in [n for n in sys.modules if n.partition(".")[0] == package]:
        del sys.modules[name]
    sys.meta_path.insert(0, RefusePackage())
    sys.addaudithook(refuse_package_files)


def main(argv: list[str]) -> None:
    requests, answers, evaluator = int(argv[1]), int(argv[2]), int(argv[3])
    _die_with_parent(evaluator)
    runner = Runner(requests, answers)
    config = runner.read_message()
    folders = package_folders(config["package"], config["package_dir"])
    landlock, scoped, note = hide_folders(folders)
    import torch  # after Landlock: no thread of this process predates it

    runner.configure(config, torch)
    _guard(config, folders)
    runner.send({"kind": "ready", "pid": os.getpid(), "landlock": landlock, "signals_scoped": scoped, "note": note,
                 "hidden": folders})
    try:
        runner.serve()
    except EOFError:
        pass
    atexit._run_exitfuncs()  # the submission's exit handlers, then out without tearing down torch (~0.5 s)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - the submission may have replaced or closed them
            pass
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
