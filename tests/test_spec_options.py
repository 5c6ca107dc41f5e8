"""The submitting commands' options derive from ShotSpec's fields: the same defaults and the
field's description as help (cli/spec_options.py), so a spec option is declared once."""

from __future__ import annotations

import inspect
import typing

import pytest

from cli import cuts, submit
from schemas.spec import ShotSpec, TilingSpec

# CLI parameter -> (model, field) where the names differ
RENAMED = {"output": (ShotSpec, "output_root"), "overlap": (TilingSpec, "overlap")}
# The CLI's own shape of the shot's names: --shot SHOW/SEQ/SHOT, or --show and --seq of a cut
NAMES = {"show", "sequence", "shot"}


def spec_parameters(command: typing.Callable[..., object]):
    hints = typing.get_type_hints(command, include_extras=True)
    for name, parameter in inspect.signature(command).parameters.items():
        model, field = RENAMED.get(name, (ShotSpec, name))
        if field in model.model_fields and name not in NAMES:
            option = next(m for m in hints[name].__metadata__ if hasattr(m, "help"))
            yield name, parameter.default, option.help, model.model_fields[field]


@pytest.mark.parametrize("command", [submit.submit, cuts.submit_edit])
def test_options_say_and_default_what_the_spec_does(command):
    seen = list(spec_parameters(command))
    assert len(seen) >= 6, seen
    for name, default, help_text, field in seen:
        assert field.description and field.description in help_text, name
        if name == "passes":
            assert default.split(",") == list(field.default), name
        elif default is not None:
            assert default == field.default, name
