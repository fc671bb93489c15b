"""The command line on a new user's first day (issue 30): errors in one line with the fix (jsonargparse's
error, phrased from the classes it names); a one-page ``fit --help``; the complete help one option away,
wrapped at spaces only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lit_constrained.cli import help as help_page
from lit_constrained.cli.console import main, something_to_run


def trainer_arguments() -> list[str]:
    """The installed Trainer's arguments (its signature, as jsonargparse reads it)."""
    import inspect

    import lightning.pytorch as pl

    return [name for name in inspect.signature(pl.Trainer.__init__).parameters if name != "self"]

ROOT = Path(__file__).resolve().parents[1]

TASK_WITHOUT_KWARGS = '''
import torch
from torch.utils.data import DataLoader
import lightning.pytorch as pl
from lit_constrained import ConstrainedModule


class Data(pl.LightningDataModule):
    def train_dataloader(self):
        t = torch.linspace(0, 1, 8).unsqueeze(-1)
        return DataLoader([(t, t)], batch_size=None)


class NoKwargs(ConstrainedModule):
    def __init__(self, hidden: int = 4):
        super().__init__()
        self.net = torch.nn.Linear(1, 1)

    def objective(self, batch):
        t, u = batch
        return (self.net(t) - u).pow(2).mean()
'''

CONFIG = """trainer: {max_steps: 2, logger: false, enable_checkpointing: false}
model:
  class_path: MODULE.NoKwargs
  init_args: {num_threads: 1}
data:
  class_path: MODULE.Data
"""


