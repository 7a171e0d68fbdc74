"""No traceback for any input (issue 27): every field of every config group, given hostile values.

The fields come from the schema (swiftslurm/planning/config.py) and from the composed configs of every option of
every group under conf/ (the keys their YAML sets inside the free-form `swift`, `env` and `sbatch` dicts), so a
new field or option is fuzzed without editing this file. Each is given seeded hostile values: random strings,
numbers (0, -1, huge, floats, nan/inf), empty values, lists and mappings where a scalar is expected and the other
way round, unicode, very long strings, paths. Every (field, value) must end in exit status 0 or a refusal: exit
status 2, one line `swiftslurm: error: ... HINT: ...` naming the field, nothing written; a HINT that gives the
field a concrete value (`set cluster.nodes=1 or more`) must itself be accepted.

Speed: Hydra composes each option once (`Base`); each case applies its override to a copy of that config the way
Hydra applies command-line overrides, then runs the command line's own body (`hydra_main`), as `main()` would. A
seeded sample runs through the real `main()` too and must print the same. The tier runs one value of each kind
per field (seeded); `SWIFTSLURM_FUZZ=all` runs every value on every field (minutes: a search, not a test).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import os
import random
import re
import sys
import traceback
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from swiftslurm.__main__ import hydra_main, main
from swiftslurm.cli.mistakes import command_line_refusal
from swiftslurm.errors import PREFIX, report
from swiftslurm.planning.config import Config, open_dict_overrides, register_configs
from swiftslurm.planning.swift_args import valid_args
from tests.conftest import CONF_DIR

SEED = 27
KINDS_PER_FIELD = 3  # of HOSTILE's kinds, chosen per field (seeded): the tier's time; SWIFTSLURM_FUZZ=all: every value
EVERYTHING = os.environ.get("SWIFTSLURM_FUZZ") == "all"
FREE_FORM = ("swift", "env", "sbatch")  # dict fields whose keys are open-ended
# What an option needs besides itself to plan (a hub model names its data and trains on GPUs, ...): the fuzz
# starts from configs that plan, so each value meets the check of its own field. test_every_base_plans says
# when a new option needs an entry here.
HUB_DATA_GPUS = ["dataset=[AI-ModelScope/alpaca-gpt4-data-en]", "+cluster=a100x8"]
HUB_MODEL = ["model=qwen3-8b", *HUB_DATA_GPUS]
COMPANIONS = {
    "model": HUB_DATA_GPUS,
    "model=tiny": [],
    "model=qwen2.5-72b-instruct": ["dataset=[AI-ModelScope/alpaca-gpt4-data-en]", "+cluster=a100x16", "strategy=zero3"],
    "model=qwen3-0.5b-random": ["model.id={tmp}/model", "dataset=[{tmp}/train.jsonl]", "+cluster=h200x2"],
    "strategy=megatron": HUB_MODEL,
    "strategy=qlora": ["+cluster=a100x8"],
    "task=grpo": ["+cluster=a100x8"],
    "task=megatron_pt": ["strategy=megatron", *HUB_MODEL],
    "task=megatron_sft": ["strategy=megatron", *HUB_MODEL],
    "storage=s3": ["storage.bucket=fuzz-bucket"],
    "container=pyxis": ["+cluster=local-slurm", "container.image='nvcr.io#nvidia/pytorch:24.10-py3'"],
    "container=apptainer": ["+cluster=local-slurm", "container.image={tmp}/ms-swift.sif"],
    "container=oci": ["+cluster=local-slurm", "container.image={tmp}/rootfs"],
}
TINY_CONFIG = '{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}'


def _random_strings(rng: random.Random) -> list[str]:
    """Unquoted words Hydra reads as strings, and quoted ones with the characters a shell or YAML cares about."""
    plain = "abcxyzABC019_-./:@%+"
    hostile = plain + " '\"$;|&`*?!#()[]{}<>,=\\~\t"
    words = ["".join(rng.choice(plain) for _ in range(rng.randint(1, 12))) for _ in range(3)]
    quoted = ["".join(rng.choice(hostile) for _ in range(rng.randint(1, 16))) for _ in range(3)]
    return words + ["'" + q.replace("\\", "\\\\").replace("'", "\\'") + "'" for q in quoted]


# Each kind of hostile value, as the text after `field=` on the command line ({tmp}: the test's directory).
# `~` deletes the field (Hydra's `~field`).
HOSTILE: dict[str, list[str]] = {
    "random": _random_strings(random.Random(SEED)),
    "empty": ["", "null", "''", '""', "' '", "~"],
    "number": ["0", "-1", "1", "2", "3", "7", "99999999999999999999", "-99999999999", "1e308", "0.5", "-0.0", "1_000"],
    "nan/inf": ["nan", "inf", "-inf", "'nan'", "'inf'", "'NaN'"],
    "bool": ["true", "false", "'yes'", "'off'"],
    "list": ["[]", "[1,2]", "[a,b]", "[[1]]", "['']", "[null]"],
    "dict": ["{}", "{a:1}", "{a:{b:c}}", "{'':x}"],
    "unicode": ["ünïcødé", "'名前 テスト'", "'🙂'", "'a\u200bb'", "'\u202eabc'", "'a\nb'", "'\x01'", "'a\x00b'"],
    "long": ["x" * 5000, "'" + "a " * 2000 + "'", "9" * 400],
    "path": [
        "/dev/null",
        "{tmp}/nowhere/x",
        "./rel",
        "../up",
        "~/home",
        "a/../../b",
        "'{tmp}/a b/c'",
        "s3://bucket/key",
        "http://h:1/x",
        "'a\\'; echo foo'",
    ],
    "interpolation": ["'${oc.env:SWIFTSLURM_FUZZ_UNSET}'", "'${nope}'", "'$HOME'", "'%j'"],
}


@dataclass(frozen=True)
class Base:
    """One option of one group (or the default), with what it needs to plan."""

    name: str
    overrides: tuple[str, ...]


def bases() -> list[Base]:
    found = [Base("default", ())]
    for group_dir in sorted(p for p in CONF_DIR.iterdir() if p.is_dir()):
        group = group_dir.name
        for option in sorted(p.stem for p in group_dir.glob("*.yaml")):
            choice = f"{group}={option}"
            plus = "+" if group in ("cluster", "recipe") else ""  # not in the defaults list: added
            extra = COMPANIONS.get(choice, COMPANIONS.get(group, []))
            found.append(Base(choice, (f"{plus}{choice}", *extra)))
    return found


def _schema_fields(cls: Any = Config, prefix: str = "") -> Iterator[str]:
    """Every setting of the schema, free-form dicts included as fields of their own."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _schema_fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def _free_form_keys(cfg: DictConfig) -> Iterator[str]:
    """The keys a composed config has inside its free-form dicts (`model.swift.template`, `cluster.env.X`)."""
    for field in _schema_fields():
        if field.rsplit(".", 1)[-1] in FREE_FORM:
            node = OmegaConf.select(cfg, field)
            if isinstance(node, DictConfig):
                yield from (f"{field}.{key}" for key in node)


