"""What a student's cell may use, written down: the allowlist that grader.judge.tampering holds each
of the student's cells to, read as text with `ast` (nothing is run).

Past 300 lines, one idea: the allowlist's tables beside the rules that read them, each rule read against its table.

Derived from what the labs' solution cells and their answers written differently
(tests/test_lab*_grading.py) use; tests/test_tampering.py scans all of them and fails on any flag.
Each import, attribute, builtin and call is one of three:

- **allowed**: torch and its public parts (torch.nn, torch.nn.functional, torch.autograd,
  torch.utils.checkpoint, torch.optim...), torch.distributed's functions that the labs' work is
  made of (`DIST_ALLOWED`), NumPy, `course`'s public modules (not course.grading nor
  course.recorder), the standard library's plain tools (`ALLOWED_MODULES`), what the lab's own
  cells import, the builtins of `ALLOWED_BUILTINS`, the dunders of `ALLOWED_DUNDERS`, and
  getattr/setattr/hasattr/delattr with a constant name;
- **listed**: outside the allowlist, but nothing in it can rewrite what the checks run on in
  the kernel (a subprocess, a socket, `os`, `sys.version`, `open`, a torch.distributed call the
  labs do not use): flagged for the instructor, and costs nothing;
- **reaching**: everything else, which can reach or rewrite the checks, REFERENCE, the recorder
  or a collective past what the scan reads: frames and their `f_globals`, `globals()`,
  `vars()`, `__dict__`, `sys.modules`, `gc`, `inspect`'s frames and unwrapping, `__wrapped__`
  and the other dunders of `REACHING_DUNDERS`, `object.__getattribute__`, an attribute or a
  module named by computed text (getattr, operator.attrgetter, importlib, `__import__`),
  exec, getattr or setattr taken as a value, a unix socket (the judge's kind) or the judge's
  variables named, `pickle` and the other modules of code (`ctypes`, `builtins`, `importlib`...), private parts
  of torch, NumPy and the course, torch.ops and torch's C library, a module no lab uses (the
  student's own file, say: the scan cannot read it), and a torch.Tensor subclass that
  redefines how it compares. Flagged, and the points of the test cells after it are withheld
  pending the instructor's review (grader.grading.submission).
"""
from __future__ import annotations

import ast
import builtins
from typing import NamedTuple


class Finding(NamedTuple):
    line: int
    what: str
    withholds: bool   # True: it can rewrite what a check reads, so the test cells after it earn nothing yet


# --- imports ----------------------------------------------------------------------------------------------
#: Modules (and everything under them) a student's cell may import, besides what the lab's own cells import.
ALLOWED_MODULES = {"torch", "numpy", "course", "math", "cmath", "itertools", "functools", "collections",
                   "dataclasses", "typing", "time", "contextlib", "warnings", "operator", "random", "statistics",
                   "heapq", "bisect", "enum", "abc", "copy", "string", "textwrap", "json", "re", "fractions",
                   "decimal", "numbers", "pprint", "tqdm", "matplotlib", "IPython.display"}
#: Outside the allowlist, but nothing in them reaches into the kernel's objects: listed, never withholding.
LISTED_MODULES = {"os", "sys", "subprocess", "socket", "threading", "multiprocessing", "concurrent", "queue",
                  "signal", "shutil", "tempfile", "pathlib", "glob", "io", "csv", "datetime", "logging",
                  "platform", "resource", "asyncio", "select", "selectors", "uuid", "hashlib", "base64", "zlib",
                  "struct", "array", "secrets", "timeit", "ast", "pandas", "scipy", "sklearn", "psutil"}
#: Under an allowed module, but reaching around what the checks read (the recorder, the judge, C code).
REACHING_PATHS = ("course.grading", "course.recorder", "torch.ops", "torch.library", "torch.hub", "torch.package",
                  "torch.utils.cpp_extension", "torch.overrides", "torch.serialization", "torch.load",
                  "torch.distributed.distributed_c10d", "torch.distributed.rpc", "numpy.ctypeslib")
