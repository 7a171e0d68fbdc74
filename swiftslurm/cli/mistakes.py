"""The command line's own mistakes (Hydra's and OmegaConf's errors, keys the schema lacks) as one line each.

Hydra reports a bad override in up to 15 lines with exit status 1 and adds an unknown key silently when the user
follows its own hint (`+cluster.node=4`). swiftslurm reads the same errors here and says, in one line, which
setting is wrong and how to fix it; the command line prints it and exits 2 like every other refusal (errors.py).
Login side only: imports Hydra and OmegaConf.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    InterpolationKeyError,
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from swiftslurm.errors import ConfigError, did_you_mean, one_of
from swiftslurm.planning.config import Config
from swiftslurm.planning.container import ENV_NAME

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# Command-line flags Hydra itself reads; anything else starting with '-' is a mistyped setting.
HYDRA_FLAGS = re.compile(
    r"^(-m|--multirun|-c|--cfg|-p|--package|-r|--run|-h|--help|--hydra-help|--info|--version|--resolve|"
    r"-sc|--shell-completion|-cp|--config-path|-cn|--config-name|-cd|--config-dir|--experimental-rerun)(=|$)"
)
_SETTINGS = "settings are KEY=VALUE (`python -m swiftslurm --cfg job` prints them all)"


# ------------------------------------------------------------------------------ the schema's keys


@functools.cache  # the schema's classes never change; every sweep point checks its keys against them
def _fields(cls: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _schema_at(path: Sequence[str]) -> Any:
    """The dataclass at a dotted path of the root schema (None past a leaf or a free-form dict)."""
    node: Any = Config
    for part in path:
        if not isinstance(node, type) or not dataclasses.is_dataclass(node):
            return None
        node = _fields(node).get(part)
    return node if dataclasses.is_dataclass(node) else None


def _leaves(cls: Any = Config, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, type) of every setting; free-form dicts (`swift`, `env`, `sbatch`) are leaves."""
    for name, tp in _fields(cls).items():
        if dataclasses.is_dataclass(tp):
            yield from _leaves(tp, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", tp


# Other tools' words for swiftslurm's settings (SLURM's, other launchers', ms-swift's short forms): a close spelling
# of these would point at an unrelated setting (`cluster.queue` -> `cluster.exclude`).
ALIASES = {
    "queue": "cluster.partition",
    "partitions": "cluster.partition",
    "walltime": "cluster.time",
    "time_limit": "cluster.time",
    "features": "cluster.constraint",
    "gres": "cluster.gpus_per_node",
    "num_gpus": "cluster.gpus_per_node",
    "ngpus": "cluster.gpus_per_node",
    "nproc_per_node": "cluster.gpus_per_node",
    "num_nodes": "cluster.nodes",
    "nnodes": "cluster.nodes",
    "ntasks": "cluster.gpus_per_node",
    "url": "storage.endpoint_url",
    "endpoint": "storage.endpoint_url",
    "s3_endpoint": "storage.endpoint_url",
    "path": "model.id",
    "model_path": "model.id",
    "model_id": "model.id",
    "name_or_path": "model.id",
    "model_name_or_path": "model.id",
    "output_dir": "run_dir",
    "zero_stage": "strategy.deepspeed",
    "lr": "swift.learning_rate",
    "epochs": "swift.num_train_epochs",
    "num_epochs": "swift.num_train_epochs",
    "level": "cluster.nccl.debug",
    "nccl_debug": "cluster.nccl.debug",
}


def suggest_key(key: str) -> str | None:
    """The setting a mistyped key most likely meant: another tool's word for it (`queue` -> `cluster.partition`),
    the same last word elsewhere (`nodes` -> `cluster.nodes`, `learning_rate` -> `swift.learning_rate`), a close
    spelling, or a setting the last word begins."""
    from swiftslurm.planning import swift_args

    leaves = [k for k, _ in _leaves()]
    last = key.rsplit(".", 1)[-1]
    if (alias := ALIASES.get(last.lower().replace("-", "_"))) is not None:
        return alias
    same_word = [k for k in leaves if k.rsplit(".", 1)[-1] == last and k != key]
    if same_word:
        return same_word[0]
    parent = key.rsplit(".", 1)[0] + "." if "." in key else ""
    longer = [k for k in leaves if k.rsplit(".", 1)[-1].startswith(last) and k.startswith(parent)]
    if longer and len(last) > 2:
        return longer[0]
    # A close spelling of the last word among its siblings: the shared `cluster.` makes any two keys look alike.
    siblings = {k.rsplit(".", 1)[-1]: k for k in leaves if k.startswith(parent) and "." not in k[len(parent) :]}
    close = difflib.get_close_matches(last, list(siblings), n=1, cutoff=0.7)
    if close:
        return siblings[close[0]]
    if last in swift_args.valid_args("swift sft") or last in swift_args.valid_args("megatron sft"):
        return f"swift.{last}"
    return None


# Settings that are gone, with where their meaning lives now (a config or command line written before still names them).
RETIRED = {
    "task.launcher": (
        "the program follows strategy.engine (strategy=megatron runs `megatron`, the others `swift`). HINT: drop "
        "task.launcher (also from your own conf/task/*.yaml) and choose the engine with strategy=NAME"
    ),
}


def unknown_key_message(key: str) -> str:
    if key in RETIRED:
        return f"{key} is no longer a setting: {RETIRED[key]}."
    guess = suggest_key(key)
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    schema = _schema_at(parent.split(".")) if parent else Config
    names = ", ".join(f.name for f in dataclasses.fields(schema)) if schema else ""
    fix = f" Did you mean `{guess}`?" if guess else f" {parent or 'The top level'} has: {names}." if names else ""
    return (
        f"{key} is not a swiftslurm setting.{fix} HINT: ms-swift arguments go under `swift.`, "
        "e.g. swift.max_steps=10; a `+` only adds keys inside swift, cluster.env and cluster.sbatch."
    )


def check_known_keys(cfg: DictConfig, schema: Any = Config, prefix: str = "") -> None:
    """Refuse keys the schema lacks: Hydra adds them with `+` or `++`, and OmegaConf.to_object drops them."""
    fields = _fields(schema)
    for key in cfg:
        name = f"{prefix}{key!s}"
        if key not in fields:
            raise ConfigError(unknown_key_message(name))
        child = cfg._get_node(key)
        if dataclasses.is_dataclass(fields[key]) and isinstance(child, DictConfig) and not child._is_missing():
            check_known_keys(child, fields[key], f"{name}.")


# ------------------------------------------------------------------------------ Hydra's errors


def _kind(key: str) -> str:
    tp = dict(_leaves()).get(key)
    text = str(tp)
    for needle, kind in (("bool", "true or false"), ("int", "a whole number (int)"), ("float", "a number (float)")):
        if needle in text:
            return kind
    if "dict" in text.lower():
        return "a mapping, e.g. {KEY: VALUE} (or set one entry: KEY.NAME=VALUE)"
    if "list" in text.lower():
        return "a list of strings, e.g. ['a b', c]"
    return "a string"


def _override_for(key: str, overrides: Sequence[str]) -> str:
    for override in overrides:
        if override.lstrip("+~").split("=", 1)[0] == key:
            return override.lstrip("+~")
    return f"{key}=VALUE"


def is_bare_word(arg: str) -> bool:
    """Neither KEY=VALUE, `~KEY` (Hydra's delete) nor a flag: on the command line only a command can be that."""
    return bool(arg) and "=" not in arg and not arg.startswith(("-", "~"))


def unknown_command_message(word: str, commands: Sequence[str]) -> str:
    """`stauts`: the command it most likely meant; otherwise the commands and the KEY=VALUE form."""
    close = difflib.get_close_matches(word, commands, n=1, cutoff=0.6)
    if close:
        return f"unknown command '{word}'; did you mean `{close[0]}`?"
    return (
        f"unknown command '{word}': the commands are {', '.join(commands)}, and {_SETTINGS}. "
        "HINT: python -m swiftslurm --help."
    )


def flag_message(arg: str) -> str:
    """`--dry-run`: not one of Hydra's flags; the setting it most likely meant, spelled KEY=VALUE."""
    name, _, value = arg.lstrip("-").partition("=")
    key = name.replace("-", "_")
    known = dict(_leaves())
    target = key if key in known else suggest_key(key)
    if target is None:
        return f"{arg} is not an option: {_SETTINGS}."
    value = value or ("true" if "bool" in str(known.get(target)) else "VALUE")
    return f"{arg} is not an option: {_SETTINGS}. Did you mean `{target}={value}`?"


# What the refusal of an empty group choice (`model=`) proposes: the embedded default's choices (conf/config.yaml).
DEFAULT_CHOICE = {"model": "tiny", "strategy": "ddp", "task": "sft", "storage": "none", "cluster": "local-slurm"}


def _missing_config(err: Any, overrides: Sequence[str]) -> str:
    found = re.search(r"Could not find '([^']+)/([^'/]*)'", str(err))
    if not found:
        return _first_line(err)
    group, name = found.groups()
    options = list(err.options or []) or sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    if not name:
        typed = "+" if f"+{group}=" in overrides else ""
        example = DEFAULT_CHOICE.get(group, options[0] if options else "NAME")
        return f"{typed}{group}= names no {group}. HINT: choose one, e.g. {typed}{group}={example}. {one_of(options)}"
    return f"{group}={name} is not known.{did_you_mean(name, options)} {one_of(options)}"


# Lists whose items have a form of their own, and how the refusal of a bare value shows it.
FORMED_ITEMS = {"container.mounts": "SRC:DST or SRC:DST:ro, e.g. container.mounts=['/tmp:/tmp']"}


def _validation(err: ValidationError, overrides: Sequence[str]) -> str:
    key = str(err.full_key or "")
    given = _override_for(key, overrides)
    value = given.split("=", 1)[1] if "=" in given else ""
    kind = _kind(key)
    if kind == "a string" and value.startswith("["):  # Hydra read a list: brackets and commas need quotes
        inner = value.strip("[]")
        text = ",".join(p.strip() for p in inner.split(",")) if key == "cluster.partition" else value
        return f"{given}: Hydra reads [...] as a list, and {key} is a string. HINT: quote it: '{key}=\"{text}\"'."
    if kind.startswith("a list") and value and not value.startswith("["):
        items = [os.path.abspath(v) if v.startswith(("./", "../")) else v for v in value.split(",")]
        if key == "container.env" and not all(ENV_NAME.match(item) for item in items):  # in brackets still refused
            return f"{given} is not a list of variable names. HINT: e.g. container.env=[WANDB_API_KEY]."
        if key in FORMED_ITEMS:  # brackets alone may not make its items right: the form is part of the hint
            return f"{given} is not a list. HINT: write it in brackets, each item {FORMED_ITEMS[key]}."
        return f"{given} is not a list. HINT: write it in brackets: {key}=[{','.join(items)}]."
    if value.strip().lower() in ("null", "none", "~"):  # an unset: the configured value is the likely wish
        return f"{given}: {key} cannot be null. HINT: leave {key} out to keep its configured value, or give it {kind}."
    if any(o.lstrip("+").startswith("recipe=") for o in overrides):
        # A recipe sets many values together: the schema's default may not fit the rest of it (tp=1 with
        # sequence parallelism), and the recipe's own value is the likely wish.
        return f"{given} is not {kind}. HINT: leave {key} out to keep the recipe's value, or give it {kind}."
    example = _default_of(key)
    shown = (
        f", e.g. {key}={str(example).lower() if isinstance(example, bool) else example}" if example is not None else ""
    )
    return f"{given} is not {kind}. HINT: give {key} {kind}{shown}."


def _default_of(key: str) -> bool | int | float | None:
    """The schema's default of a number or switch setting (what the embedded configuration plans with)."""
    *parents, name = key.split(".")
    schema = _schema_at(parents) if parents else Config
    if schema is None:
        return None
    for f in dataclasses.fields(schema):
        if f.name == name and isinstance(f.default, (bool, int, float)):
            return f.default
    return None


def interpolation_message(err: InterpolationResolutionError) -> str:
    """`${oc.env:SCRATCH}` with SCRATCH unset, `${foo}` with no setting foo: name the setting and the fix."""
    key = str(err.full_key or "a value")
    env = re.search(r"Environment variable '([^']+)' not found", str(err))
    if env:
        var = env.group(1)
        return (
            f"{key} reads ${{oc.env:{var}}}, but {var} is not set in this shell. HINT: export {var}=PATH first, "
            f"or give a default: ${{oc.env:{var},/some/path}}."
        )
    if isinstance(err, InterpolationKeyError):
        ref = re.search(r"Interpolation key '([^']+)'", str(err))
        name = ref.group(1) if ref else "?"
        return (
            f"{key} refers to ${{{name}}}, which is not a setting. HINT: write the value itself, refer to a setting "
            f"(e.g. ${{cluster.name}}), or quote a literal dollar sign: {key}='\\${{{name}}}'."
        )
    return f"{key}: {_first_line(err)}. HINT: check the ${{...}} in {key}."


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0].rstrip(".") if str(err).strip() else type(err).__name__


