"""Every shipped config parses through the CLI (class paths resolve, no typos)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_constrained.cli import main

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml"))


def test_no_config_is_named_config_yaml():
    assert CONFIGS and not any(Path(c).name == "config.yaml" for c in CONFIGS)


@pytest.mark.parametrize("config", CONFIGS)
def test_config_parses(config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(ROOT / config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "class_path: lit_constrained.tasks." in printed


def test_recommended_configs_take_the_full_normal_step():
    recommended = [c for c in CONFIGS if "/recommended/" in c]
    assert len(recommended) >= 12
    for config in recommended:
        assert "rho: full" in (ROOT / config).read_text(), config