#: course modules that hold other labs' answers: lab 9 composes labs 3 to 8's pieces (tensor and sequence
#: parallelism, context parallelism's gathered K and V, 1F1B, ZeRO-1) from them. A student's cell may use them only
#: in a lab whose own cells import them; anywhere else they answer an exercise with the course's code.
ANSWER_MODULES = ("course.gpt_stage", "course.grid_step")
#: Roots whose private parts (a `_name` anywhere under them) reach the machinery the checks run on.
PRIVATE_ROOTS = {"torch", "course", "numpy", "sys"}

# --- torch.distributed, sys, inspect, gc: their attributes one by one ------------------------------------------
#: torch.distributed's functions and types the labs' work is made of (course.recorder records them).
DIST_ALLOWED = {"init_process_group", "destroy_process_group", "is_initialized", "is_available", "get_rank",
                "get_world_size", "new_group", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv",
                "batch_isend_irecv", "P2POp", "broadcast", "all_reduce", "reduce", "all_gather",
                "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
                "all_to_all_single", "gather", "scatter", "ReduceOp", "group", "GroupMember", "Work", "get_backend",
                "get_global_rank", "get_group_rank", "get_process_group_ranks", "is_gloo_available",
                "is_nccl_available", "Backend", "all_gather_single", "reduce_scatter_single"}
#: Per module: the attributes allowed (None: any public one) and those that reach (the rest of a module
#: that is not allowed as a whole is reaching too).
SYS_ALLOWED = {"version", "version_info", "stdout", "stderr", "exit", "argv", "platform", "maxsize", "float_info",
               "getsizeof", "byteorder", "implementation", "executable"}
INSPECT_ALLOWED = {"signature", "Parameter", "Signature", "getsource", "getdoc", "isclass", "isfunction",
                   "ismethod", "iscoroutinefunction", "isgeneratorfunction"}
GC_ALLOWED = {"collect"}
MODULE_ATTRIBUTES = {"sys": SYS_ALLOWED, "inspect": INSPECT_ALLOWED, "gc": GC_ALLOWED}
#: os's ways to run another program: listed wherever os is imported (a lab's own cells may import it).
OS_RUNS = {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "kill", "killpg"}

# --- attributes ----------------------------------------------------------------------------------------------
#: Dunders honest code reads or calls.
ALLOWED_DUNDERS = {"__init__", "__name__", "__qualname__", "__doc__", "__module__", "__version__", "__len__",
                   "__iter__", "__next__", "__enter__", "__exit__", "__getitem__", "__contains__", "__repr__",
                   "__str__", "__class__", "__post_init__", "__file__"}
#: Dunders that reach a function's globals, an object's namespace or a wrapped original: rewriting power.
REACHING_DUNDERS = {"__wrapped__", "__globals__", "__code__", "__closure__", "__dict__", "__builtins__",
                    "__getattribute__", "__getattr__", "__setattr__", "__delattr__", "__subclasses__", "__mro__",
                    "__bases__", "__base__", "__self__", "__func__", "__defaults__", "__kwdefaults__", "__reduce__",
                    "__reduce_ex__", "__import__", "__loader__", "__spec__", "__traceback__", "__set_name__",
                    "__init_subclass__", "__class_getitem__", "__call__", "__eq__", "__torch_function__",
                    "__torch_dispatch__", "__setstate__", "__getstate__", "__new__", "__del__"}
#: A frame's or a traceback's way to the globals of every caller, the checks' included.
FRAME_ATTRIBUTES = {"f_globals", "f_locals", "f_back", "f_builtins", "f_code", "f_trace", "tb_frame", "tb_next",
                    "gi_frame", "cr_frame", "ag_frame", "gi_code", "cr_code", "_getframe", "_current_frames"}
#: A unix socket is how the kernel reaches the judge; distributed-training code never opens one itself.
UNIX_SOCKETS = {"AF_UNIX", "open_unix_connection", "start_unix_server", "create_unix_connection"}
#: Methods a torch.Tensor subclass may define without changing how the checks compare it.
TENSOR_SUBCLASS_DUNDERS = {"__init__", "__repr__", "__str__", "__post_init__"}

