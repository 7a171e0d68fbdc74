"""Bad input is refused before the queue, in one line that names the fix (issue 14, item 10).

The corpus is data: tests/data/bad_inputs/*.yaml (one file per issue or theme, each with `refused` and
`accepted`). Every refused case runs the real command line in this process
(Hydra composes conf/, swiftslurm plans, writes the run dir unless it refuses) and must exit 2 with at most
12 lines of output, no traceback, a message naming the field and the fix, and nothing written. A few run as
real subprocesses to prove the exit status and the streams as a shell sees them. Accepted cases must plan, and
their values reach the run dir exactly as given (quoted where a shell reads them); some must also print a warning.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from swiftslurm.__main__ import main
from swiftslurm.plan import JobPlan
from swiftslurm.render import display_command, swift_command
from swiftslurm.submit.jobs import make_executor
from tests.conftest import REPO, plan_for

CORPUS_DIR = REPO / "tests" / "data" / "bad_inputs"


def load_corpus() -> dict[str, list[dict[str, Any]]]:
    """Every file's `refused` and `accepted` cases, in file-name order."""
    corpus: dict[str, list[dict[str, Any]]] = {"refused": [], "accepted": []}
    for path in sorted(CORPUS_DIR.glob("*.yaml")):
        part = yaml.safe_load(path.read_text()) or {}
        for kind in corpus:
            corpus[kind] += part.get(kind) or []
    return corpus


CORPUS = load_corpus()


MAX_LINES = 12
# A local model folder's config.json (setup: NAME): a MoE of 60 experts (Qwen1.5-MoE's count), broken ones.
MOE_60 = (
    '{"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 16,'
    ' "num_key_value_heads": 16, "vocab_size": 151936, "num_experts": 60, "moe_intermediate_size": 1408,'
    ' "num_experts_per_tok": 4}'
)
MODEL_CONFIGS = {
    "model_moe60": MOE_60,
    "model_not_json": "{hidden_size: 1",
    "model_no_layers": '{"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100}',
    "model_list": "[1, 2]",
}


def split(args: str | list[str]) -> list[str]:
    """A case's argv: a string is split like a shell line; a list is the argv itself."""
    return shlex.split(args) if isinstance(args, str) else list(args)


def case_id(case: dict[str, Any]) -> str:
    return f"{case.get('category', 'ok')}: {' '.join(split(case['args']))}"


def prepare(case: dict[str, Any], tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The case's argv (with {tmp} filled in, dry_run=true and a run dir under tmp unless given) and its setup."""
    setup = case.get("setup")
    if setup == "file":
        (tmp / "afile").write_text("not a directory\n")
    elif setup == "corrupt_plan":
        (tmp / "corrupt").mkdir()
        (tmp / "corrupt" / "plan.json").write_text('{"version": 1, "run_name": ')
    elif setup == "plan_is_dir":
        (tmp / "plandir" / "plan.json").mkdir(parents=True)
    elif setup == "dataset":
        (tmp / "train.jsonl").write_text('{"messages": []}\n')
    elif setup == "sif":  # container=apptainer's image: any file
        (tmp / "ms-swift.sif").write_text("")
    elif setup == "rootfs":  # container=oci's: a root filesystem
        (tmp / "rootfs" / "usr").mkdir(parents=True)
    elif setup == "models_dir":
        (tmp / "models" / "qwen").mkdir(parents=True)
    elif setup in MODEL_CONFIGS:
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text(MODEL_CONFIGS[setup])
    if case.get("unset"):
        monkeypatch.delenv(case["unset"], raising=False)
    args = [a.replace("{tmp}", str(tmp)) for a in split(case["args"])]
    if not any(a.lstrip("+").startswith("run_dir=") for a in args):
        args.append(f"run_dir={tmp / 'run'}")
    return [*args, "dry_run=true"]


def snapshot(root: Path) -> dict[str, float]:
    """Every file and directory under root, with its modification time, except Hydra's own sweep folders while
    they hold no file: Hydra creates them before the first point of a `-m` is planned."""
    sweeps = root / "runs" / "sweeps"

    def counted(path: Path) -> bool:
        in_sweeps = path == sweeps.parent or sweeps in (path, *path.parents)
        return not (path.is_dir() and in_sweeps and not any(p.is_file() for p in path.rglob("*")))

    return {str(p): p.stat().st_mtime for p in root.rglob("*") if counted(p)}


def run_in_process(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["swiftslurm", *argv])
    try:
        main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's working directory: relative paths, runs/ and Hydra's sweep folders land here."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SWIFTSLURM_RUNS", str(tmp_path / "runs"))
    return tmp_path


