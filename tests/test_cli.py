"""The lit-constrained command (LightningCLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lit_constrained.cli.fit import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _command_line_is_the_args(monkeypatch):
    """main(args) in a test: sys.argv holds pytest's options, which LightningCLI would warn about."""
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])


def test_fit_from_yaml_writes_tensorboard_events(tmp_path):
    main([
        "fit", "--config", str(ROOT / "configs/curve/sqp_adam.yaml"),
        "--trainer.max_epochs", "3", "--trainer.log_every_n_steps", "1", "--trainer.default_root_dir", str(tmp_path),
        "--trainer.enable_progress_bar", "false",
    ])
    events = list(tmp_path.rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file was written"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"Objective/train", "Violation/train", "Objective/val", "Violation/val"} <= tags
    assert (tmp_path / "lightning_logs/curvefit/SQPAdam/version_000/config.yaml").exists()  # <task>/<optimizer>


class OptimizerSeen(pl.Callback):
    """Records the optimizer a fit ran with, its lr and the steps taken (at the end of the fit)."""

    seen: list[tuple[type, float, int]] = []

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        (optimizer,) = trainer.optimizers
        OptimizerSeen.seen.append((type(optimizer), optimizer.defaults["lr"], trainer.global_step))


@pytest.mark.parametrize("optimizer,expected", [
    ("SQPAdam", "lit_constrained.optim.SQPAdam"), ("SQPHeavyBall", "lit_constrained.optim.SQPHeavyBall"),
    ("AdamCon", "lit_constrained.optim.AdamCon"),
    ("{class_path: torch.optim.Adam, init_args: {lr: 0.01}}", "torch.optim.Adam"),
])
def test_short_class_paths_resolve(tmp_path, monkeypatch, optimizer, expected):
    """A short class name (or a class-path dict) on the command line is the optimizer the fit steps
    with, with the lr given (0.01, the config's is 0.01 too: ``defaults`` holds the constructor's)."""
    import importlib

    monkeypatch.setattr(OptimizerSeen, "seen", [])
    main([
        "fit", "--config", str(ROOT / "configs/curve/sqp_adam.yaml"),
        "--model.optimizer", optimizer, "--model.optimizer.lr", "0.02",
        "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path),
        "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
        f"--trainer.callbacks+={__name__}.OptimizerSeen",
    ])
    module, name = expected.rsplit(".", 1)
    assert OptimizerSeen.seen == [(getattr(importlib.import_module(module), name), 0.02, 2)]


def test_switching_the_optimizer_class_never_drops_init_args_silently(capsys):
    """The paper config sets SQPAdam(lr, rho=1, h=1, eps=1e-7): torch.optim.Adam takes no rho, so a bare
    switch is an error naming it; SQPHeavyBall keeps lr, rho and h; the whole new optimizer given
    explicitly is accepted."""
    config = str(ROOT / "configs/spring/paper/sqp_adam.yaml")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config, "--model.optimizer", "torch.optim.Adam", "--print_config"])
    assert exit_info.value.code != 0
    assert "'rho': 1.0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config, "--model.optimizer", "SQPHeavyBall", "--print_config"])
    printed = capsys.readouterr().out
    assert exit_info.value.code in (0, None) and "rho: 1.0" in printed and "lr: 0.0005" in printed
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config, "--model.optimizer",
              "{class_path: torch.optim.Adam, init_args: {lr: 0.01}}", "--print_config"])
    assert exit_info.value.code in (0, None) and "torch.optim.Adam" in capsys.readouterr().out


def test_abbreviated_options_are_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(ROOT / "configs/curve/sqp_adam.yaml"), "--trainer.max_epoch", "5"])
    assert exit_info.value.code != 0 and "max_epoch" in capsys.readouterr().err


def test_help_is_plain_words(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(ROOT / "configs/curve/sqp_adam.yaml"), "--model.optimizer.help", "SQPAdam"])
    text = capsys.readouterr().out
    assert "--optimizer.rho" in text
    for markup in (":math:", ":class:", ":meth:", ":func:", "``", "\\rho", "\\alpha", "\\beta"):
        assert markup not in text, markup