# --- builtins ------------------------------------------------------------------------------------------------
ALLOWED_BUILTINS = {
    "abs", "aiter", "all", "anext", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr",
    "classmethod", "complex", "dict", "divmod", "enumerate", "filter", "float", "format", "frozenset", "getattr",
    "hasattr", "setattr", "delattr", "hash", "hex", "id", "int", "isinstance", "issubclass", "iter", "len", "list",
    "map", "max", "memoryview", "min", "next", "object", "oct", "ord", "pow", "print", "property", "range", "repr",
    "reversed", "round", "set", "slice", "sorted", "staticmethod", "str", "sum", "super", "tuple", "type", "zip",
    "display", "None", "True", "False", "NotImplemented", "Ellipsis", "__name__",
    *(name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException))}
#: Builtins (and IPython's) that hand out the kernel's namespaces or run text: reaching, whatever binds them.
REACHING_BUILTINS = {"globals": "reads globals(), the kernel's namespace, where the checks are",
                     "locals": "reads locals(), a namespace the scan does not follow",
                     "vars": "reads vars(), an object's namespace (its __dict__)",
                     "get_ipython": "reaches the IPython shell, which holds the kernel's namespace and hooks",
                     "__builtins__": "reaches __builtins__", "__build_class__": "reaches __build_class__"}
RUNS_TEXT = {"exec", "eval", "compile"}
#: What IPython itself binds in a kernel (its history and shell): a cell may name them; `get_ipython` is reaching.
IPYTHON_NAMES = {"In", "Out", "_ih", "_oh", "_dh", "_i", "_ii", "_iii", "_", "__", "___", "exit", "quit"}
#: How the kernel finds the judge (course.grading's COURSE_REFERENCE_JUDGE, ...): named, it is talked to directly.
JUDGE_WORDS = "COURSE_REFERENCE"
NAMED_ACCESS = {"getattr": "reads", "setattr": "sets", "delattr": "deletes", "hasattr": "looks for"}


def module_tier(path: str, lab_modules: set[str]) -> Finding | None:
    """None if a student's cell may import `path`; else what the scan says, line 0."""
    if path in lab_modules or any(m.startswith(path + ".") for m in lab_modules):
        return None
    if path.startswith(REACHING_PATHS) or _private(path):
        return Finding(0, f"imports {path}, which reaches around what the checks read", True)
    if answers := answers_tier(path, lab_modules):
        return answers
    if any(path == m or path.startswith(m + ".") for m in lab_modules | ALLOWED_MODULES):
        return None
    if path.split(".")[0] in LISTED_MODULES:
        return Finding(0, f"imports {path}, outside what the labs' code uses (it rewrites nothing graded)", False)
    return Finding(0, f"imports {path}, a module no lab uses, which the scan cannot read", True)


def answers_tier(path: str | None, lab_modules: set[str]) -> Finding | None:
    """A Finding if `path` is in one of ANSWER_MODULES and the lab's own cells import none of them."""
    module = next((m for m in ANSWER_MODULES if path and (path == m or path.startswith(m + "."))), None)
    if module is None or module in lab_modules:
        return None
    return Finding(0, f"uses {module}, the course's own answers to other labs' exercises (lab 9's pieces): "
                      "this lab's exercises are to be written, not imported", True)


