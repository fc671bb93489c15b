"""The config of one comparison run: the task's ``configs/<task>/<method>.yaml`` plus the run's overrides.

When the task has no config for a method, the optimizer of another config of the same task
(``sqp_adam.yaml`` first) is replaced by the method's class with the paper's hyper-parameters. The
overrides: optimizer lr and rho, ``seed_everything``, the DataModule's ``batch_mode``, the epoch
budget, the thread count, a TensorBoard logger (``<out>/tensorboard/compare/<task>/<run>``), the
:class:`~lit_constrained.compare.recorder.EpochRecorder` callback, validation every epoch, one device,
no checkpoints and no progress bar. The result is an ordinary LightningCLI config: the worker writes
it to ``<out>/configs/<run>.yaml`` and runs ``lit-constrained fit --config`` on it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from .grid import METHODS, RunSpec


def _normalize_class(node: Any, where: str) -> dict[str, Any]:
    """``{class_path, init_args}`` form of a class node (a bare class name string is accepted)."""
    if isinstance(node, str):
        return {"class_path": node, "init_args": {}}
    if not isinstance(node, dict) or "class_path" not in node:
        raise ValueError(f"{where} must be a mapping with a class_path, got {node!r}.")
    node = dict(node)
    init = dict(node.pop("init_args", None) or {})
    class_path = node.pop("class_path")
    dict_kwargs = node.pop("dict_kwargs", None)
    init.update(node)  # keys written next to class_path belong to init_args
    out: dict[str, Any] = {"class_path": class_path, "init_args": init}
    if dict_kwargs:
        out["dict_kwargs"] = dict_kwargs
    return out


def _same_class(a: str, b: str) -> bool:
    return a == b or a.rsplit(".", 1)[-1] == b.rsplit(".", 1)[-1]


def find_config(config_dir: Path, task: str, method: str, prefer_paper: bool = False) -> tuple[Path, bool]:
    """(path, exact): the method's own config, else another config of the task (exact=False).

    Looked up in ``<task>/`` and ``<task>/paper/`` (the faithful settings of the paper), in that order,
    or the reverse with ``prefer_paper``.
    """
    folder = config_dir / task
    if not folder.is_dir():
        raise ValueError(
            f"No configs for task {task!r}: expected the folder {folder} with <method>.yaml files "
            f"(methods: {', '.join(METHODS)}). Pass --config-dir if they live elsewhere."
        )
    folders = [folder, folder / "paper"]
    if prefer_paper:
        folders.reverse()
    for place in folders:
        own = place / f"{method}.yaml"
        if own.exists():
            return own, True
    for place in folders:
        candidates = [place / f"{m}.yaml" for m in METHODS] + sorted(place.glob("*.yaml"))
        for path in candidates:
            if path.exists():
                return path, False
    raise ValueError(f"No YAML config in {folder} or {folder / 'paper'}: add {method}.yaml (or any config of "
                     "the task to derive it from).")


def data_accepts(class_path: str, argument: str) -> bool:
    """Whether the class named by ``class_path`` takes the init argument ``argument``."""
    import importlib
    import inspect

    module_name, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return argument in inspect.signature(cls.__init__).parameters


def config_budget(config_dir: Path, task: str, prefer_paper: bool = True) -> tuple[int, Path]:
    """(epochs, path): ``trainer.max_epochs`` of the task's SQP-Adam config, the reference budget.

    With ``prefer_paper`` (the default) it is read from ``<task>/paper/`` (the paper configs carry the
    paper's budget and size), else from the embedded ``<task>/`` configs.
    """
    path, _ = find_config(config_dir, task, "sqp_adam", prefer_paper)
    config = yaml.safe_load(path.read_text()) or {}
    epochs = (config.get("trainer") or {}).get("max_epochs")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"{path} has no trainer.max_epochs >= 1 (got {epochs!r}): set it, or pass --max-epochs.")
    return epochs, path


def _recommended_optimizer_args(config_dir: Path, task: str, method: str) -> dict[str, Any]:
    """The optimizer settings of ``<task>/recommended/<method>.yaml`` besides lr and rho (e.g. a step cap)."""
    path = config_dir / task / "recommended" / f"{method}.yaml"
    if not path.exists():
        return {}
    config = yaml.safe_load(path.read_text()) or {}
    model = _normalize_class(config.get("model"), f"{path}: model")
    optimizer = model["init_args"].get("optimizer")
    if optimizer is None:
        return {}
    args = dict(_normalize_class(optimizer, f"{path}: model.init_args.optimizer")["init_args"])
    args.pop("lr", None)
    args.pop("rho", None)
    return args


def run_config(
    spec: RunSpec, config_dir: Path, out_dir: Path, threads: int, eval_every: int = 1, prefer_paper: bool = False,
    tensorboard: bool = True,
) -> dict[str, Any]:
    """The full LightningCLI config dict of one run (see :func:`find_config` for ``prefer_paper``).

    ``out_dir`` receives the run's TensorBoard logs and its temporary history file. The ``full`` rho
    variant runs the same config (problem size, data, model) with the optimizer settings of
    ``<task>/recommended/<method>.yaml`` where it exists: the recommended settings of the full normal
    step besides rho (e.g. Darcy's ``max_normal_step`` cap). ``tensorboard=False``: no logger (no event
    files and no prediction figure rendered at each validation; the run record is the same).
    """
    path, exact = find_config(config_dir, spec.task, spec.method, prefer_paper)
    config = yaml.safe_load(path.read_text()) or {}
    config = copy.deepcopy(config)
    method = METHODS[spec.method]

    model = _normalize_class(config.get("model"), f"{path}: model")
    init = model["init_args"]
    optimizer = init.get("optimizer")
    if exact and optimizer is not None:
        optimizer = _normalize_class(optimizer, f"{path}: model.init_args.optimizer")
        if not _same_class(optimizer["class_path"], method.class_path):
            raise ValueError(
                f"{path} is the config of method {spec.method!r} but its optimizer is {optimizer['class_path']}, "
                f"expected {method.class_path}."
            )
    else:
        optimizer = {"class_path": method.class_path, "init_args": copy.deepcopy(method.init_args)}
    if spec.rho_variant == "full":
        optimizer["init_args"].update(_recommended_optimizer_args(config_dir, spec.task, spec.method))
    optimizer["init_args"]["lr"] = spec.lr
    if method.constrained:
        optimizer["init_args"]["rho"] = spec.rho
    else:
        optimizer["init_args"].pop("rho", None)
    init["optimizer"] = optimizer
    init["num_threads"] = threads
    config["model"] = model

    config["seed_everything"] = spec.seed
    if spec.mode in ("full", "minibatch"):
        data = _normalize_class(config.get("data"), f"{path}: data")
        if not data_accepts(data["class_path"], "batch_mode"):
            raise ValueError(f"{data['class_path']} has no batch_mode: run this task with its default mode.")
        data["init_args"]["batch_mode"] = spec.mode
        config["data"] = data

    trainer = dict(config.get("trainer") or {})
    trainer.update(
        max_epochs=spec.max_epochs,
        max_steps=-1,
        devices=1,
        num_nodes=1,
        check_val_every_n_epoch=eval_every,
        val_check_interval=None,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out_dir),
        logger={
            "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
            "init_args": {
                "save_dir": str(out_dir / "tensorboard"),
                "name": f"compare/{spec.task}",
                "version": spec.name,
                "default_hp_metric": False,
            },
        } if tensorboard else False,
    )
    if trainer.get("strategy") not in (None, "auto"):
        trainer["strategy"] = "auto"
    callbacks = trainer.get("callbacks") or []
    callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
    callbacks.append(
        {
            "class_path": "lit_constrained.compare.recorder.EpochRecorder",
            "init_args": {"history_path": str(out_dir / "runs" / f"{spec.name}.history.json")},
        }
    )
    trainer["callbacks"] = callbacks
    config["trainer"] = trainer
    config.pop("ckpt_path", None)
    return config


def fingerprint(config: dict[str, Any]) -> str:
    """A hash of what determines a run's numbers (the config without output paths and callbacks)."""
    stripped = copy.deepcopy(config)
    trainer = stripped.get("trainer", {})
    for key in ("logger", "default_root_dir"):
        trainer.pop(key, None)
    trainer["callbacks"] = [
        c for c in trainer.get("callbacks") or []
        if not (isinstance(c, dict) and str(c.get("class_path", "")).endswith("EpochRecorder"))
    ]
    stripped.get("model", {}).get("init_args", {}).pop("num_threads", None)  # speed, not numbers
    text = json.dumps(stripped, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