def fields_of(base_cfg: DictConfig, rng: random.Random) -> list[str]:
    """The schema's fields, the free-form keys this base sets, and new keys in each free-form dict (a few real
    ms-swift arguments, an environment variable, an #SBATCH option)."""
    new_swift = rng.sample(sorted(valid_args("swift sft")), 3)
    new = [f"swift.{a}" for a in new_swift] + ["cluster.env.SWIFTSLURM_FUZZ_VAR", "cluster.sbatch.comment"]
    return [*_schema_fields(), *_free_form_keys(base_cfg), *new]


@dataclass(frozen=True)
class Case:
    base: Base
    field: str
    value: str

    def override(self, tmp: Path) -> str:
        if self.value == "~":
            return f"~{self.field}"
        return f"{self.field}={self.value.replace('{tmp}', str(tmp))}"

    def __str__(self) -> str:
        return f"[{self.base.name}] {self.field}={self.value[:60]!r}"


@dataclass
class Outcome:
    code: int | str | None
    output: str
    escaped: str | None  # the traceback of an exception that escaped, if any
    changed: list[str]  # paths created or modified under the test's directory


class Fuzzer:
    """Runs cases against configs composed once per base, in a directory of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cwd = root / "work" / "here"
        self.run_dir = self.cwd / "run"
        self.parser = OverridesParser.create()
        self.composed: dict[str, DictConfig] = {}

    def setup_files(self) -> None:
        self.cwd.mkdir(parents=True)
        (self.root / "model").mkdir()
        (self.root / "model" / "config.json").write_text(TINY_CONFIG)
        (self.root / "train.jsonl").write_text('{"messages": []}\n')
        (self.root / "home").mkdir()
        (self.root / "ms-swift.sif").write_text("")  # container=apptainer's image: any file
        (self.root / "rootfs" / "usr").mkdir(parents=True)  # container=oci's: a root filesystem

    def base_args(self, base: Base) -> list[str]:
        return [o.replace("{tmp}", str(self.root)) for o in base.overrides]

    def compose(self, base: Base) -> DictConfig:
        if base.name not in self.composed:
            register_configs()
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
                self.composed[base.name] = compose("config", overrides=open_dict_overrides(self.base_args(base)))
        return self.composed[base.name]

    def snapshot(self) -> dict[str, float]:
        return {str(p): p.stat().st_mtime for p in self.root.rglob("*")}

    def args(self, base: Base, override: str | None) -> list[str]:
        return [*self.base_args(base), *([override] if override else []), f"run_dir={self.run_dir}", "dry_run=true"]

    def run(self, base: Base, override: str | None, through_main: bool = False) -> Outcome:
        """One case: the command line's exit status, its output, an escaped exception, what it wrote."""
        before = self.snapshot()
        out = io.StringIO()
        escaped = None
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code = self._main(base, override) if through_main else self._mutated(base, override)
            except SystemExit as stop:
                code = 0 if stop.code is None else stop.code
            except Exception:
                code, escaped = "escaped", traceback.format_exc()
        changed = [p for p, m in self.snapshot().items() if before.get(p) != m]
        self._clean(before)
        return Outcome(code, out.getvalue(), escaped, changed)

    def _main(self, base: Base, override: str | None) -> int:
        sys.argv = ["swiftslurm", *self.args(base, override)]
        main()
        return 0

    def _mutated(self, base: Base, override: str | None) -> int:
        """What `main()` does with these arguments, but on the base composed once: Hydra's own way of applying a
        command-line override, its errors reported as compose_and_run reports them, then hydra_main's body."""
        args = self.args(base, override)[len(base.overrides) :]
        cfg = copy.deepcopy(self.compose(base))
        try:
            parsed = self.parser.parse_overrides(open_dict_overrides(args))
            ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
        except (HydraException, OmegaConfBaseException, OverflowError) as err:  # as compose_and_run catches
            if (message := command_line_refusal(err, [*self.base_args(base), *args])) is None:
                raise
            return report(message)
        hydra_main.__wrapped__(cfg)  # type: ignore[attr-defined]
        return 0

    def _clean(self, before: dict[str, float]) -> None:
        """Remove what an accepted case wrote, so every case starts from the same directory."""
        import shutil

        for path in sorted(set(self.snapshot()) - set(before), key=len):
            p = Path(path)
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            elif p.exists() or p.is_symlink():
                p.unlink()