def _private(path: str) -> bool:
    parts = path.split(".")
    return parts[0] in PRIVATE_ROOTS and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def attribute_tier(full: str | None, attr: str) -> Finding | None:
    """None if a student's cell may use `.attr` (of `full`, the dotted name it resolves to, if any)."""
    if attr in UNIX_SOCKETS:
        return Finding(0, f"uses {attr}, a unix socket, the judge's kind: it can talk to the judge around "
                          "REFERENCE.check", True)
    if attr in FRAME_ATTRIBUTES:
        return Finding(0, f"reaches a frame ({attr}), whose globals hold the checks", True)
    if attr in REACHING_DUNDERS:
        return Finding(0, f"uses {attr}, which reaches past what the scan reads", True)
    if attr.startswith("__") and attr.endswith("__") and attr not in ALLOWED_DUNDERS:
        return Finding(0, f"uses {attr}, outside what the labs' code uses", False)
    if full is None:
        return None
    parent, _, name = full.rpartition(".")
    if full.startswith(REACHING_PATHS) or _private(full):
        return Finding(0, f"uses {full}, which reaches around what the checks read", True)
    module = parent.rpartition(".")[2]   # `os.sys.modules` is sys's too
    if module in MODULE_ATTRIBUTES and name not in MODULE_ATTRIBUTES[module]:
        return Finding(0, f"uses {full}, which reaches into the kernel past what the scan reads", True)
    if parent == "torch.distributed" and name not in DIST_ALLOWED:
        return Finding(0, f"uses {full}, a part of torch.distributed the labs do not use", False)
    if parent == "os" and (name in OS_RUNS or name.startswith(("exec", "spawn"))):
        return Finding(0, f"uses {full}, which runs another program (it rewrites nothing graded)", False)
    if name.startswith("_") and not name.startswith("__") and parent.split(".")[0] in LISTED_MODULES:
        return Finding(0, f"uses {full}, outside what the labs' code uses", False)
    return None


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """'torch.distributed.all_reduce' for `dist.all_reduce`, through the names imports and aliases bind;
    None for anything rooted elsewhere (the student's own objects). A loop: a long chain is no nesting."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id], *reversed(parts)])
    return None


def _students_own(node: ast.AST | None, aliases: dict[str, str]) -> bool:
    """Whether node is rooted in a name the student bound (not an import, an alias or a builtin)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name) and node.id not in aliases and not hasattr(builtins, node.id)


