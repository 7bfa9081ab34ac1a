"""The machinery every task shares: engine, checkpoints, CLI conventions, failure policy.

Opt-in (``import peg_core`` does not load it); torch-only (tqdm and TensorBoard are used
when installed).  :mod:`.distributed` holds the torch.distributed helpers (no-ops in one
process), :mod:`.metric_log` the JSON-lines / TensorBoard :class:`MetricLogger`,
:mod:`.checkpoint` the training checkpoints (atomic writes through
:mod:`peg_core.interop.io`, RNG capture), :mod:`.progress` the one progress display.

This is the command line's layer: it raises :class:`UserError`, and converts the library's
:class:`~peg_core.errors.InputError` s (e.g. :class:`~peg_core.interop.WeightsError`) into
it at its boundary (:func:`read_state_file`, :func:`load_model_state`, :func:`run_command`).  A task package
(``peg_core.classify``, ``peg_detr``, ``peg_video``) supplies its model, loss,
data and metrics as :class:`TrainParts` / :class:`EvalParts` and calls
:func:`fit` / :func:`evaluate_checkpoint`; its ``__main__`` calls :func:`dispatch`.
"""

from .broken import BrokenLog, BrokenSample, SampleBatch, SkipBroken, skipping_collate
from .checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_KEYS,
    CHECKPOINT_NAME,
    PREVIOUS_NAME,
    CheckpointStore,
    load_model_state,
    read_checkpoint,
    read_state_file,
    remove_stale_temp_files,
)
from .cli import (
    AMP_CHOICES,
    add_eval_args,
    add_train_args,
    device_arg,
    dispatch,
    grid_arg,
    int_list,
    json_safe,
    new_parser,
    nonnegative_float,
    nonnegative_int,
    parse_with_config,
    positive_float,
    positive_int,
    positive_int_list,
    unit_fraction,
)
from .distributed import DistInfo, init_distributed, is_main_process, seed_everything
from .errors import (
    EXIT_DIVERGED,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    ArgumentParser,
    TrainingDiverged,
    UserError,
    run_command,
)
from .metric_log import MetricLogger
from .progress import Progress, progress
from .trainer import (
    EvalParts,
    RunContext,
    StepOutput,
    Task,
    TrainParts,
    ensure_writable,
    evaluate_checkpoint,
    fit,
    write_json,
)

__all__ = [
    "AMP_CHOICES",
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_KEYS",
    "CHECKPOINT_NAME",
    "EXIT_DIVERGED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "PREVIOUS_NAME",
    "ArgumentParser",
    "BrokenLog",
    "BrokenSample",
    "CheckpointStore",
    "DistInfo",
    "EvalParts",
    "MetricLogger",
    "Progress",
    "RunContext",
    "SampleBatch",
    "SkipBroken",
    "StepOutput",
    "Task",
    "TrainParts",
    "TrainingDiverged",
    "UserError",
    "add_eval_args",
    "add_train_args",
    "device_arg",
    "dispatch",
    "ensure_writable",
    "evaluate_checkpoint",
    "fit",
    "grid_arg",
    "init_distributed",
    "int_list",
    "is_main_process",
    "json_safe",
    "load_model_state",
    "new_parser",
    "nonnegative_float",
    "nonnegative_int",
    "parse_with_config",
    "positive_float",
    "positive_int",
    "positive_int_list",
    "progress",
    "read_checkpoint",
    "read_state_file",
    "remove_stale_temp_files",
    "run_command",
    "seed_everything",
    "skipping_collate",
    "unit_fraction",
    "write_json",
]