@pytest.mark.parametrize("argv", [["--help"], ["compare", "--help"]])
def test_help_answers_without_importing_torch(argv):
    """``lit-constrained --help`` lists every subcommand, ``lit-constrained compare --help`` gives compare's
    options; neither imports torch or Lightning (the parser is built from light modules only)."""
    code = (
        "import sys, time; t = time.perf_counter(); from lit_constrained.cli.console import main\n"
        f"try: main({argv!r})\nexcept SystemExit as e: assert e.code in (0, None), e.code\n"
        "heavy = sorted(m for m in ('torch', 'lightning', 'lit_constrained.cli.fit') if m in sys.modules)\n"
        "print('imported', heavy or 'nothing heavy', time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "imported nothing heavy" in out.stdout  # (what keeps it fast; its time is no test's: machines vary)
    if argv == ["--help"]:
        for subcommand in ("fit", "validate", "test", "predict", "compare", "--config", "--print_config"):
            assert subcommand in out.stdout, subcommand
        assert "compare" in run_cli("--help").stdout  # python -m lit_constrained.cli is the same command
    else:
        assert "usage: lit-constrained compare" in out.stdout and "--budget-fraction" in out.stdout


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lit_constrained.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_print_config_and_help(capsys, monkeypatch):
    """In process (the console script's own path: test_python_m_cli_is_the_whole_command_...)."""
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    monkeypatch.chdir(ROOT)

    def printed(*args: str) -> str:
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", *args])
        assert exit_info.value.code in (0, None)
        return capsys.readouterr().out

    config = printed("--config", "configs/curve/sqp_adam.yaml", "--print_config")
    assert "lit_constrained.optim.SQPAdam" in config and "rho: full" in config
    help_text = printed("--model.help", "lit_constrained.tasks.curve.CurveFit")
    assert "--model.penalty_weight" in help_text and "--model.optimizer" in help_text


def test_config_typo_is_a_clear_error():
    out = run_cli("fit", "--config", "configs/curve/sqp_adam.yaml", "--model.init_args.hiden", "3")
    assert out.returncode != 0
    assert "hiden" in out.stderr


def test_a_config_naming_another_optimizer_gets_that_class_defaults(tmp_path):
    """Not SQP-Adam's values for shared argument names (torch Adam's eps is 1e-8, SQP-Adam's 1e-7)."""
    import yaml

    config = yaml.safe_load((ROOT / "configs/curve/sqp_adam.yaml").read_text())
    config["model"]["init_args"]["optimizer"] = {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.01}}
    (tmp_path / "adam.yaml").write_text(yaml.safe_dump(config))
    from lit_constrained.cli.fit import ConstrainedCLI

    cli = ConstrainedCLI(args=["--config", str(tmp_path / "adam.yaml"), "--trainer.logger", "false"], run=False)
    optimizer = cli.model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.param_groups[0]["eps"] == 1e-8
    assert cli.model.hparams.optimizer["init_args"]["eps"] == 1e-8


# --- the console script's dispatch: fit -> run_fit, validate/test/predict -> cli.main, compare -> compare.run


@pytest.fixture
def dispatched(monkeypatch):
    """The layers' entry points replaced by recorders: what the console script hands to each."""
    import lit_constrained.cli.fit as cli
    import lit_constrained.compare as compare

    calls: list[tuple] = []
    monkeypatch.setattr(cli, "run_fit", lambda args, top_level=(): calls.append(("run_fit", list(args), list(top_level))))
    monkeypatch.setattr(cli, "main", lambda args=None: calls.append(("cli.main", list(args))))
    monkeypatch.setattr(compare, "run", lambda args: calls.append(("compare.run", args)) or 3)
    return calls


def test_console_hands_each_subcommand_to_its_layer(dispatched, tmp_path, monkeypatch):
    from lit_constrained.cli.console import main as console

    monkeypatch.chdir(tmp_path)  # the configs exist (the console checks that before handing them on)
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text("trainer: {max_epochs: 1}\n")
    fit_args = ["--config", "a.yaml", "--trainer.max_epochs", "3", "--model.optimizer",
                "{class_path: torch.optim.Adam, init_args: {lr: -0.5}}", "-c", "b.yaml", "--", "x"]
    console(["fit", *fit_args])  # every argument after the subcommand reaches LightningCLI as it was
    console(["fit", "--config", "a.yaml", "--help-all"])  # LightningCLI's own --help
    assert dispatched.pop() == ("run_fit", ["--config", "a.yaml", "--help"], [])
    console(["--config", "all.yaml", "--print_config=comments", "validate", "--ckpt_path", "last"])
    console(["-c", "all.yaml", "--print_config", "fit"])
    with pytest.raises(SystemExit) as exit_info:
        console(["compare", "--task", "spring", "--lrs", "0.01,0.001", "--report-only"])
    assert exit_info.value.code == 3  # compare.run's status is the exit status
    assert dispatched[:3] == [
        ("run_fit", fit_args, []),
        ("cli.main", ["--config", "all.yaml", "--print_config=comments", "validate", "--ckpt_path", "last"]),
        ("run_fit", [], ["--config", "all.yaml", "--print_config"]),
    ]
    name, args = dispatched[3]
    assert name == "compare.run" and args.task == "spring" and args.lrs == [0.01, 0.001] and args.report_only