def bound_names(trees: list[ast.AST]) -> set[str]:
    """Every name any of the trees binds (assigned, an argument, a def, an import...): not a builtin there."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
            elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
                names.add(node.name)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                names.update(node.names)
    return names


def _constant_text(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def outside(tree: ast.AST, aliases: dict[str, str], bound: set[str], lab_modules: set[str]) -> list[Finding]:
    """What in `tree` is outside the allowlist, each at its line. Walks the tree in a loop (ast.walk),
    so a long flat expression (600 strings added together) is read like any other.

    aliases: name -> the dotted name it stands for (imports, and the scan's aliases);
    bound: the names the notebook binds anywhere (so not the builtin of that name);
    lab_modules: what the lab's own cells import."""
    found = []

    def add(node, finding):
        if finding:
            found.append(finding._replace(line=getattr(node, "lineno", 0)))

    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            tiers = [t for t in (module_tier(alias.name, lab_modules) for alias in node.names) if t]
            worst = [t for t in tiers if t.withholds] or tiers
            if worst:   # `import os, socket`: one finding that names both
                names = ", ".join(t.what.split(",")[0].removeprefix("imports ") for t in worst)
                add(node, worst[0]._replace(what=f"imports {names}," + worst[0].what.split(",", 1)[1]))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            add(node, module_tier(node.module, lab_modules))
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full not in lab_modules and alias.name != "*":
                    add(node, attribute_tier(full, alias.name) or module_tier(full, lab_modules))
        elif isinstance(node, ast.Attribute):
            full = _dotted(node, aliases)
            add(node, attribute_tier(full, node.attr) or answers_tier(full, lab_modules))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            add(node, _name(node, bound, id(node) in called))
        elif isinstance(node, ast.Call):
            add(node, _call(node, aliases, lab_modules))
        elif isinstance(node, ast.ClassDef):
            add(node, _subclass(node, aliases))
        elif isinstance(node, ast.Constant) and JUDGE_WORDS in str(node.value):
            add(node, Finding(0, "names the judge's variables (COURSE_REFERENCE_...): it talks to the judge "
                                 "around REFERENCE.check", True))
    return found


def _name(node: ast.Name, bound: set[str], is_called: bool) -> Finding | None:
    name = node.id
    if name in REACHING_BUILTINS:
        return Finding(0, REACHING_BUILTINS[name], True)
    if name in RUNS_TEXT and not is_called:
        return Finding(0, f"takes {name} as a value, which runs computed text the scan cannot read", True)
    if name in NAMED_ACCESS and name != "hasattr" and not is_called and name not in bound:
        return Finding(0, f"takes {name} as a value, which the scan cannot follow", True)
    if name in bound or (name == "__import__" and is_called):   # a call: its name is read by _call
        return None
    if name.startswith("__") and name not in ALLOWED_BUILTINS:
        return Finding(0, f"uses {name}, which reaches past what the scan reads", True)
    if hasattr(builtins, name) and name not in ALLOWED_BUILTINS and name not in RUNS_TEXT:
        return Finding(0, f"uses the builtin {name}, outside what the labs' code uses", False)
    if not hasattr(builtins, name) and name not in ALLOWED_BUILTINS and name not in IPYTHON_NAMES:
        # Nothing the student wrote nor the released lab binds it: in the graded run only a hidden test's
        # variable can answer to it (the judge's seed, a case drawn from it), and no answer needs one.
        return Finding(0, f"reads {name}, which no cell of the notebook binds: under grading only a hidden "
                          "test's variable has that name", True)
    return None


def _call(node: ast.Call, aliases: dict[str, str], lab_modules: set[str]) -> Finding | None:
    func = _dotted(node.func, aliases) or (node.func.id if isinstance(node.func, ast.Name) else "")
    func = func.removeprefix("builtins.")
    first = node.args[0] if node.args else None
    if func in NAMED_ACCESS and len(node.args) >= 2:
        name = _constant_text(node.args[1])
        if name is None:
            # Setting by a computed name can rewrite anything; reading can only reach around the checks
            # from what the imports and the lab's names lead to, not from the student's own objects.
            reaches = func in ("setattr", "delattr") or (func == "getattr" and not _students_own(first, aliases))
            return Finding(0, f"{NAMED_ACCESS[func]} an attribute by a computed name", reaches)
        base = _dotted(first, aliases)
        return attribute_tier(f"{base}.{name}" if base else None, name)
    if func in ("operator.attrgetter", "operator.methodcaller"):
        names = [_constant_text(a) for a in (node.args if func.endswith("attrgetter") else node.args[:1])]
        if any(n is None for n in names):
            return Finding(0, f"calls {func} with a computed name", True)
        return next(filter(None, (attribute_tier(None, part) for n in names for part in n.split("."))), None)
    if func in RUNS_TEXT:
        if _constant_text(first) is None:
            return Finding(0, f"calls {func} on computed text", True)
        return Finding(0, f"calls {func}, outside what the labs' code uses (its text is scanned too)", False)
    if func in ("__import__", "importlib.import_module"):
        if _constant_text(first) is None:
            return Finding(0, f"calls {func} on computed text", True)
        return module_tier(first.value, lab_modules)
    return None


def _subclass(node: ast.ClassDef, aliases: dict[str, str]) -> Finding | None:
    """A class that changes how torch's tensors compare or dispatch: the checks compare tensors."""
    defined = {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    bases = [_dotted(base, aliases) or "" for base in node.bases]
    dispatch = defined & {"__torch_function__", "__torch_dispatch__"}
    if dispatch:
        return Finding(0, f"defines {min(dispatch)}, which changes what torch's calls do", True)
    redefined = sorted(n for n in defined - TENSOR_SUBCLASS_DUNDERS if n.startswith("__") and n.endswith("__"))
    torch_base = next((b for b in bases if b.startswith(("torch.", "numpy."))
                       and not b.startswith(("torch.nn.", "torch.autograd."))), None)
    if torch_base and redefined:
        return Finding(0, f"subclasses {torch_base} and redefines {redefined[0]}, which the checks compare with", True)
    return None