HINT_SETS = re.compile(r"`?\+?([A-Za-z_][\w.-]*)=([^\s`,;)]+)`?")
PLACEHOLDER = re.compile(r"^[A-Z_]+$|\.\.\.|^<|path/to|\$")  # NAME, ..., <x>, /path/to/it, a quoted $


def concrete_fix(field: str, output: str) -> tuple[str, bool] | None:
    """The `field=VALUE` the refusal's HINT gives this field (or its `swift.` spelling), when VALUE is a value (not
    a placeholder), and whether it is only an example of the kind of value (`e.g. swift.max_length=10`)."""
    names = {field, "swift." + field.rpartition(".swift.")[2]} if ".swift." in field else {field}
    _, _, hint = output.partition("HINT:")
    for found in HINT_SETS.finditer(hint):
        key, value = found.group(1), found.group(2).rstrip(".")
        cut_short = value.count("[") != value.count("]") or value.count("'") % 2  # a list with spaces in it
        if key in names and not PLACEHOLDER.search(value) and not cut_short:
            return f"{key}={value}", hint[: found.start()].rstrip().endswith("e.g.")
    return None


def problems(case: Case, outcome: Outcome) -> list[str]:
    """What is wrong with a case's outcome (nothing, for a clean acceptance or a clean refusal)."""
    if outcome.escaped is not None:
        return [f"{case}: traceback\n{outcome.escaped}"]
    if outcome.code == 0:
        return []
    found = []
    lines = outcome.output.strip().splitlines()
    if outcome.code != 2:
        found.append(f"{case}: exit status {outcome.code!r}")
    if "Traceback" in outcome.output:
        found.append(f"{case}: traceback in the output")
    if not lines or not lines[0].startswith(PREFIX) or len(lines) > 2 or (lines[1:] and "HINT" not in lines[1]):
        found.append(f"{case}: not one `{PREFIX}` line (plus a HINT line)")
    if outcome.changed:
        found.append(f"{case}: refused but wrote {outcome.changed[:3]}")
    return [f"{p}\n    {outcome.output.strip()[:600]}" for p in found]


