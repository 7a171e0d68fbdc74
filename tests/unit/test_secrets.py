"""Secrets never reach the run dir: refused at plan time, redacted in node logs; the run dir is private and its
plan.json is checked on the node against the digest recorded when it was prepared."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from swiftslurm.errors import ConfigError, NodeError
from swiftslurm.launch import prepare_run_dir
from swiftslurm.node.supervise import load_plan
from swiftslurm.rundir import layout as rundir
from swiftslurm.secrets import redact_argv
from tests.conftest import plan_for

SECRET = "s3cr3t-v4lue-9f2c"  # distinctive, so a test can prove it shows up nowhere


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ([f"+cluster.env.WANDB_API_KEY={SECRET}"], "cluster.env.WANDB_API_KEY"),
        ([f"+cluster.env.OPENAI_APIKEY={SECRET}"], "cluster.env.OPENAI_APIKEY"),
        ([f"+cluster.env.HF_TOKEN={SECRET}"], "cluster.env.HF_TOKEN"),
        ([f"+cluster.env.DB_PASSWORD={SECRET}"], "cluster.env.DB_PASSWORD"),
        ([f"+cluster.env.AWS_SECRET_ACCESS_KEY={SECRET}"], "cluster.env.AWS_SECRET_ACCESS_KEY"),
        ([f"+swift.hub_token={SECRET}"], "swift.hub_token"),
        ([f"+swift.swanlab_token={SECRET}"], "swift.swanlab_token"),
        ([f"+swift.swanlab_secret={SECRET}"], "swift.swanlab_secret"),
        ([f"+model.swift.hub_token={SECRET}"], "model.swift.hub_token"),
        (
            ["storage=s3", "storage.bucket=ckpt", f"storage.endpoint_url=http://AKIA:{SECRET}@s3:8333"],
            "storage.endpoint_url",
        ),
        ([f"+swift.vllm_server_base_url=[http://user:{SECRET}@rollout:8000]"], "swift.vllm_server_base_url[0]"),
        ([f"dataset=[https://{SECRET}@example.com/data.jsonl]"], "dataset[0]"),
        ([f"cluster.setup=['export WANDB_API_KEY={SECRET}']"], "cluster.setup[0]"),
        ([f"+cluster.env.HTTPS_PROXY=http://me:{SECRET}@proxy:3128"], "cluster.env.HTTPS_PROXY"),
    ],
)
def test_a_credential_anywhere_in_the_config_is_refused_naming_the_field_and_the_fix(
    overrides: list[str], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        plan_for(*overrides)
    message = str(err.value)
    assert message.startswith(field + " "), message
    assert "HINT:" in message and "\n" not in message
    assert SECRET not in message


def test_the_storage_hint_points_at_the_credential_chain() -> None:
    with pytest.raises(ConfigError, match="boto3's chain"):
        plan_for("storage=s3", "storage.bucket=ckpt", f"storage.endpoint_url=http://k:{SECRET}@s3:8333")


def test_the_hint_says_to_export_it_in_the_submitting_shell() -> None:
    with pytest.raises(ConfigError, match="export it in the shell you submit from"):
        plan_for(f"+cluster.env.WANDB_API_KEY={SECRET}")


@pytest.mark.parametrize(
    "overrides",
    [
        ["+cluster.env.TOKENIZERS_PARALLELISM=false"],
        ["+cluster.env.HF_TOKEN_PATH=/shared/hf/token"],
        ["+cluster.env.AWS_SHARED_CREDENTIALS_FILE=/home/me/.aws/credentials"],
        ["+cluster.env.GOOGLE_APPLICATION_CREDENTIALS=/home/me/key.json"],
        ["+cluster.env.WANDB_API_KEY="],
        ["swift.max_new_tokens=64", "swift.report_to=[wandb]"],
        ["storage=s3", "storage.bucket=ckpt", "storage.endpoint_url=http://s3:8333"],
        ["cluster.setup=['export HF_HOME=/shared/hf', 'source ~/.secrets/env']"],
    ],
)
def test_legitimate_values_that_look_alike_are_accepted(overrides: list[str]) -> None:
    plan_for(*overrides)


def test_a_key_exported_in_the_submitting_shell_is_fine_and_never_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    assert SECRET not in plan_for("swift.report_to=[wandb]").to_json()


@pytest.mark.parametrize(
    ("argv", "logged"),
    [
        (["--hub_token", SECRET, "--lr", "1"], ["--hub_token", "***", "--lr", "1"]),
        ([f"--hub_token={SECRET}", "--lr=1"], ["--hub_token=***", "--lr=1"]),
        (["--swanlab_secret", SECRET], ["--swanlab_secret", "***"]),
        (["--my_api_key", "a", "b", "--x", "c"], ["--my_api_key", "***", "***", "--x", "c"]),
        (
            ["--vllm_server_base_url", f"http://u:{SECRET}@h:8000", "http://h2:8000"],
            ["--vllm_server_base_url", "http://***@h:8000", "http://h2:8000"],
        ),
        ([f"--dataset=https://{SECRET}@hub/x"], ["--dataset=https://***@hub/x"]),
        (["swift", "sft", "--max_new_tokens", "64"], ["swift", "sft", "--max_new_tokens", "64"]),
        (["--model", "Qwen/Qwen3-8B", "--report_to", "wandb"], ["--model", "Qwen/Qwen3-8B", "--report_to", "wandb"]),
    ],
)
def test_redacted_argv_hides_credential_values_and_url_credentials_only(argv: list[str], logged: list[str]) -> None:
    assert redact_argv(argv) == logged


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_the_run_dir_is_private_to_owner_and_group_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    plan = plan_for(f"run_dir={tmp_path / 'runs' / 'r'}")
    old = os.umask(umask)
    try:
        run_dir = prepare_run_dir(plan, "")
    finally:
        os.umask(old)
    assert stat.S_IMODE(run_dir.stat().st_mode) == rundir.RUN_DIR_MODE == 0o750


def test_a_reused_run_dir_is_made_private_again(tmp_path: Path) -> None:
    plan = plan_for(f"run_dir={tmp_path / 'r'}")
    (tmp_path / "r").mkdir(mode=0o777)
    os.chmod(tmp_path / "r", 0o777)
    assert stat.S_IMODE(prepare_run_dir(plan, "").stat().st_mode) == 0o750


def test_the_node_runs_the_plan_it_was_prepared_with(tmp_path: Path) -> None:
    plan = plan_for(f"run_dir={tmp_path / 'r'}")
    run_dir = prepare_run_dir(plan, "")
    assert load_plan(run_dir) == plan


def test_a_plan_edited_after_preparation_is_refused_on_the_node_before_anything_runs(tmp_path: Path) -> None:
    run_dir = prepare_run_dir(plan_for(f"run_dir={tmp_path / 'r'}"), "")
    plan_path = rundir.plan_file(run_dir)
    plan_path.write_text(plan_path.read_text().replace('"max_attempts": 50', '"max_attempts": 5000'))
    with pytest.raises(NodeError, match=r"changed since the run dir was prepared.*HINT: never edit plan\.json"):
        load_plan(run_dir)


def test_a_plan_without_a_recorded_digest_is_refused_on_the_node(tmp_path: Path) -> None:
    run_dir = prepare_run_dir(plan_for(f"run_dir={tmp_path / 'r'}"), "")
    rundir.plan_digest_file(run_dir).unlink()
    with pytest.raises(NodeError, match=r"plan\.sha256 does not exist"):
        load_plan(run_dir)