def run_console(args: list[str], cwd: Path) -> dict:
    """``lit-constrained <args>`` in a fresh interpreter: exit status, stderr, stdout, and whether torch
    or Lightning had been imported when it ended."""
    code = textwrap.dedent(f"""
        import json, sys, io, contextlib
        from lit_constrained.cli.console import main
        err, out = io.StringIO(), io.StringIO()
        status = 0
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                main({args!r})
            except SystemExit as stop:
                status = stop.code
        print(json.dumps({{"status": status, "stderr": err.getvalue(), "stdout": out.getvalue(),
                          "torch": "torch" in sys.modules, "lightning": "lightning" in sys.modules}}))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    (tmp_path / "nokwargs_task.py").write_text(TASK_WITHOUT_KWARGS)
    (tmp_path / "config.yaml").write_text(CONFIG.replace("MODULE", "nokwargs_task"))
    (tmp_path / "typo.yaml").write_text("trainer:\n  max_step: 3\n")
    (tmp_path / "broken.yaml").write_text("trainer: [\n")
    (tmp_path / "momentum.yaml").write_text(
        "model:\n  class_path: lit_constrained.tasks.spring.Spring\n  init_args:\n    optimizer:\n"
        "      class_path: lit_constrained.optim.SQPAdam\n      init_args: {lr: 1.0e-3, momentum: 0.9}\n")
    return tmp_path


def test_config_errors_are_one_line(user_dir: Path) -> None:
    cases = {
        ("fit", "--config", "missing.yaml"): "--config missing.yaml: no such file",
        ("fit", "--config", "typo.yaml"): "'max_step' is not a Trainer argument (did you mean max_steps?)",
        ("fit", "--config", "broken.yaml", "--trainer.max_epochs", "2"): "--config broken.yaml: not valid YAML at line 2",
        ("validate", "--trainer.max_epoch", "3"): "'max_epoch' is not a Trainer argument (did you mean max_epochs?)",
        ("fit", "--config", "config.yaml"): ("NoKwargs.__init__ does not accept 'num_threads', an argument of "
                                              "ConstrainedModule"),
        ("fit", "--config", "momentum.yaml"): "SQPAdam takes no 'momentum'",
    }
    for args, expected in cases.items():
        result = run_console(list(args), user_dir)
        assert result["status"] == 2 and expected in result["stderr"], (args, result["stderr"])
        assert len(result["stderr"].strip().splitlines()) == 1 and "usage:" not in result["stderr"], args
    kwargs = run_console(["fit", "--config", "config.yaml"], user_dir)["stderr"]
    assert "must accept **kwargs and pass them on: def __init__(self, ..., **kwargs): super().__init__(**kwargs)" in kwargs
    momentum = run_console(["fit", "--config", "momentum.yaml"], user_dir)["stderr"]
    assert "its arguments are lr, betas, eps, rho" in momentum and "lit_constrained.optim.SQPHeavyBall" in momentum


def test_fit_help_is_one_page_with_the_optimizers_arguments_one_command_away(user_dir: Path) -> None:
    result = run_console(["fit", "--help"], user_dir)
    lines = result["stdout"].splitlines()
    assert result["status"] == 0 and len(lines) <= 40
    text = result["stdout"]
    assert "lit-constrained fit --help-all" in text and "--model.optimizer.help SQPAdam" in text
    assert "--trainer.NAME VALUE" in text and "--ckpt_path PATH" in text
    assert f"one of its {len(trainer_arguments())}" in text  # generated from the signature
    for name in ("SQPAdam", "SQPHeavyBall", "AdamCon", "SQPMoMoAdam"):  # from the optimizers' sources
        assert name in text, name


def test_help_all_is_lightnings_complete_help_wrapped_at_spaces(capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--help-all"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    assert len(text.splitlines()) > 300 and "--trainer.max_epochs" in text and "--trainer.gradient_clip_val" in text
    words = text.split()
    # no identifier cut at the column (argparse's default wrapping made "lit_const rained.callbacks...")
    assert all(w.lstrip("(").startswith("lit_constrained") for w in words if "lit_con" in w and not w.startswith("-"))
    assert "rained.callbacks" not in text.replace("lit_constrained.callbacks", "")


def test_an_error_only_lightningcli_finds_has_no_usage_dump_and_names_the_fix(tmp_path: Path, monkeypatch,
                                                                              capsys: pytest.CaptureFixture) -> None:
    # a task inside a package the fast check does not read: the error comes from LightningCLI's parser
    package = tmp_path / "first_day_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(TASK_WITHOUT_KWARGS)
    (tmp_path / "config.yaml").write_text(CONFIG.replace("MODULE", "first_day_pkg.tasks"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", "config.yaml"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" not in err and "Option 'num_threads' is not accepted" in err
    assert "fix: NoKwargs.__init__ does not accept 'num_threads'" in err and "(the options: lit-constrained fit --help)" in err
    sys.modules.pop("first_day_pkg.tasks", None)
    sys.modules.pop("first_day_pkg", None)


def in_process(args: list[str], directory: Path, monkeypatch, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """``lit-constrained <args>`` in this process, run from ``directory``: (exit status, stderr)."""
    monkeypatch.chdir(directory)
    monkeypatch.syspath_prepend(str(directory))
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    capsys.readouterr()
    try:
        main(args)
        status = 0
    except SystemExit as stop:
        status = stop.code or 0
    for name in [m for m in sys.modules if m.split(".")[0] in ("exp_fit", "own")]:
        sys.modules.pop(name)
    return status, capsys.readouterr().err


@pytest.mark.parametrize("subcommand", ["fit", "validate", "test"])
def test_a_shipped_config_and_valid_options_parse(subcommand: str, monkeypatch, capsys) -> None:
    status, err = in_process([subcommand, "--config", str(ROOT / "configs/spring/recommended/sqp_adam.yaml"),
                              "--trainer.max_epochs", "2", "--model.init_args.optimizer.init_args.lr", "1e-4",
                              "--trainer.callbacks+=lit_constrained.callbacks.StepSizeMonitor",
                              "--seed_everything", "1", "--print_config"], ROOT, monkeypatch, capsys)
    assert status == 0, err


def test_the_help_pages_trainer_examples_are_arguments_of_the_installed_trainer() -> None:
    for example in help_page.TRAINER_EXAMPLES:
        assert example.split()[0] in trainer_arguments(), example


# --- issue 37: the mistakes a user meets next ---------------------------------------------------------


def readme_example(directory: Path, max_steps: int = 2) -> None:
    """The README's "A new task" files (exp_fit.py, exp_fit.yaml) in ``directory``, the config cut to
    ``max_steps`` steps, no logger and no checkpoint (a test's run, not the README's)."""
    from tests.test_readme import code_blocks, readme_section

    for _, body in code_blocks(readme_section("A new task")):
        first = body.splitlines()[0]
        if first.startswith("# exp_fit."):
            if first.endswith(".yaml"):
                body = body.replace("max_steps: 300", f"max_steps: {max_steps}")
                body = body.replace("trainer:\n", "trainer:\n  logger: false\n  enable_checkpointing: false\n", 1)
                assert f"max_steps: {max_steps}" in body
            (directory / first[2:].strip()).write_text(body)


LR_OVERRIDE = ["--model.init_args.optimizer.init_args.lr", "1e-2"]


def test_the_readmes_lr_override_trains_the_readmes_example(tmp_path: Path) -> None:
    """README: "override anything from the command line, e.g. --model.init_args.optimizer.init_args.lr";
    its own example names no optimizer (the default). Before: "Optimizer takes no 'lr'", AdamCon suggested."""
    readme_example(tmp_path)
    result = run_console(["fit", "--config", "exp_fit.yaml", *LR_OVERRIDE], tmp_path)
    assert result["status"] in (0, None), result["stderr"][-2000:]
    assert "takes no 'lr'" not in result["stderr"] and re.search(r"steps +2 in", result["stdout"]), result["stdout"]


@pytest.mark.parametrize("option", ["--model.init_args.optimizer.init_args.lr", "--model.optimizer.lr",
                                    "--model.init_args.optimizer.lr", "--model.optimizer.init_args.lr"])
def test_an_lr_override_of_the_default_optimizer_reaches_sqp_adam(tmp_path: Path, monkeypatch, option: str) -> None:
    import torch

    from lit_constrained.cli.fit import ConstrainedCLI
    from lit_constrained.optim import SQPAdam

    readme_example(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    cli = ConstrainedCLI(args=["--config", "exp_fit.yaml", option, "1e-2"], run=False)
    optimizer = cli.model.configure_optimizers()
    optimizer = optimizer["optimizer"] if isinstance(optimizer, dict) else optimizer
    assert type(optimizer) is SQPAdam and optimizer.param_groups[0]["lr"] == 1e-2
    # the rest are SQPAdam's own defaults, as with no override
    assert optimizer.defaults["eps"] == SQPAdam([torch.zeros(1, requires_grad=True)]).defaults["eps"]
    assert cli.model.hparams.optimizer["class_path"].rsplit(".", 1)[-1] == "SQPAdam"
    sys.modules.pop("exp_fit", None)


@pytest.mark.parametrize("options, expected", [
    # a class the config names starts from its own defaults (MoMo's lr 1.0, Adam's eps 1e-8), not SQP-Adam's
    (["--config", "momo.yaml"], ("MoMo", {"lr": 1.0, "momentum": 0.9})),
    (["--config", "momo.yaml", "--model.optimizer.lr", "0.5"], ("MoMo", {"lr": 0.5})),
    (["--model.optimizer.lr", "0.1", "--model.optimizer", "torch.optim.Adam"], ("Adam", {"lr": 0.1, "eps": 1e-8})),
    (["--model.optimizer", "torch.optim.Adam"], ("Adam", {"lr": 1e-3, "eps": 1e-8})),
    # the default class keeps what was given and its own defaults for the rest
    (["--model.init_args.optimizer.init_args.max_normal_step", "null"], ("SQPAdam", {"max_normal_step": None, "eps": 1e-7})),
    (["--config", "adam.yaml"], ("Adam", {"lr": 5e-4, "eps": 1e-7})),  # what a config gives is kept
])
def test_a_named_optimizer_gets_its_own_defaults_for_what_nothing_gave(tmp_path: Path, monkeypatch, capsys, options: list[str],
                                                                       expected: tuple[str, dict]) -> None:
    """And ``--print_config`` shows the values the run uses (jsonargparse printed the carried ones: Adam's eps 1e-7)."""
    import yaml

    from lit_constrained.cli.fit import ConstrainedCLI

    readme_example(tmp_path)
    (tmp_path / "momo.yaml").write_text("model:\n  init_args:\n    optimizer: {class_path: lit_constrained.optim.MoMo}\n")
    (tmp_path / "adam.yaml").write_text("model:\n  init_args:\n    optimizer:\n      class_path: torch.optim.Adam\n"
                                        "      init_args: {lr: 5.0e-4, eps: 1.0e-7}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    cli = ConstrainedCLI(args=["--config", "exp_fit.yaml", *options], run=False)
    optimizer = cli.model.configure_optimizers()
    optimizer = optimizer["optimizer"] if isinstance(optimizer, dict) else optimizer
    assert type(optimizer).__name__ == expected[0]
    assert {k: optimizer.defaults[k] for k in expected[1]} == expected[1]
    capsys.readouterr()
    with pytest.raises(SystemExit) as printed:
        ConstrainedCLI(args=["--config", "exp_fit.yaml", *options, "--print_config"], run=False)
    assert printed.value.code in (0, None)
    page = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["optimizer"]
    assert page["class_path"].rsplit(".", 1)[-1] == expected[0]
    assert {k: page["init_args"][k] for k in expected[1]} == expected[1]
    sys.modules.pop("exp_fit", None)


#: a mistake in the README's example config: (the line replaced, its replacement), the message expected
README_CONFIG_MISTAKES = {
    "a task argument typo": (("    num_threads: 1 ", "    num_threads: 1\n    hiden: 64 "),
                             "ExpFit takes no 'hiden' (did you mean 'hidden'?)"),
    "an optimizer class typo": (("    num_threads: 1 ", "    optimizer: {class_path: lit_constrained.optim.SQPAdm}\n"
                                 "    num_threads: 1 "),
                                "lit_constrained.optim has no 'SQPAdm' (did you mean lit_constrained.optim.SQPAdam?)"),
    "a task module typo": (("class_path: exp_fit.ExpFit", "class_path: exp_fti.ExpFit"),
                           "there is no module 'exp_fti' (no exp_fti.py in the working directory"),
    "a word for a number": (("    num_threads: 1 ", "    optimizer: {class_path: lit_constrained.optim.SQPAdam, "
                             "init_args: {lr: fast}}\n    num_threads: 1 "),
                            "SQPAdam's lr must be a number, got 'fast'; e.g. lr: 0.001 (the default)"),
    "a typo in a word": (("    num_threads: 1 ", "    optimizer: {class_path: lit_constrained.optim.SQPAdam, "
                          "init_args: {rho: ful}}\n    num_threads: 1 "),
                         "SQPAdam's rho must be a number or 'full', got 'ful' (did you mean 'full'?)"),
}


@pytest.mark.parametrize("mistake", sorted(README_CONFIG_MISTAKES))
def test_a_mistake_in_the_readmes_config_is_one_line_with_the_fix(tmp_path: Path, mistake: str) -> None:
    """Issue 37: before, each was 10-18 lines after ~30 s (Lightning imported), with no "did you mean"."""
    readme_example(tmp_path)
    (old, new), expected = README_CONFIG_MISTAKES[mistake]
    text = (tmp_path / "exp_fit.yaml").read_text()
    assert old in text
    (tmp_path / "mistake.yaml").write_text(text.replace(old, new, 1))
    result = run_console(["fit", "--config", "mistake.yaml"], tmp_path)
    assert result["status"] == 2 and expected in result["stderr"], result["stderr"]
    assert len(result["stderr"].strip().splitlines()) == 1, result["stderr"]


@pytest.mark.parametrize("option, expected", [
    (["--model.init_args.hiden", "64"], "--model.init_args.hiden: ExpFit takes no 'hiden' (did you mean 'hidden'?)"),
    (["--model.init_args.optimizer.init_args.lr", "fast"], "SQPAdam's lr must be a number, got 'fast'"),
    (["--model.optimizer.rho", "ful"], "SQPAdam's rho must be a number or 'full', got 'ful' (did you mean 'full'?)"),
    (["--model.optimizer", "SQPAdm"], "the optimizer 'SQPAdm' is not one of lit_constrained.optim or torch.optim "
                                      "(did you mean SQPAdam?)"),
    (["--model.optimizer.momentum", "0.9"], "SQPAdam takes no 'momentum'"),
])
def test_the_same_mistakes_on_the_command_line_are_one_line(tmp_path: Path, monkeypatch, capsys, option, expected) -> None:
    readme_example(tmp_path)
    status, err = in_process(["fit", "--config", "exp_fit.yaml", *option], tmp_path, monkeypatch, capsys)
    assert status == 2 and expected in err and len(err.strip().splitlines()) == 1, err


def test_valid_values_and_other_classes_parse(tmp_path: Path, monkeypatch, capsys) -> None:
    readme_example(tmp_path)
    for option in (["--model.init_args.optimizer.init_args.lr", "1e-2"], ["--model.optimizer.rho", "0.5"],
                   ["--model.optimizer.rho", "full"], ["--model.init_args.hidden", "16"],
                   ["--model.optimizer", "torch.optim.Adam", "--model.optimizer.lr", "0.1"],
                   ["--model.optimizer", "SQPHeavyBall", "--model.optimizer.momentum", "0.5"],
                   ["--model.init_args.max_grad_norm", "null"], ["--model.init_args.on_nonfinite", "skip"],
                   ["--model.init_args.optimizer.init_args.max_normal_step", "null"]):
        status, err = in_process(["fit", "--config", "exp_fit.yaml", *option, "--print_config"], tmp_path,
                                 monkeypatch, capsys)
        assert status == 0, (option, err)


def test_a_class_path_typo_lightningcli_finds_gets_the_nearest_class() -> None:
    import torch.optim  # noqa: F401  (the parser has imported the module it reports)

    from lit_constrained.cli.fit.hints import phrase_error

    message = ("Type typing.Callable[...] expects a function or a callable class: module 'torch.optim' has no "
               "attribute 'Adm'. Got value: Namespace(class_path='torch.optim.Adm')")
    assert phrase_error(message, []) == "torch.optim has no 'Adm' (did you mean torch.optim.Adam?)"


@pytest.mark.parametrize("options, fix", [
    (["--trainer.gradient_clip_val", "1.0"], "--model.init_args.max_grad_norm 1.0"),
    (["--trainer.accumulate_grad_batches", "2"], "use a larger batch instead"),
    (["--trainer.precision", "16-mixed"], "Use precision='bf16-mixed'"),
    (["--model.init_args.optimizer", "lit_constrained.optim.ConstantStepAdam"],
     "Add it: in the config, trainer: {callbacks: [{class_path: lit_constrained.callbacks.LipschitzEstimator"),
])
def test_a_setting_the_setup_refuses_is_one_line_with_its_fix_and_exit_status_2(tmp_path: Path, options, fix) -> None:
    """Issue 37: before, a 40-50 line traceback (through Lightning's fit) ended in the message."""
    readme_example(tmp_path)
    result = run_console(["fit", "--config", "exp_fit.yaml", *options], tmp_path)
    errors = [line for line in result["stderr"].splitlines() if "error:" in line]
    assert result["status"] == 2 and "Traceback" not in result["stderr"], result["stderr"][-3000:]
    assert len(errors) == 1 and errors[0].startswith("lit-constrained fit: error: ") and fix in errors[0], errors


@pytest.mark.parametrize("args", [["fit"], ["fit", "--trainer.max_steps", "3"], ["validate"]])
def test_a_subcommand_without_a_config_says_config_before_lightning(tmp_path: Path, args: list[str]) -> None:
    """Issue 37: before, "the following arguments are required: fit.data, fit.model" (no word of --config),
    after Lightning's import (~48 s measured on the loaded 2-core machine)."""
    result = run_console(args, tmp_path)
    assert result["status"] == 2 and len(result["stderr"].strip().splitlines()) == 1, result["stderr"]
    assert f"lit-constrained {args[0]}: error: no --config given" in result["stderr"]
    assert f"lit-constrained {args[0]} --config configs/spring/recommended/sqp_adam.yaml" in result["stderr"]
    assert not result["lightning"] or len(args) > 1  # nothing at all given: answered before the slow imports


def test_a_top_level_config_or_the_classes_as_options_are_something_to_run() -> None:
    assert something_to_run([], ["top.yaml"])
    assert something_to_run(["--model", "lit_constrained.tasks.spring.Spring", "--data", "x.Data"], [])
    assert something_to_run(["--help"], []) and not something_to_run([], [])


def test_a_config_without_data_gets_the_config_fix_from_lightningcli() -> None:
    from lit_constrained.cli.fit.hints import phrase_error

    hint = phrase_error("the following arguments are required: fit.data", ["--config", "x.yaml"])
    assert hint is not None and "--config CONFIG" in hint and "data: class_path" in hint


def test_a_class_typo_in_a_task_file_with_a_script_part_gets_the_nearest_class(tmp_path: Path, monkeypatch,
                                                                               capsys) -> None:
    """A task file ending in ``if __name__ == "__main__":`` (not run on import) is still read for its names."""
    readme_example(tmp_path)
    with (tmp_path / "exp_fit.py").open("a") as task_file:
        task_file.write('\n\nif __name__ == "__main__":\n    Helper = None\n')
    text = (tmp_path / "exp_fit.yaml").read_text()
    (tmp_path / "typo.yaml").write_text(text.replace("class_path: exp_fit.ExpFit", "class_path: exp_fit.ExpFitt"))
    (tmp_path / "main_only.yaml").write_text(text.replace("class_path: exp_fit.ExpFit", "class_path: exp_fit.Helper"))
    status, err = in_process(["fit", "--config", "typo.yaml"], tmp_path, monkeypatch, capsys)
    assert status == 2 and "exp_fit has no 'ExpFitt' (did you mean exp_fit.ExpFit?)" in err, err
    status, err = in_process(["fit", "--config", "main_only.yaml"], tmp_path, monkeypatch, capsys)
    assert status == 2 and "exp_fit has no 'Helper'" in err, err