def names_field(field: str, output: str) -> bool:
    """The refusal names the field: its dotted name, or its own name (`nodes`, `template`)."""
    text = output.lower()
    return field.lower() in text or field.rsplit(".", 1)[-1].lower() in text


def sample(fuzzer: Fuzzer) -> list[Case]:
    """Every field of every base, each with one value of KINDS_PER_FIELD kinds (SWIFTSLURM_FUZZ=all: every value);
    a field of the schema is tried on a base chosen at random, a free-form key on a base that sets it."""
    rng = random.Random(SEED)
    all_bases = bases()
    by_field: dict[str, list[Base]] = {}
    for base in all_bases:
        for field in fields_of(fuzzer.compose(base), random.Random(f"{SEED}{base.name}")):
            by_field.setdefault(field, []).append(base)
    cases = []
    for field, holders in by_field.items():
        kinds = list(HOSTILE) if EVERYTHING else rng.sample(list(HOSTILE), KINDS_PER_FIELD)
        for values in (HOSTILE[kind] for kind in kinds):
            for value in values if EVERYTHING else [rng.choice(values)]:
                cases.append(Case(rng.choice(holders), field, value))
    return cases


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzer]:
    root = tmp_path_factory.mktemp("fuzz")
    fuzzer = Fuzzer(root)
    fuzzer.setup_files()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(fuzzer.cwd)
        patch.setenv("HOME", str(root / "home"))
        patch.setenv("SWIFTSLURM_RUNS", str(fuzzer.cwd / "runs"))
        patch.delenv("SWIFTSLURM_FUZZ_UNSET", raising=False)
        for name in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE"):  # the dry run asks no store
            patch.delenv(name, raising=False)
        patch.setattr(sys, "argv", list(sys.argv))
        yield fuzzer


def test_every_base_plans(fuzzer: Fuzzer) -> None:
    """Each option, with its COMPANIONS, plans: so a fuzzed value is judged by its own field's checks."""
    outcomes = {base.name: fuzzer.run(base, None) for base in bases()}
    failed = [f"{name}: {out.output.strip()[:300]}" for name, out in outcomes.items() if out.code != 0]
    assert not failed, "add what these options need to COMPANIONS:\n" + "\n".join(failed)


def judge(fuzzer: Fuzzer, case: Case, fixes_tried: set[tuple[str, str]]) -> list[str]:
    """Run one case: what is wrong with its outcome, and with the outcome of the fix its HINT gives (each fix
    once per base)."""
    outcome = fuzzer.run(case.base, case.override(fuzzer.root))
    found = problems(case, outcome)
    if outcome.code != 2 or outcome.escaped:
        return found
    if not names_field(case.field, outcome.output):
        found.append(f"{case}: refusal does not name {case.field}\n    {outcome.output.strip()[:600]}")
    given = concrete_fix(case.field, outcome.output)
    if given is None or (case.base.name, given[0]) in fixes_tried:
        return found
    (fix, example), _ = given, fixes_tried.add((case.base.name, given[0]))
    fixed = fuzzer.run(case.base, fix)
    # A fix must plan; an example of the kind of value (ms-swift's default) must at least be one for its field:
    # whether the default fits this plan's memory is another check's to say.
    if fixed.code != 0 and not (example and not names_field(case.field, fixed.output)):
        found.append(f"{case}: its HINT's {fix} is refused too\n    {fixed.output.strip()[:600]}")
    return found