def _composition(err: Exception, overrides: Sequence[str]) -> str:
    text = str(err)
    if isinstance(err.__cause__, ValidationError):
        return _validation(err.__cause__, overrides)
    override = re.search(r"Could not (?:override|append to config|delete from config)\W+'?([\w.-]+)'?", text)
    key = override.group(1) if override else ""
    if "No match in the defaults list" in text:
        given = _override_for(key, overrides)
        return f"{given}: the {key} group is not chosen by default. HINT: add it with a plus: +{given}."
    if "An item is already at" in text:
        return f"+{key} is given twice, or {key} already has a value. HINT: give it once; without + to change it."
    if key:
        return unknown_key_message(key)
    if "Multiple values for" in text:
        group = re.search(r"Multiple values for (\S+)", text)
        name = group.group(1).rstrip(".") if group else "a group"
        return f"+{name} is given twice. HINT: choose one {name}: +{name}=NAME once."
    ambiguous = re.search(r"Ambiguous value for argument '([^']+)'", text)
    if ambiguous:
        given = ambiguous.group(1).lstrip("+")
        key, _, value = given.partition("=")
        quoted = ",".join(v.strip() for v in value.split(",")) or "a,b"
        return (
            f"{given} has several values. HINT: to sweep over them, add -m (python -m swiftslurm -m {given}); "
            f"a list is written [a,b]; a string with commas is quoted: '{key}=\"{quoted}\"'."
        )
    return _first_line(err)


