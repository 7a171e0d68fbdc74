"""ms-swift's argument names, known at plan time without importing ms-swift.

Validating `swift.<argument>=value` overrides on the login node must be fast, but
importing ms-swift's argument classes takes 10-15 s (they pull in torch and
transformers). So the names are extracted once per ms-swift version into a JSON file:
shipped ones live in `swiftslurm/data/swift_args-<version>.json`; for a version with
no shipped file, the file is generated on first use into the user cache
(`$SWIFTSLURM_CACHE`, default `~/.cache/swiftslurm`) by importing ms-swift once.

Extraction: `swift sft|pt|rlhf` parse their CLI with transformers' HfArgumentParser
over one dataclass each (`SftArguments`, `PretrainArguments`, `RLHFArguments`); every
dataclass field with `init=True` is a `--name` option. `megatron sft|pt|rlhf` use
`swift.megatron.arguments.Megatron*Arguments`, whose module imports megatron-core and
mcore_bridge at the top; when those are missing, the megatron classes' own fields are
read from their source with `ast` and combined with their importable bases (e.g.
`swift.arguments.BaseArguments`) in method resolution order, as `dataclasses` does.

Plan-time API: `valid_args(command)`, `suggest(name, command)`,
`close_matches(name, command)`, `unknown_arg_message(name, command)`, `arg_specs(command)`.
`python -m swiftslurm.planning.swift_args --generate [--output PATH]` regenerates the file.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
FILE_PREFIX = "swift_args-"
FORMAT_VERSION = 1

# Command -> (module, class). `swift pt` parses PretrainArguments, a subclass of
# SftArguments with other defaults; the megatron entry points mirror swift's.
COMMANDS: dict[str, tuple[str, str]] = {
    "swift sft": ("swift.arguments", "SftArguments"),
    "swift pt": ("swift.arguments", "PretrainArguments"),
    "swift rlhf": ("swift.arguments", "RLHFArguments"),
    "megatron sft": ("swift.megatron.arguments", "MegatronSftArguments"),
    "megatron pt": ("swift.megatron.arguments", "MegatronPretrainArguments"),
    "megatron rlhf": ("swift.megatron.arguments", "MegatronRLHFArguments"),
}

# Spellings that are valid elsewhere, so the hint points at the right name even when the
# strings are not similar enough for difflib: ms-swift 3's `train_type`, the `max_packed_length`
# that field guides write for `packing_length`, and the
# HF-trainer names that `megatron sft|pt` spell the Megatron way. A hint is only given
# when its target is valid for the command at hand.
RENAMED: dict[str, str] = {
    "train_type": "tuner_type",
    "max_packed_length": "packing_length",
    "max_steps": "train_iters",
    "learning_rate": "lr",
    "per_device_train_batch_size": "micro_batch_size",
    # The field guides' Megatron-LM and older spellings.
    "tp_size": "tensor_model_parallel_size",
    "tp_degree": "tensor_model_parallel_size",
    "pp_size": "pipeline_model_parallel_size",
    "pp_degree": "pipeline_model_parallel_size",
    "ep_size": "expert_model_parallel_size",
    "ep_degree": "expert_model_parallel_size",
    "sp_size": "sequence_parallel",
    "save_interval": "save_steps",
    "log_interval": "logging_steps",
    "use_flash_attn": "attn_impl",
    "log_to_wandb": "report_to",
    "prefetch_factor": "dataloader_prefetch_factor",
    "tensorboard_output_dir": "logging_dir",
}


class ArgSpec(NamedTuple):
    """One `--name` option: its annotation, the repr() of its default (None: required) and the values its parser
    accepts (None: any of its type). Choices are what HfArgumentParser derives from a Literal or Enum annotation;
    tables generated before they were recorded carry none, and Literal annotations still give them."""

    type: str
    default: str | None
    choices: tuple[Any, ...] | None = None


# --------------------------------------------------------------------------- plan time


@cache
def installed_version() -> str | None:
    """ms-swift's version from package metadata (no import of ms-swift), or None. Cached: reading the metadata
    takes ~5 ms and a plan asks once per ms-swift argument, which made it most of a sweep point's planning."""
    try:
        return importlib.metadata.version("ms-swift")
    except importlib.metadata.PackageNotFoundError:
        return None