def test_no_field_value_escapes_as_a_traceback(fuzzer: Fuzzer) -> None:
    """Exit 0, or exit 2 with one line naming the field and a HINT whose concrete value is accepted."""
    fixes_tried: set[tuple[str, str]] = set()
    found = [problem for case in sample(fuzzer) for problem in judge(fuzzer, case, fixes_tried)]
    assert not found, f"{len(found)} problems:\n" + "\n".join(found[:40])


# Cases the fuzz found (issue 27), kept whatever the sample: (base, field, value). Most escaped as tracebacks.
ONCE_FOUND = [
    ("recipe=a100x16-qwen3moe-megatron-ep", "model.id", HOSTILE["long"][1]),  # a name too long for the OS
    ("default", "model.id", "'a\x00b'"),  # a NUL byte: not a path
    ("default", "dataset", "['x/../" + "y" * 300 + "']"),
    ("model=qwen3-8b", "model.id", "/tmp/" + "y" * 300),
    ("strategy=zero3", "strategy.deepspeed", "/tmp/" + "y" * 300 + ".json"),
    ("default", "resilience.backoff_base_s", "9" * 400),  # beyond a float, in a float field
    ("model=qwen3-vl-8b-instruct", "storage.wait_at_exit_s", "9" * 400),
    ("storage=s3", "model.swift.max_length", "9" * 400),  # beyond a float, in a range-checked ms-swift argument
    ("recipe=a10gx2-qlora-zero2", "swift.learning_rate", "9" * 400),
    ("cluster=a100x16", "model.swift.max_length", "{a:{b:c}}"),  # a mapping for an ms-swift int
    ("recipe=a10gx2-qlora-zero2", "swift.max_length", "[]"),  # no value for an ms-swift int
    ("recipe=a100x16-zero3-lora", "swift.lora_rank", "[]"),
    ("recipe=a100-2x4-grpo-colocate", "swift.vllm_gpu_memory_utilization", "{a:1}"),
    ("recipe=a100-2x4-grpo-colocate", "swift.vllm_gpu_memory_utilization", "nan"),
    ("recipe=a100-2x4-grpo-colocate", "swift.vllm_gpu_memory_utilization", "99999999999999999999"),
    ("model=qwen3-30b-a3b", "model.params_b", "inf"),  # int(nan) in the save-budget warning
    ("cluster=a100-2x4", "cluster.nodes", "99999999999999999999"),  # refused after job.sbatch was written
    ("strategy=qlora", "cluster.setup", "[[1]]"),  # a nested list for shell lines
    ("cluster=local", "dataset", "[[1]]"),
    ("cluster=a10gx2", "cluster.gpu_memory_gib", "nan"),  # an estimate of nan GiB, the field unnamed
    ("storage=s3", "storage.endpoint_url", "'a\u200bb'"),  # its HINT's http://a\u200bb did not parse
    ("model=qwen3-8b", "global_batch_size", "-1"),  # its HINT's global_batch_size=1 is no multiple of 8 GPUs
]


@pytest.mark.parametrize("base, field, value", ONCE_FOUND, ids=[f"{b} {f}={v[:20]}" for b, f, v in ONCE_FOUND])
def test_inputs_the_fuzz_once_found_are_refused_in_one_line(fuzzer: Fuzzer, base: str, field: str, value: str) -> None:
    found = judge(fuzzer, Case(next(b for b in bases() if b.name == base), field, value), set())
    assert not found, "\n".join(found)


def test_the_fuzz_runs_what_the_command_line_runs(fuzzer: Fuzzer) -> None:
    """A seeded sample through the real `main()` (Hydra composing everything) prints the same and exits the same."""
    for case in random.Random(SEED).sample(sample(fuzzer), 6):
        override = case.override(fuzzer.root)
        mutated, real = fuzzer.run(case.base, override), fuzzer.run(case.base, override, through_main=True)
        assert (mutated.code, mutated.output) == (real.code, real.output), case