@pytest.mark.parametrize("case", CORPUS["refused"], ids=case_id)
def test_bad_input_is_refused_in_one_line_naming_the_fix(
    case: dict[str, Any], workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = prepare(case, workdir, monkeypatch)
    before = snapshot(workdir)
    code, output = run_in_process(argv, capsys, monkeypatch)
    assert code == 2, output
    assert "Traceback" not in output, output
    assert len(output.strip().splitlines()) <= MAX_LINES, output
    message = output.lower()
    missing = [word for word in case["names"] if word.replace("{tmp}", str(workdir)).lower() not in message]
    assert not missing, f"message does not name {missing}:\n{output}"
    assert snapshot(workdir) == before, f"a refused input wrote files:\n{output}"


@pytest.mark.parametrize("case", CORPUS["accepted"], ids=case_id)
def test_legitimate_values_are_accepted_and_reach_the_run_dir_intact(
    case: dict[str, Any], workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = prepare(case, workdir, monkeypatch)
    code, output = run_in_process(argv, capsys, monkeypatch)
    assert code == 0, output
    run_dir = workdir / "run"
    written = "\n".join(p.read_text() for p in run_dir.iterdir() if p.is_file())
    plan = JobPlan.load(run_dir / "plan.json")
    for text in case["quoted"]:
        assert text in written or text in plan.swift_argv or text in dict(plan.env).values(), f"{text!r} not written"
    missing = [word for word in case.get("warns", ()) if word not in output]
    assert not missing, f"the output does not warn of {missing}:\n{output}"
    # What the dry run prints for the user to copy into a shell gives back exactly the argv the nodes run.
    command = swift_command(plan)
    assert shlex.split(display_command(command).replace("\\\n", " ")) == command


FIXED = [case for case in CORPUS["refused"] if "fix" in case]


@pytest.mark.parametrize("case", FIXED, ids=case_id)
def test_the_fix_a_hint_proposes_is_accepted(
    case: dict[str, Any], workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused case's `fix` (the argv its HINT proposes) plans, and the message proposes each of its words
    the case's own argv lacks: a HINT never proposes a value that would itself be refused."""
    code, output = run_in_process(prepare(case, workdir, monkeypatch), capsys, monkeypatch)
    assert code == 2, output
    fixed = prepare({**case, "args": case["fix"]}, workdir, monkeypatch)
    given = split(case["args"])
    new = [arg for arg in split(case["fix"]) if arg not in given]

    def proposed(arg: str) -> bool:  # the value itself, or the right key for the user's own value
        key, _, value = arg.partition("=")
        return arg.lower() in output.lower() or (key in output and any(a.endswith(f"={value}") for a in given))

    unproposed = [arg for arg in new if not proposed(arg)]
    assert not unproposed, f"the HINT does not propose {unproposed}:\n{output}"
    code, output = run_in_process(fixed, capsys, monkeypatch)
    assert code == 0, f"the proposed fix {case['fix']!r} is refused:\n{output}"


def test_unlimited_time_reaches_sbatch_through_submitit_too(tmp_path: Path) -> None:
    """job.sbatch says --time=UNLIMITED; the script submitit writes for the same plan must say it too."""
    plan = plan_for("+cluster=local-slurm", "cluster.time=UNLIMITED", f"run_dir={tmp_path / 'run'}")
    executor = make_executor(plan, tmp_path / "submitit")
    script = executor._executor._make_submission_file_text("true", "uid")
    assert "#SBATCH --time=UNLIMITED" in script and "#SBATCH --time=0" not in script


def test_the_corpus_covers_every_category_with_at_least_100_inputs() -> None:
    categories = {case["category"] for case in CORPUS["refused"]}
    assert len(CORPUS["refused"]) >= 100
    for needed in (
        "unknown option",
        "typo'd key",
        "wrong type",
        "layout",
        "batch",
        "slurm time",
        "path",
        "ms-swift typo",
        "ms-swift value",
        "managed",
        "hostile",
        "secret",
        "storage",
        "hydra syntax",
        "sweep",
        "run dir",
    ):
        assert needed in categories


# Issues 27's and 28's refusals without a written `fix`: the settings their HINT proposes first (before any "or";
# values, not placeholders such as NAME or PATH) are applied together to the case's own argv, in place of what it
# gave those keys, as a user would retype it; the result may be refused for another reason, but never for what was
# proposed.
HINT_SETTING = re.compile(r"`?\+?([A-Za-z_][\w.-]*)=(\[[^\]]*\]|[^\s`,;)'\"]+)`?")
PLACEHOLDER = re.compile(r"^[A-Z_:]+$|\.\.\.|^<|path/to|\$|[A-Z]{3,}")
TOP_LEVEL = {"model", "strategy", "task", "dataset", "storage", "global_batch_size", "micro_batch_size", "run_name"}
HINTED = [
    case for case in CORPUS["refused"] if "fix" not in case and str(case.get("category", "")).startswith(("27.", "28 "))
]


def first_proposal(output: str) -> list[tuple[str, str]]:
    """The KEY=VALUE settings of the HINT's first alternative."""
    first = re.split(r",?\s+or\s+", output.partition("HINT:")[2], maxsplit=1)[0]
    found = [(m.group(1), m.group(2).rstrip(".")) for m in HINT_SETTING.finditer(first)]
    return [(key, value) for key, value in found if ("." in key or key in TOP_LEVEL) and not PLACEHOLDER.search(value)]


def with_settings(argv: list[str], settings: list[tuple[str, str]]) -> list[str]:
    keys = {key for key, _ in settings}
    kept = [arg for arg in argv if arg.lstrip("+~").partition("=")[0] not in keys]
    plus = {key for key, _ in settings if any(arg.startswith(f"+{key}=") for arg in argv)}
    return [*kept, *(f"{'+' if key in plus else ''}{key}={value}" for key, value in settings)]


@pytest.mark.parametrize("case", HINTED, ids=case_id)
def test_what_a_hint_proposes_is_not_refused_in_turn(
    case: dict[str, Any], workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = prepare(case, workdir, monkeypatch)
    code, output = run_in_process(argv, capsys, monkeypatch)
    assert code == 2, output
    if not (proposal := first_proposal(output)):
        return  # the HINT names what to do in words (remove a setting, pick a cluster): nothing to retype
    code, again = run_in_process(with_settings(argv, proposal), capsys, monkeypatch)
    subject = again.removeprefix("swiftslurm: error: ").lstrip("'`")
    refused = [f"{key}={value}" for key, value in proposal if subject.startswith((f"{key}={value}", f"{key}='"))]
    assert code == 0 or not refused, f"the HINT of:\n{output}\nproposes {refused}, refused in turn:\n{again}"
