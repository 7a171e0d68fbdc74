"""The shipped ms-swift argument table carries what ms-swift's parser accepts, and values are checked against it."""

from __future__ import annotations

from swiftslurm.planning import swift_args


def test_the_table_records_the_parsers_choices_also_where_the_annotation_does_not_list_them() -> None:
    specs = swift_args.arg_specs("swift sft", version="4.6.0")
    assert specs["quant_method"].choices == ("bnb", "hqq", "eetq", "quanto", "fp8")
    # `optim` is annotated `OptimizerNames | str`: only transformers' parser turns the Enum into choices.
    assert specs["optim"].choices is not None and "adamw_torch" in specs["optim"].choices


def test_values_are_checked_against_type_and_choices() -> None:
    def error(name: str, value: object, command: str = "swift sft") -> str | None:
        return swift_args.value_error(name, value, command, version="4.6.0")

    assert error("learning_rate", 1e-4) is None and error("max_steps", 10) is None
    assert error("gradient_checkpointing", True) is None and error("report_to", ["wandb", "tensorboard"]) is None
    assert "float" in (error("learning_rate", "abc") or "")
    assert "int" in (error("max_steps", 1.5) or "")
    assert "bnb" in (error("quant_method", "awq") or "")
    assert "takes one" in (error("lora_rank", [8, 16]) or "")
    assert "float" in (error("lr", "fast", "megatron sft") or "")  # a table read from source, not imported


def test_a_table_without_recorded_choices_still_checks_literal_annotations() -> None:
    assert swift_args.literal_choices("Optional[Literal['left', 'right']]") == ("left", "right")
    assert swift_args._spec(["Literal['a', 'b']", "'a'"]) == swift_args.ArgSpec("Literal['a', 'b']", "'a'", None)