def test_the_console_script_fits_with_no_warning_of_its_own(tmp_path, monkeypatch):
    """``lit-constrained fit ...`` as the console script runs it (argv from sys.argv): the command line
    the console hands on is LightningCLI's ``args``, which must not trigger its "args and command line
    arguments" warning (nor any warning of the package)."""
    import warnings

    from lit_constrained.cli.console import main as console

    argv = ["fit", "--config", str(ROOT / "configs/curve/sqp_adam.yaml"), "--trainer.max_steps", "2",
            "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
            "--trainer.logger", "false"]
    monkeypatch.setattr(sys, "argv", ["lit-constrained", *argv])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        console()
    ours = [f"{w.filename}: {w.message}" for w in caught
            if "args parameter is intended" in str(w.message) or "/lit_constrained/" in w.filename]
    assert ours == []
    assert list(tmp_path.rglob("last.ckpt"))  # it trained (the crash-safe checkpoint of the fit layer)


def test_compare_runs_as_a_subcommand(tmp_path, capsys):
    """``lit-constrained compare ...`` parses compare's arguments in the console and runs the comparison
    (here: the report of a grid with no records yet) with the exit status of ``compare.run``."""
    from lit_constrained.cli.console import main as console

    with pytest.raises(SystemExit) as exit_info:
        console(["compare", "--task", "spring", "--config-dir", str(ROOT / "configs"), "--report-only",
                 "--no-progress", "--budget-fraction", "0.05", "--out", str(tmp_path)])
    assert exit_info.value.code == 0
    assert "budget fraction 0.05 (500 of 10000 epochs)" in (tmp_path / "table.md").read_text()
    assert "compare spring:" in capsys.readouterr().err


def test_a_bare_print_config_before_the_subcommand_takes_no_value():
    """``--print_config`` before the subcommand is ``--print_config=`` (jsonargparse's reading), so the
    next word stays the subcommand; a config named like a subcommand, the subcommand's own arguments and
    anything after ``--`` are left as they are."""
    from lit_constrained.cli.console import bare_print_config_as_empty, parser

    assert bare_print_config_as_empty(["--print_config", "fit", "--print_config"]) == [
        "--print_config=", "fit", "--print_config"]
    assert bare_print_config_as_empty(["-c", "fit", "--print_config", "test"]) == ["-c", "fit", "--print_config=", "test"]
    assert bare_print_config_as_empty(["--", "--print_config"]) == ["--", "--print_config"]
    args = parser().parse_args(["--print_config", "validate", "--print_config"])
    assert args.subcommand == "validate" and args.print_config == [""] and args.args == ["--print_config"]
    assert parser().parse_args(["--print_config=skip_null", "fit"]).print_config == ["skip_null"]


def test_console_errors_name_the_fix(dispatched, capsys):
    from lit_constrained.cli.console import main as console

    console([])  # no arguments: the help, as --help
    assert "compare" in capsys.readouterr().out
    for argv, words in ((["--config", "all.yaml"], "a subcommand is required"),
                        (["--config", "all.yaml", "compare", "--task", "spring"], "compare takes --config-dir"),
                        (["compare"], "--task"), (["fitt"], "invalid choice")):
        with pytest.raises(SystemExit) as exit_info:
            console(argv)
        assert exit_info.value.code == 2 and words in capsys.readouterr().err, argv
    assert dispatched == []


def test_top_level_config_reaches_lightning(tmp_path, capsys):
    """LightningCLI's own options before the subcommand (a config with a ``fit:`` section) still work."""
    import yaml

    from lit_constrained.cli.console import main as console

    config = yaml.safe_load((ROOT / "configs/curve/sqp_adam.yaml").read_text())
    config["trainer"]["max_epochs"] = 7
    (tmp_path / "all.yaml").write_text(yaml.safe_dump({"fit": config}))
    with pytest.raises(SystemExit) as exit_info:
        console(["--config", str(tmp_path / "all.yaml"), "fit", "--print_config"])
    assert exit_info.value.code in (0, None)
    assert "max_epochs: 7" in capsys.readouterr().out


PACKAGE = ROOT / "lit_constrained"

#: the command-line layer's modules (cli/: console, preflight, fit; compare/)
COMMAND_LINE = ("lit_constrained.cli", "lit_constrained.compare")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _is_script(path: Path) -> bool:
    """A ``python -m`` script (``__main__.py``): run, never imported."""
    return path.name == "__main__.py"


