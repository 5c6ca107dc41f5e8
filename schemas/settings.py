"""Platform configuration: environment variables, then an optional ``svfx.toml``, then defaults.

The embedded default needs nothing set: data under ``~/.svfx`` (SQLite catalog, Prefect home,
outputs), a LocalCluster, the ephemeral Prefect API and local disk. Production sets
``SVFX_CATALOG_URL`` (PostgreSQL), ``SVFX_DASK_ADDRESS``, ``SVFX_CHECKPOINT_ROOT``,
``SVFX_OUTPUT_ROOT`` and ``SVFX_ALLOWED_ROOTS``; a bucket watched by ``svfx serve`` sets
``SVFX_SCAN_PREFIXES`` (and optionally the template, schedule, settle time and cap below).

``svfx.toml`` is looked up at ``$SVFX_CONFIG``, then ``./svfx.toml``, then
``$SVFX_HOME/svfx.toml``; its keys are the field names below (``catalog_url = "..."``).
Environment variables win over the file. ``SVFX_API_TOKEN`` enables the catalog API's write
endpoints (bearer token); unset, they are refused.

Publishing to a production tracker (`publish/`): ``SVFX_PUBLISH=kitsu`` or ``shotgrid``
publishes every job that completes, with that tracker's connection settings below. Secrets
(``SVFX_KITSU_PASSWORD``, ``SVFX_SHOTGRID_SCRIPT_KEY``) come from the environment, the file or
a file of their own (``..._FILE``: its first line); they are never logged nor recorded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from schemas.spec import ShotSpec, Tiles
from storage.layers import ExrLayout

if TYPE_CHECKING:
    from storage.location import Location


def default_home() -> Path:
    return Path(os.environ.get("SVFX_HOME") or Path.home() / ".svfx").expanduser()


def config_file() -> Path | None:
    """The ``svfx.toml`` in effect, or None."""
    explicit = os.environ.get("SVFX_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    for candidate in (Path.cwd() / "svfx.toml", default_home() / "svfx.toml"):
        if candidate.is_file():
            return candidate
    return None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SVFX_", extra="ignore")

    home: Path = Field(default_factory=default_home)
    catalog_url: str | None = None  # default: sqlite under home
    dask_address: str | None = None  # default: a LocalCluster per run
    # How long `svfx submit/scan/submit-edit/worker` wait for that scheduler to answer before
    # saying so (a farm reached over a VPN may need more than a LAN).
    dask_connect_timeout_s: float = Field(5.0, gt=0)
    checkpoint_root: str | None = None  # default: tiny untrained models
    output_root: str | None = None  # default: home/outputs
    # Comma- or colon-separated; default: home and the current directory.
    allowed_roots: Annotated[list[str], NoDecode] = Field(default_factory=list)
    s3_endpoint_url: str | None = None
    # LocalCluster CPU worker processes when no address is given; None: the node's plan
    # (tasks/node_threads.py, SVFX_CPU_WORKERS)
    local_workers: int | None = Field(None, ge=1)
    chunk_window: int = 0  # chunks in flight per worker; 0: 2 per GPU worker
    api_token: str | None = None  # bearer token of the API's write endpoints; None: disabled
    # The embedded Prefect server (no PREFECT_API_URL): how long it may take to start.
    prefect_start_timeout_s: float = Field(120.0, gt=0)
    # How long a catalog write waits for its database (a restart, a lock) before giving up.
    catalog_retry_s: float = Field(120.0, gt=0)
    # The scheduled bucket scan (`svfx serve`): prefixes, naming template and schedule.
    # Temporal QC: a frame whose flicker score (tasks/temporal_qc.py; 1 = usual for the shot)
    # is above this is flagged in the catalog, `svfx status`, the API and the shot page.
    qc_flicker_threshold: float = Field(3.0, gt=0)
    scan_prefixes: Annotated[list[str], NoDecode] = Field(default_factory=list)
    scan_template: str = "{show}/{seq}/{shot}/plates/{plate}/{name}.####.exr"
    scan_interval_s: int = Field(300, ge=10)  # used when scan_cron is not set
    scan_cron: str | None = None
    scan_settle_s: float = Field(120.0, ge=0)  # wait this long after an object's last write
    scan_max_in_flight: int = Field(4, ge=1)  # shots running at once
    scan_passes: Annotated[list[str], NoDecode] = Field(default_factory=list)  # default: all
    scan_model_size: str = ShotSpec.model_fields["model_size"].default
    # The EXR layout of scanned shots: ShotSpec.exr_layout's values, default and meaning.
    scan_exr_layout: ExrLayout = Field(
        ShotSpec.model_fields["exr_layout"].default,
        description=ShotSpec.model_fields["exr_layout"].description,
    )
    # Whether scanned shots run tiles only near people: ShotSpec.tiles' values and default.
    scan_tiles: Tiles = Field(
        ShotSpec.model_fields["tiles"].default,
        description=ShotSpec.model_fields["tiles"].description,
    )
    # The scheduled prune (`svfx serve`, flows/prune.py): off unless an interval is set; its
    # rules are `svfx prune`'s (--keep, --older-than such as 30d, --invalidated), at least one.
    prune_interval_s: int | None = Field(None, ge=60)
    prune_keep: int | None = None
    prune_older_than: str | None = None
    prune_invalidated: bool = False
    # The size model size "auto" prefers when the checkpoint root has it for every pass.
    model_size: str | None = None
    # Publishing (publish/): the tracker every completed job goes to ("": none), the task
    # versions are published under, whether a missing sequence, shot or task is created
    # (else the publish is refused by name), the pass whose review clip and contact sheet
    # are the version's movie and thumbnail (default: the first pass that has them).
    publish: Literal["", "kitsu", "shotgrid"] = ""
    publish_task: str = Field("Sapiens", min_length=1)
    publish_create: bool = False
    publish_review_pass: str | None = None
    publish_timeout_s: float = Field(30.0, gt=0)
    kitsu_host: str | None = None  # http://kitsu.studio (gazu's host: no /api)
    kitsu_email: str | None = None
    kitsu_password: SecretStr | None = None
    kitsu_password_file: Path | None = None
    shotgrid_url: str | None = None  # https://studio.shotgrid.autodesk.com
    shotgrid_script: str | None = None
    shotgrid_script_key: SecretStr | None = None
    shotgrid_script_key_file: Path | None = None

    @field_validator("allowed_roots", "scan_prefixes", mode="before")
    @classmethod
    def _split_roots(cls, value: Any) -> Any:
        if isinstance(value, str):
            parts = [p.strip() for p in value.replace(",", os.pathsep).split(os.pathsep)]
            # keep "s3://bucket" intact when os.pathsep is ":"
            merged: list[str] = []
            for part in parts:
                if merged and merged[-1].endswith(("s3", "gs", "file")) and part.startswith("//"):
                    merged[-1] = f"{merged[-1]}:{part}"
                elif part:
                    merged.append(part)
            return merged
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = config_file()
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)

    @field_validator("scan_passes", mode="before")
    @classmethod
    def _split_passes(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [p.strip() for p in value.split(",") if p.strip()]
        return value

    @property
    def catalog(self) -> str:
        return self.catalog_url or f"sqlite:///{self.home / 'catalog.db'}"

    @property
    def outputs(self) -> str:
        return self.output_root or str(self.home / "outputs")

    @property
    def roots(self) -> list[str]:
        """Where plates and outputs may live."""
        if self.allowed_roots:
            return list(self.allowed_roots)
        return [str(self.home), str(Path.cwd())]

    def location(self, uri: str) -> Location:
        """``uri`` with the fsspec options these settings give it: the S3 endpoint for
        ``s3://`` URIs (credentials come from the usual AWS variables), none otherwise. The
        options are explicit, even when empty (the environment's endpoint is not consulted);
        `Location.or_environment` hands empty ones to workers as "from your environment"."""
        from storage.location import Location  # a value; fsspec only when a command uses it

        if uri.startswith("s3://") and self.s3_endpoint_url:
            return Location(uri, {"client_kwargs": {"endpoint_url": self.s3_endpoint_url}})
        return Location(uri, {})


def secret(value: SecretStr | None, file: Path | None) -> str | None:
    """A secret setting's value: the setting itself, else the first line of its file."""
    if value is not None:
        return value.get_secret_value()
    if file is not None:
        lines = Path(file).expanduser().read_text().splitlines()
        return lines[0].strip() if lines else ""
    return None


def load_settings(**overrides: Any) -> Settings:
    return Settings(**overrides)
