"""The root of the errors a user can cause (`core.errors.SvfxError`): every such class derives
from it and keeps the builtin base its callers catch; the CLI ends with the code it carries."""

from __future__ import annotations

import pytest
import typer

from api.context import NoOrchestrator
from cli.console import refusing
from core.errors import SvfxError
from flows.edit_cuts import CutError
from flows.orchestrator import OrchestratorError
from flows.plate_template import TemplateError
from flows.refusals import ClusterError
from flows.submission import SubmissionRefused
from sapiens.errors import CheckpointError, DeviceMemoryError, InputError, NotSafetensors
from schemas.catalog.errors import CatalogDamaged, CatalogUnavailable, JobConflict
from schemas.spec import SpecError
from storage.errors import FrameError, SequenceError, StorageError
from storage.object_listing import ListingError
from storage.retry import RetriesExhausted
from tasks.checkpoints.errors import CheckpointChoiceError
from tasks.frame_records import FrameRecordError

USER_ERRORS: dict[type[Exception], type[Exception]] = {  # class -> the builtin base it keeps
    CheckpointError: ValueError,
    DeviceMemoryError: RuntimeError,
    StorageError: Exception,
    FrameError: Exception,
    SequenceError: Exception,
    RetriesExhausted: OSError,
    ListingError: OSError,
    CatalogUnavailable: Exception,
    CatalogDamaged: Exception,
    JobConflict: Exception,
    SpecError: ValueError,
    FrameRecordError: ValueError,
    CheckpointChoiceError: ValueError,
    CutError: ValueError,
    TemplateError: ValueError,
    SubmissionRefused: Exception,
    OrchestratorError: RuntimeError,
    ClusterError: RuntimeError,
    NoOrchestrator: RuntimeError,
}


@pytest.mark.parametrize("cls", USER_ERRORS, ids=lambda cls: cls.__name__)
def test_every_user_error_has_the_root_and_keeps_its_builtin_base(cls: type[Exception]) -> None:
    assert issubclass(cls, SvfxError) and issubclass(cls, USER_ERRORS[cls])
    assert cls.exit_code == 2  # type: ignore[attr-defined]


def test_programming_errors_and_internal_ones_are_not_refusals() -> None:
    assert not issubclass(InputError, SvfxError)  # a batch the caller built wrong
    assert not issubclass(NotSafetensors, SvfxError)  # never leaves sapiens


def test_the_cli_ends_with_the_code_the_error_carries() -> None:
    class Odd(SvfxError):
        exit_code = 3

    def raising(exc: Exception) -> None:
        raise exc

    with pytest.raises(typer.Exit) as info:
        refusing(lambda: raising(Odd("plate.####.exr: something the user can fix")))
    assert info.value.exit_code == 3
    with pytest.raises(typer.Exit) as info:
        refusing(lambda: raising(SpecError("bad spec")))
    assert info.value.exit_code == 2