def package_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a ``lit_constrained`` module in ``path``, wherever it is: at
    module level, inside a function, or in an ``if __name__ == "__main__":`` block (a module run as a
    script is imported again by what it imports); ``from a import b`` names ``a.b`` when that is a
    module, ``a`` otherwise."""
    import ast

    tree = ast.parse(path.read_text())
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the file's package
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            names = [f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base for alias in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in dict.fromkeys(names) if name.split(".")[0] == "lit_constrained"]
    return found


def test_the_fit_layer_never_imports_compare():
    """One-way layers: console -> compare -> cli (the fit layer); no module outside compare/ (and the
    console) imports lit_constrained.compare, not even lazily; no module imports the console (only the
    ``python -m`` script ``cli/__main__.py`` runs it), and no module imports a ``__main__`` script."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        for line, name in package_imports(path):
            if (name == "lit_constrained.compare" or name.startswith("lit_constrained.compare.")) and not (
                    relative.startswith("compare/") or relative == "cli/console.py"):
                offenders.append(f"{relative}:{line} imports {name}")
            if name == "lit_constrained.cli.console" and not _is_script(path):
                offenders.append(f"{relative}:{line} imports the console")
            if name.endswith(".__main__"):
                offenders.append(f"{relative}:{line} imports the script {name}")
    assert offenders == []


def test_the_command_line_layer_has_no_import_circle():
    """No chain of imports (module-level, inside functions or ``__main__`` blocks; ``__main__.py``
    scripts, which nothing imports, excluded) leads from a module of the command-line layer back to
    itself, as cli -> console -> compare -> cli did through cli.py's ``__main__`` block."""
    graph = {_module_name(path): {name for _, name in package_imports(path)}
             for path in PACKAGE.rglob("*.py") if not _is_script(path)}

    def reaches(start: str, goal: str) -> list[str] | None:
        stack, seen = [(start, [start])], {start}
        while stack:
            node, chain = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == goal:
                    return [*chain, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*chain, nxt]))
        return None

    layer = sorted(m for m in graph if any(m == c or m.startswith(c + ".") for c in COMMAND_LINE))
    assert "lit_constrained.cli.fit" in layer and "lit_constrained.cli.console" in layer
    circles = [" -> ".join(chain) for m in layer if (chain := reaches(m, m))]
    assert circles == []


def test_python_m_cli_is_the_whole_command_and_runs_the_fit_layer_once():
    """``python -m lit_constrained.cli`` runs the console (compare included) through the script
    ``cli/__main__.py``; the fit layer is imported once, as ``lit_constrained.cli`` (a ``__main__`` block
    in cli.py itself made it run twice: once as ``__main__``, once when the console imported it)."""
    code = (
        "import gc, runpy, sys\n"
        "sys.argv = ['lit-constrained', 'fit', '--config', 'configs/curve/sqp_adam.yaml', '--print_config']\n"
        "try: runpy.run_module('lit_constrained.cli', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as stop: assert stop.code in (0, None), stop.code\n"
        "print('classes', sum(isinstance(o, type) and o.__name__ == 'ConstrainedCLI' for o in gc.get_objects()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "lit_constrained.optim.SQPAdam" in out.stdout
    assert out.stdout.split()[-2:] == ["classes", "1"]


def _gloo_group(tmp_path: Path) -> None:
    """A one-rank gloo process group, as DDP's strategy makes one in each rank."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)


@pytest.mark.parametrize("end", ["completes", "interrupted", "fails"])
def test_main_destroys_the_process_group_its_fit_made_on_an_agreed_end(end, tmp_path, monkeypatch):
    """A rank's gloo group left to the interpreter's exit can abort the process after a fit that
    succeeded ("terminate called without an active exception"): main destroys the group the fit made
    when the fit completes or every rank stopped together, and leaves it after an error (the other
    ranks may still be in a collective)."""
    import lit_constrained.cli.fit.command as command
    from lit_constrained.callbacks.signals import TrainingInterrupted

    class FitThatMakesAGroup:
        def __init__(self, args=None):
            _gloo_group(tmp_path)
            if end == "interrupted":
                raise TrainingInterrupted(1)
            if end == "fails":
                raise RuntimeError("a rank failed")

    monkeypatch.setattr(command, "ConstrainedCLI", FitThatMakesAGroup)
    try:
        if end == "completes":
            main(["fit"])
        else:
            with pytest.raises(TrainingInterrupted if end == "interrupted" else RuntimeError):
                main(["fit"])
        assert torch.distributed.is_initialized() == (end == "fails")
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_main_leaves_a_process_group_that_was_there_before(tmp_path, monkeypatch):
    import lit_constrained.cli.fit.command as command

    monkeypatch.setattr(command, "ConstrainedCLI", lambda args=None: None)
    _gloo_group(tmp_path)
    try:
        main(["fit"])
        assert torch.distributed.is_initialized()  # the caller's group
    finally:
        torch.distributed.destroy_process_group()