def cache_dir() -> Path:
    """`$SWIFTSLURM_CACHE`, else `~/.cache/swiftslurm` (shared with swiftslurm.tiny)."""
    root = os.environ.get("SWIFTSLURM_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "swiftslurm"


def shipped_versions() -> list[str]:
    """Versions with a JSON file in `swiftslurm/data/`, oldest first."""
    versions = [p.name[len(FILE_PREFIX) : -len(".json")] for p in DATA_DIR.glob(f"{FILE_PREFIX}*.json")]
    return sorted(versions, key=_version_key)


def spec_path(version: str | None = None) -> Path:
    """The JSON file for `version` (default: the installed one), generating it if needed.

    Order: shipped file, then user cache, then generate into the user cache (imports
    ms-swift, so only possible when `version` is the installed one). With ms-swift not
    installed at all, the newest shipped file is used, with a warning.
    """
    installed = installed_version()
    if version is None:
        version = installed
    if version is None:
        shipped = shipped_versions()
        if not shipped:
            raise LookupError("ms-swift is not installed and swiftslurm ships no argument list")
        warnings.warn(f"ms-swift is not installed; checking arguments against ms-swift {shipped[-1]}", stacklevel=2)
        version = shipped[-1]
    for candidate in (DATA_DIR / _file_name(version), cache_dir() / _file_name(version)):
        if candidate.is_file():
            return candidate
    if version != installed:
        raise LookupError(
            f"no argument list for ms-swift {version} (installed: {installed}); shipped: {shipped_versions()}"
        )
    target = cache_dir() / _file_name(version)
    _generate_in_subprocess(target)
    return target


def _generate_in_subprocess(target: Path) -> None:
    """Run `--generate` in a child, so the planner never imports ms-swift (and torch)."""
    env = dict(os.environ)
    # The child must import this very swiftslurm, installed or not.
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "swiftslurm.planning.swift_args", "--generate", "--output", str(target)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not target.is_file():
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        raise RuntimeError(f"generating the ms-swift argument list failed ({' '.join(cmd)}):\n{tail}")


@cache
def load_specs(version: str | None = None) -> dict[str, dict[str, ArgSpec]]:
    """command -> {argument name -> ArgSpec} for `version` (default: installed)."""
    with open(spec_path(version), encoding="utf-8") as f:
        data = json.load(f)
    if data.get("format") != FORMAT_VERSION:
        raise ValueError(f"unsupported swift_args format {data.get('format')!r}")
    return _expand(data)


def _expand(data: dict[str, Any]) -> dict[str, dict[str, ArgSpec]]:
    """Undo `_compact`: a full {name -> ArgSpec} table per command."""
    shared = data["args"]
    specs: dict[str, dict[str, ArgSpec]] = {}
    for command, entry in data["commands"].items():
        own = entry.get("overrides", {})
        names = entry["names"] if "names" in entry else data["commands"][entry["same_names_as"]]["names"]
        specs[command] = {name: _spec(own.get(name, shared[name])) for name in names}
    return specs


def _spec(row: list[Any]) -> ArgSpec:
    """[type, default] or [type, default, choices] from the JSON file."""
    return ArgSpec(row[0], row[1], tuple(row[2]) if len(row) > 2 and row[2] is not None else None)


def normalize_command(command: str) -> str:
    """'sft' -> 'swift sft'; 'megatron  pt' -> 'megatron pt'."""
    words = command.split()
    if len(words) == 1:
        words = ["swift", *words]
    normalized = " ".join(words)
    if normalized not in COMMANDS:
        raise KeyError(f"unknown command {command!r}; known: {sorted(COMMANDS)}")
    return normalized


def normalize_name(name: str) -> str:
    """HfArgumentParser accepts `--foo-bar` for field `foo_bar`; compare in the field spelling."""
    return name.strip().lstrip("-").replace("-", "_")


def arg_specs(command: str, version: str | None = None) -> dict[str, ArgSpec]:
    """{name -> ArgSpec} of `command` ('swift sft', 'megatron pt', or just 'sft')."""
    command = normalize_command(command)
    specs = load_specs(version)
    if command not in specs:
        raise KeyError(f"the argument list for ms-swift {version or installed_version()} lacks {command!r}")
    return specs[command]


def valid_args(command: str, version: str | None = None) -> frozenset[str]:
    """The argument names `command` accepts (as `--name value`)."""
    return frozenset(arg_specs(command, version))


def close_matches(name: str, command: str, n: int = 3, version: str | None = None) -> list[str]:
    """Up to `n` valid arguments closest to `name`, best first (`[name]` if it is valid).

    A known rename (e.g. `train_type` -> `tuner_type`) is the only hint. Otherwise the
    runners-up are kept only when about as close as the best match, so a plain typo
    gets one hint and an ambiguous name (`per_device_batch_size`) gets the candidates.
    """
    name = normalize_name(name)
    valid = valid_args(command, version)
    if name in valid:
        return [name]
    renamed = RENAMED.get(name)
    if renamed in valid:
        return [renamed]
    similar = difflib.get_close_matches(name, sorted(valid), n=n, cutoff=0.6)
    if not similar:
        return []
    best = difflib.SequenceMatcher(None, name, similar[0]).ratio()
    return [m for m in similar if difflib.SequenceMatcher(None, name, m).ratio() >= best - 0.05]


def suggest(name: str, command: str, version: str | None = None) -> str | None:
    """The valid argument closest to `name`, or None when nothing is close.

    A valid `name` suggests itself.
    """
    matches = close_matches(name, command, n=1, version=version)
    return matches[0] if matches else None


def unknown_arg_message(name: str, command: str, version: str | None = None) -> str | None:
    """None if `name` is a valid argument of `command`, else an error message with hints."""
    normalized = normalize_name(name)
    if normalized in valid_args(command, version):
        return None
    msg = f"unknown ms-swift argument {name!r} for `{normalize_command(command)}`"
    hints = close_matches(normalized, command, version=version)
    if not hints:
        return msg
    return f"{msg}; did you mean {' or '.join(repr(h) for h in hints)}?"


# Values HfArgumentParser's string_to_bool accepts (transformers.hf_argparser), any case.
BOOL_WORDS = frozenset({"yes", "no", "true", "false", "t", "f", "y", "n", "1", "0"})
_SCALARS = {"bool": "true or false", "int": "a whole number (int)", "float": "a number (float)"}


def _shape(annotation: str) -> tuple[str | None, bool]:
    """(scalar kind: 'bool' | 'int' | 'float' | None for anything else, whether it takes several values)."""
    text = re.sub(r"^Optional\[(.*)\]$", r"\1", annotation.replace(" ", "")).removesuffix("|None")
    several = re.match(r"^(List|list|Sequence|Tuple|tuple)\[(.*)\]$", text)
    inner = several.group(2).removesuffix(",...") if several else text
    return (inner if inner in _SCALARS else None), bool(several)


def literal_choices(annotation: str) -> tuple[Any, ...] | None:
    """The values of a `Literal[...]` annotation (AST-read tables record no choices of their own)."""
    found = re.search(r"Literal\[(.*?)\]", annotation)
    if not found:
        return None
    try:
        values = ast.literal_eval(f"({found.group(1)},)")
    except (ValueError, SyntaxError):
        return None
    return tuple(values)


def _fits(kind: str | None, value: Any) -> bool:
    """Whether the parser reads ``value``, as swiftslurm renders it into argv, as ``kind``."""
    text = "true" if value is True else "false" if value is False else str(value)
    if kind == "bool":
        return text.lower() in BOOL_WORDS
    parse = {"int": int, "float": float}.get(kind or "")
    if parse is None:
        return True
    try:
        parse(text)
    except ValueError:
        return False
    return True


def value_error(name: str, value: Any, command: str, version: str | None = None) -> str | None:
    """Why ms-swift's parser would refuse ``swift.<name>=value`` (its type and choices), or None. A value that
    fails here would stop the job after its queue wait, at ms-swift's argument parsing."""
    spec = arg_specs(command, version).get(name)
    if spec is None:
        return None
    kind, several = _shape(spec.type)
    where = f"ms-swift {version or installed_version()} `{normalize_command(command)}` ({spec.type})"
    if isinstance(value, dict):  # rendered as JSON: a mapping argument reads it, a number or a switch does not
        if kind is None:
            return None
        return f"swift.{name}={value} is a mapping, but {where} takes {_SCALARS[kind]}. {_example(name, spec)}"
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(values) > 1 and not several:
        return f"swift.{name}={value} gives several values, but {where} takes one. HINT: give one value."
    if not values and not several:  # `--name` with nothing after it: ms-swift's parser stops the job
        return f"swift.{name}=[] gives no value, but {where} takes one. {_example(name, spec)}"
    choices = [str(c) for c in spec.choices or literal_choices(spec.type) or () if c is not None]
    for item in values:
        if choices and str(item) not in choices:
            close = [c for c in choices if c.startswith(str(item))] or difflib.get_close_matches(str(item), choices, 1)
            fix = f"Did you mean `swift.{name}={close[0]}`? " if close else ""
            return f"swift.{name}={item!r} is not a value {where} accepts. {fix}HINT: one of: {', '.join(choices)}."
        if not choices and not _fits(kind, item):
            return (
                f"swift.{name}={item!r} is not {_SCALARS[kind or 'bool']}, as {where} requires. {_example(name, spec)}"
            )
    return None


def _example(name: str, spec: ArgSpec) -> str:
    kind, _ = _shape(spec.type)
    default = spec.default if spec.default not in (None, "None") else {"int": "10", "float": "1e-4"}.get(kind or "")
    return f"HINT: e.g. swift.{name}={(default or 'true').lower() if kind == 'bool' else default}."


# ----------------------------------------------------------------------- generation


def generate_specs() -> dict[str, Any]:
    """Import ms-swift and extract every command's arguments (slow: 10-20 s)."""
    commands: dict[str, dict[str, ArgSpec]] = {}
    sources: dict[str, str] = {}
    for command, (module, cls_name) in COMMANDS.items():
        try:
            commands[command], sources[command] = _extract(module, cls_name)
        except Exception as e:  # one command that cannot be read must not hide the others
            warnings.warn(f"cannot extract the arguments of `{command}`: {e!r}", stacklevel=2)
    version = installed_version()
    return _compact(commands, sources, version)


def _extract(module: str, cls_name: str) -> tuple[dict[str, ArgSpec], str]:
    """Fields of `module.cls_name`: imported if possible, else read from source."""
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except ImportError:
        if not module.startswith("swift.megatron"):
            raise
        # swift.megatron imports megatron-core at module level; read the source instead.
        return _AstResolver().fields(module, cls_name), "ast"
    return _dataclass_specs(cls), "import"


def _dataclass_specs(cls: type) -> dict[str, ArgSpec]:
    choices = _parser_choices(cls)
    return {f.name: _field_spec(f)._replace(choices=choices.get(f.name)) for f in dataclasses.fields(cls) if f.init}


def _parser_choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """{name: choices} as the parser ms-swift uses (transformers' HfArgumentParser) builds them: from Literal
    annotations and from Enums such as `optim`'s OptimizerNames, which the annotation's text does not list."""
    from transformers import HfArgumentParser

    # HfArgumentParser rewrites the annotations of the (shared, inherited) Field objects in place.
    annotations = [(f, f.type) for f in dataclasses.fields(cls)]
    try:
        parser = HfArgumentParser([cls])  # type: ignore[list-item]  # ms-swift's argument classes are dataclasses
    finally:
        for f, annotation in annotations:
            f.type = annotation
    return {a.dest: tuple(a.choices) for a in parser._actions if a.choices and a.dest != "help"}


def _field_spec(f: dataclasses.Field[Any]) -> ArgSpec:
    if f.default is not dataclasses.MISSING:
        default: str | None = _safe_repr(f.default)
    elif f.default_factory is not dataclasses.MISSING:
        try:
            default = _safe_repr(f.default_factory())
        except Exception:  # a factory that needs context; keep its name
            default = f"<factory {getattr(f.default_factory, '__name__', '?')}>"
    else:
        default = None
    return ArgSpec(_type_str(f.type), default)


def _type_str(tp: Any) -> str:
    """'Optional[str]'-style text for an annotation object or string."""
    if isinstance(tp, str):
        return tp
    if isinstance(tp, type) and not getattr(tp, "__args__", None):
        return tp.__name__
    return re.sub(r"\b(typing|typing_extensions|collections\.abc)\.", "", repr(tp)).replace("NoneType", "None")


def _safe_repr(value: Any) -> str:
    text = repr(value)
    # Memory addresses would change on every generation; keep the type only.
    return re.sub(r"<([\w.]+) object at 0x[0-9a-f]+>", r"<\1>", text)


class _AstResolver:
    """Dataclass fields of classes that cannot be imported, read from their source.

    Classes in `swift.megatron.*` are parsed; any other base is imported (e.g.
    `swift.arguments.BaseArguments`) and contributes the fields it defines itself.
    Fields are merged over the C3 method resolution order, like `dataclasses` does.
    """

    def __init__(self, ast_prefix: str = "swift.megatron") -> None:
        self.ast_prefix = ast_prefix  # modules under it are parsed, the rest imported
        spec = importlib.util.find_spec("swift")
        if spec is None or spec.origin is None:
            raise ImportError("ms-swift is not installed")
        self.swift_root = Path(spec.origin).parent
        self.modules: dict[str, ast.Module] = {}
        self.packages: set[str] = set()  # modules parsed from an __init__.py

    def fields(self, module: str, cls_name: str) -> dict[str, ArgSpec]:
        specs: dict[str, ArgSpec] = {}
        # `module` may be a package that re-exports the class from a submodule.
        for node in reversed(self._mro(self._resolve(module, cls_name))):
            specs.update(self._own_fields(node))
        return specs

    # A class is ("ast", module, name) or ("py", class object).
    def _mro(self, node: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if node[0] == "py":
            return [("py", c) for c in node[1].__mro__]
        bases = self._bases(node[1], node[2])
        return [node, *_c3_merge([self._mro(b) for b in bases] + [bases])]

    def _bases(self, module: str, cls_name: str) -> list[tuple[Any, ...]]:
        cls = self._class_def(module, cls_name)
        return [self._resolve(module, ast.unparse(b)) for b in cls.bases]

    def _resolve(self, module: str, name: str) -> tuple[Any, ...]:
        """Find what `name` refers to inside `module` (local class or import)."""
        tree = self._parse(module)
        for stmt in tree.body:
            if isinstance(stmt, ast.ClassDef) and stmt.name == name:
                return ("ast", module, name)
            if isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name:
                        package = module if module in self.packages else module.rpartition(".")[0]
                        target = _absolute_module(package, stmt.module, stmt.level)
                        if target.startswith(self.ast_prefix):
                            return self._resolve(target, alias.name)
                        return ("py", getattr(importlib.import_module(target), alias.name))
        raise LookupError(f"cannot resolve base {name!r} in {module}")

    def _own_fields(self, node: tuple[Any, ...]) -> dict[str, ArgSpec]:
        if node[0] == "py":
            cls: type = node[1]
            if not dataclasses.is_dataclass(cls):
                return {}
            own = inspect.get_annotations(node[1])  # only this class's, not inherited ones
            return {f.name: _field_spec(f) for f in dataclasses.fields(cls) if f.name in own and f.init}
        specs = {}
        for stmt in self._class_def(node[1], node[2]).body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            annotation = ast.unparse(stmt.annotation)
            if annotation.startswith(("ClassVar", "typing.ClassVar", "InitVar")):
                continue
            default, init = _ast_default(stmt.value)
            if init:
                specs[stmt.target.id] = ArgSpec(annotation, default)
        return specs

    def _class_def(self, module: str, cls_name: str) -> ast.ClassDef:
        for stmt in self._parse(module).body:
            if isinstance(stmt, ast.ClassDef) and stmt.name == cls_name:
                return stmt
        raise LookupError(f"no class {cls_name} in {module}")

    def _parse(self, module: str) -> ast.Module:
        if module not in self.modules:
            rel = Path(*module.split(".")[1:])
            path = self.swift_root / rel / "__init__.py"
            if path.is_file():
                self.packages.add(module)
            else:
                path = (self.swift_root / rel).with_suffix(".py")
            self.modules[module] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        return self.modules[module]


def _absolute_module(package: str, target: str | None, level: int) -> str:
    """Resolve `from <level dots><target> import ...` written inside `package`."""
    if level == 0:
        return target or ""
    parts = package.split(".")
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([target] if target else []))


def _c3_merge(seqs: list[list[Any]]) -> list[Any]:
    result: list[Any] = []
    seqs = [list(s) for s in seqs if s]
    while seqs:
        for seq in seqs:
            head = seq[0]
            if not any(head in s[1:] for s in seqs):
                break
        else:
            raise TypeError("inconsistent method resolution order")
        result.append(head)
        seqs = [[c for c in s if c != head] for s in seqs]
        seqs = [s for s in seqs if s]
    return result


def _ast_default(value: ast.expr | None) -> tuple[str | None, bool]:
    """(repr of the default or its source text, whether the field is an __init__ argument)."""
    if value is None:
        return None, True
    if isinstance(value, ast.Call) and ast.unparse(value.func) in ("field", "dataclasses.field"):
        kwargs = {kw.arg: kw.value for kw in value.keywords if kw.arg}
        init_kw = kwargs.get("init")
        init = not (isinstance(init_kw, ast.Constant) and init_kw.value is False)
        if "default" in kwargs:
            return _literal_repr(kwargs["default"]), init
        if "default_factory" in kwargs:
            factory = kwargs["default_factory"]
            if isinstance(factory, ast.Lambda):
                return _literal_repr(factory.body), init
            return _literal_repr(ast.Call(func=factory, args=[], keywords=[])), init
        return None, init
    return _literal_repr(value), True


def _literal_repr(expr: ast.expr) -> str:
    """repr() of a literal expression; source text for anything else (e.g. `list()`)."""
    text = ast.unparse(expr)
    try:
        return repr(ast.literal_eval(expr))
    except ValueError:
        return {"list()": "[]", "dict()": "{}", "set()": "set()"}.get(text, text)


def _compact(commands: dict[str, dict[str, ArgSpec]], sources: dict[str, str], version: str | None) -> dict[str, Any]:
    """Share one table of (type, default) per name; commands list names plus differences.

    Most of the ~640 arguments are identical across the six commands, so this keeps the
    file a fraction of the size of six full tables. A command whose names equal an
    earlier command's (pt vs sft) refers to it with `same_names_as`.
    """
    shared: dict[str, ArgSpec] = {}
    for specs in commands.values():
        for name, spec in specs.items():
            shared.setdefault(name, spec)
    entries: dict[str, dict[str, Any]] = {}
    for command, specs in commands.items():
        overrides = {n: _row(s) for n, s in sorted(specs.items()) if s != shared[n]}
        module, cls_name = COMMANDS[command]
        entry: dict[str, Any] = {"class": f"{module}.{cls_name}", "extracted_by": sources[command]}
        if overrides:
            entry["overrides"] = overrides
        names = sorted(specs)
        same = next((c for c, e in entries.items() if e.get("names") == names), None)
        if same:
            entry["same_names_as"] = same
        else:
            entry["names"] = names
        entries[command] = entry
    return {
        "format": FORMAT_VERSION,
        "ms_swift_version": version,
        "generated_by": "python -m swiftslurm.planning.swift_args --generate",
        "commands": entries,
        "args": {n: _row(s) for n, s in sorted(shared.items())},
    }


def _row(spec: ArgSpec) -> list[Any]:
    """An ArgSpec as the JSON file stores it: [type, default], plus the choices where the parser has some."""
    row = [spec.type, spec.default]
    return [*row, list(spec.choices)] if spec.choices is not None else row


def write_specs(data: dict[str, Any], path: Path) -> None:
    """Write atomically (concurrent planners may generate the same cache file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(_dumps(data))
    # mkstemp creates 0600; a shipped or shared cache file should be world-readable.
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, path)


def _dumps(data: dict[str, Any]) -> str:
    """JSON with one argument per line: compact, yet diffs show which argument changed."""
    lines = ["{"]
    for i, (key, value) in enumerate(data.items()):
        comma = "," if i < len(data) - 1 else ""
        if key == "args":
            lines.append(' "args": {')
            items = list(value.items())
            for j, (name, spec) in enumerate(items):
                sep = "," if j < len(items) - 1 else ""
                lines.append(f"  {json.dumps(name)}: {json.dumps(spec, ensure_ascii=False)}{sep}")
            lines.append(f" }}{comma}")
        elif key == "commands":
            lines.append(' "commands": {')
            items = list(value.items())
            for j, (command, entry) in enumerate(items):
                sep = "," if j < len(items) - 1 else ""
                lines.append(f"  {json.dumps(command)}: {json.dumps(entry, ensure_ascii=False)}{sep}")
            lines.append(f" }}{comma}")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _file_name(version: str) -> str:
    return f"{FILE_PREFIX}{version}.json"


def _version_key(version: str) -> tuple[int | str, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.+-]", version))


def main(argv: list[str] | None = None) -> int:
    """CLI: `--generate` writes the file for the installed ms-swift; `--check NAME...` validates."""
    parser = argparse.ArgumentParser(
        prog="python -m swiftslurm.planning.swift_args", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--generate", action="store_true", help="extract from the installed ms-swift")
    parser.add_argument("--output", type=Path, help="default: swiftslurm/data/swift_args-<version>.json")
    parser.add_argument("--command", default="swift sft", help="for --check (default: %(default)s)")
    parser.add_argument("--check", nargs="+", metavar="NAME", help="argument names to validate")
    args = parser.parse_args(argv)
    if args.generate:
        data = generate_specs()
        out = args.output or DATA_DIR / _file_name(data["ms_swift_version"])
        write_specs(data, out)
        sizes = {c: len(specs) for c, specs in _expand(data).items()}
        print(f"wrote {out}: {sizes}")
    if args.check:
        errors = [m for m in (unknown_arg_message(n, args.command) for n in args.check) if m]
        for m in errors:
            print(m, file=sys.stderr)
        return 1 if errors else 0
    if not (args.generate or args.check):
        parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
