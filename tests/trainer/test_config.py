"""The trainer's flags are one dataclass: its parser is generated from TrainerConfig and the library renders a job's
flags from the same class, so the two share one set of names, defaults and model names."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import pytest

from eks_ddp.config import schema
from eks_ddp.core import rules
from eks_ddp_runtime import exitcodes
from eks_ddp_trainer import config, train_args
from eks_ddp_trainer.config import TrainerConfig
from tests.support.etcd_server import ROOT

# The trainer's flags as its hand-written parser spelled them before the dataclass: a rename breaks every Job.
FLAGS = {"--data-dir", "--run-dir", "--epochs", "--global-batch-size", "--bn-group", "--min-steps", "--model",
         "--width", "--lr", "--label-smoothing", "--seed", "--compile", "--precision", "--keep-checkpoints",
         "--checkpoint-every", "--log-every", "--check-every", "--max-steps", "--eval-batch-size", "--start-over",
         "--tensorboard"}
NOT_DEFAULT = TrainerConfig(data_dir="d", run_dir="r", epochs=2, global_batch_size=96, model="resnet-small",
                            keep_checkpoints=1, seed=7, lr=0.5, compile=True, checkpoint_every=4, log_every=3,
                            max_steps=9, width=16, bn_group=8, min_steps=0, label_smoothing=0.1, precision="bf16",
                            check_every=2, eval_batch_size=10, start_over=True, tensorboard=True)


def test_the_parser_has_exactly_the_trainers_flags():
    options = {o for a in train_args.build_parser()._actions for o in a.option_strings} - {"-h", "--help"}
    assert options == FLAGS


def test_the_parser_and_the_library_share_one_set_of_defaults():
    assert train_args.parse_args(["--data-dir=d", "--run-dir=r"]) == TrainerConfig(data_dir="d", run_dir="r")


def test_every_field_round_trips_through_the_flags_the_library_renders():
    assert {f.name for f in dataclasses.fields(NOT_DEFAULT)
            if getattr(NOT_DEFAULT, f.name) == f.default} == set(), "set every field off its default"
    assert train_args.parse_args(NOT_DEFAULT.flags()) == NOT_DEFAULT


def test_the_library_renders_the_runs_shape_always_and_other_flags_only_off_their_default():
    flags = TrainerConfig(data_dir="/d", run_dir="/r", max_steps=5).flags()
    assert flags == ["--data-dir=/d", "--run-dir=/r", "--epochs=10", "--global-batch-size=1024", "--model=airnet",
                     "--keep-checkpoints=3", "--seed=0", "--max-steps=5"]


def test_model_names_are_declared_once():
    assert rules.MODELS is config.MODELS
    assert schema.JobConfig.__pydantic_fields__["model"].annotation is config.ModelName  # job.model's type
    assert config.MODELS == typing.get_args(typing.get_type_hints(TrainerConfig)["model"])


def test_help_comes_from_the_field_docstrings():
    text = train_args.build_parser().format_help()
    assert "directory containing cifar-10-batches-py" in " ".join(text.split())
    assert "(default 1024)" in text and "augmentation (default 0)" in " ".join(text.split())


# A real process, with torch unimportable: the parser needs neither torch nor the trainer's modules.
_PARSE = ("import sys; sys.modules['torch'] = None\n"
          "from eks_ddp_trainer.train_args import parse_args\nprint(parse_args(sys.argv[1:]))\n")


@pytest.mark.parametrize("argv,code,message", [
    (["--run-dir=r"], exitcodes.CONFIG_ERROR, "the following arguments are required: --data-dir"),
    (["--data-dir=d", "--run-dir=r", "--nope"], exitcodes.CONFIG_ERROR, "unrecognized arguments: --nope"),
    (["--data-dir=d", "--run-dir=r", "--model=resnet50"], exitcodes.CONFIG_ERROR, "invalid choice: 'resnet50'"),
    (["--data-dir=d", "--run-dir=r", "--epochs=0"], exitcodes.CONFIG_ERROR, "--epochs: got 0; expected >= 1"),
    (["--data-dir=d", "--run-dir=r", "--epochs=x"], exitcodes.CONFIG_ERROR, "invalid int value: 'x'"),
    (["--data-dir=d", "--run-dir=r", "--model=resnet18", "--width=8"], exitcodes.CONFIG_ERROR,
     "--width applies to airnet and resnet-small only"),
    (["--data-dir=d", "--run-dir=r", "--precision=fp32", "--compile"], 0, "precision='fp32'"),
    (["--help"], 0, "--global-batch-size"),
], ids=["missing", "unknown", "choice", "range", "type", "cross-field", "good", "help"])
def test_the_trainers_command_line_exits_config_error_on_a_bad_flag(argv, code, message):
    proc = subprocess.run([sys.executable, "-c", _PARSE, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == code, proc.stderr
    assert message in proc.stdout + proc.stderr