def command_line_refusal(err: Exception, overrides: Sequence[str]) -> str | None:
    """The one line for an error raised while Hydra read the command line (a HydraException, an
    OmegaConfBaseException, or OmegaConf's OverflowError below); None for an error that is a bug instead."""
    if isinstance(err, OverflowError):
        return _overflow(err, overrides)
    return hydra_error_message(err, overrides)


def _overflow(err: OverflowError, overrides: Sequence[str]) -> str | None:
    """OmegaConf reads a float field with float() and lets its OverflowError through (a whole number past 1.8e308),
    re-raised with the field's key in its message: a value of the wrong size, said like a wrong type. None for
    any other OverflowError: that is a bug, and keeps its traceback."""
    found = re.search(r"full_key: (\S+)", str(err))
    if found is None:
        return None
    key = found.group(1)
    return f"{_override_for(key, overrides)} is too large for {key}. HINT: give {key} {_kind(key)} below 1e308."


def _as_typed(override: str, overrides: Sequence[str]) -> str:
    """The override as the user typed it (without the `++` that open_dict_overrides added)."""
    return next((o for o in overrides if override in (o, f"++{o}")), override)


def hydra_error_message(err: Exception, overrides: Sequence[str]) -> str:
    """One line, naming the setting and the fix, for an error Hydra raised while reading the command line."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(err, OverrideParseException):
        err.override = _as_typed(err.override, overrides)
        if "missing EQUAL" in err.message:
            return f"`{err.override}` is not KEY=VALUE: {_SETTINGS}. HINT: e.g. {err.override}=true."
        return f"cannot read `{err.override}` ({err.message.splitlines()[0]}). HINT: {_quote_hint(err.override)}."
    if isinstance(err, MissingConfigException):
        return _missing_config(err, overrides)
    if isinstance(err, InterpolationResolutionError):
        return interpolation_message(err)
    if isinstance(err, ValidationError):
        return _validation(err, overrides)
    if isinstance(err, OmegaConfBaseException):
        return f"{err.full_key}: {_first_line(err)}."
    return _composition(err, overrides)


def _quote_hint(override: str) -> str:
    """What to type instead of an override Hydra's grammar cannot read: the value quoted (a list item by item),
    with `~` expanded, which neither Hydra nor ms-swift does."""
    key, _, value = override.partition("=")
    generic = "close every bracket and quote values with spaces, commas or brackets: 'key=\"a, b\"'"
    if not value or value.count("[") != value.count("]") or '"' in value or "'" in value:
        return generic
    if value.startswith("[") and value.endswith("]"):
        items = [os.path.expanduser(i.strip()) for i in value[1:-1].split(",") if i.strip()]
        quoted = ", ".join(f'"{i}"' for i in items)
        proposal = f"'{key}=[{quoted}]'"
    else:
        proposal = f"'{key}=\"{os.path.expanduser(value)}\"'"
    if "~" in value:
        return f"`~` is not expanded here; give the absolute path: {proposal}"
    return f"quote the value: {proposal}"


def to_config(cfg: DictConfig) -> Config:
    """The composed DictConfig as the schema's Config; a missing value or a bad interpolation is one line."""
    check_known_keys(cfg)
    try:
        config = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key} has no value. HINT: set {err.full_key}=VALUE.") from err
    except InterpolationResolutionError as err:
        raise ConfigError(interpolation_message(err)) from err
    assert isinstance(config, Config)  # the root schema guarantees it
    return config
