"""How planning cuts a shot into work: whole Zarr shards per chunk (one writer per shard, so
no write is lost), shards sized so Zarr's whole-shard re-encoding stays cheap at 4K."""

from __future__ import annotations

import pytest

from flows.shot_plan import shard_groups
from schemas.passes import zarr_arrays
from storage.zarr_store import create_shot_store, shard_frames, stored_frames_per_shard


def _shards(group: list[int], per_shard: int) -> set[int]:
    return {index // per_shard for index in group}


@pytest.mark.parametrize(
    "todo",
    [
        list(range(40)),
        # a resubmit after frame 7 was done: frames 0-6 and 8-15 are shards 0 and 1; cutting
        # the list by position (every 8 items) would give shard 1 to two writers
        [*range(7), *range(8, 16)],
        [0, 5, 9, 17, 18, 30, 31, 39],
        [33],
    ],
)
def test_no_shard_is_split_between_chunks(todo):
    groups = shard_groups(todo, frames_per_shard=8, chunk_frames=8)
    assert sorted(i for g in groups for i in g) == sorted(todo)  # every frame exactly once
    owners: dict[int, int] = {}
    for n, group in enumerate(groups):
        for shard in _shards(group, 8):
            assert owners.setdefault(shard, n) == n, f"shard {shard} in chunks {owners[shard]}, {n}"


def test_small_shards_are_joined_into_chunks_of_the_asked_size():
    groups = shard_groups(list(range(10)), frames_per_shard=1, chunk_frames=4)
    assert groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert shard_groups([], 1, 4) == []


def test_shards_shrink_for_big_frames_only():
    every = zarr_arrays(("normal", "pointmap", "albedo", "matte", "seg", "pose"))
    assert shard_frames(2160, 4096, every, 20, wanted=8) == 1  # pointmap: 106 MB a frame
    assert shard_frames(1080, 1920, every, 20, wanted=8) == 5
    assert shard_frames(180, 320, every, 20, wanted=8) == 8
    assert (
        shard_frames(1080, 1920, zarr_arrays(("seg", "matte")), 20, wanted=8) == 8
    )  # 4 MB a frame


def test_an_existing_store_keeps_its_shard_size(tmp_path):
    uri = str(tmp_path / "shot.zarr")
    assert stored_frames_per_shard(uri) is None
    create_shot_store(uri, range(1001, 1011), 8, 8, zarr_arrays(("normal",)), 2, {}, 8)
    assert stored_frames_per_shard(uri) == 8
