"""Whether two runs wrote the same outputs: every file's bytes, and where bytes differ, each
EXR's parts, channels, pixel types, pixel bytes and headers, and each Zarr store's arrays and
attributes. For checking that a refactor changes nothing (issue 23: the demo before and after,
run with the same SVFX_HOME, plates and checkpoints, the catalog cleared in between).

    python -m bench.compare_outputs BEFORE_OUTPUT_ROOT AFTER_OUTPUT_ROOT
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import OpenEXR
import zarr


def _kind(rel: Path) -> str:
    if ".zarr" in str(rel):
        return "zarr chunk/meta"
    if ".frame_records" in str(rel):
        return "frame record"
    return rel.suffix or rel.name


def compare(before: Path, after: Path) -> None:
    files_a = {p.relative_to(before) for p in before.rglob("*") if p.is_file()}
    files_b = {p.relative_to(after) for p in after.rglob("*") if p.is_file()}
    print("only before:", sorted(map(str, files_a - files_b))[:5])
    print("only after:", sorted(map(str, files_b - files_a))[:5])
    kinds: dict[str, list[int]] = {}
    for rel in sorted(files_a & files_b):
        same = (before / rel).read_bytes() == (after / rel).read_bytes()
        kinds.setdefault(_kind(rel), [0, 0])[0 if same else 1] += 1
    print("byte-identical / differing, by kind:", kinds)
    exrs = sorted(r for r in files_a & files_b if r.suffix == ".exr")
    equal, header_keys = 0, set()
    for rel in exrs:
        a = OpenEXR.File(str(before / rel), separate_channels=True)
        b = OpenEXR.File(str(after / rel), separate_channels=True)
        ok = [p.name() for p in a.parts] == [p.name() for p in b.parts]
        for pa, pb in zip(a.parts, b.parts, strict=False):
            ok &= list(pa.channels) == list(pb.channels)
            for name, channel in pa.channels.items():
                other = pb.channels.get(name)
                ok &= other is not None and channel.pixels.dtype == other.pixels.dtype
                ok &= other is not None and channel.pixels.tobytes() == other.pixels.tobytes()
            keys = set(pa.header) | set(pb.header)
            header_keys |= {k for k in keys if str(pa.header.get(k)) != str(pb.header.get(k))}
        equal += ok
    print(f"EXRs with equal parts, channels, types and pixels: {equal}/{len(exrs)}; "
          f"header keys that differ: {sorted(header_keys)}")  # fmt: skip
    for meta in sorted(p for p in files_a & files_b if p.name == "zarr.json"):
        if meta.parent.suffix != ".zarr":
            continue
        ga = zarr.open_group(str(before / meta.parent), mode="r")
        gb = zarr.open_group(str(after / meta.parent), mode="r")
        for name in sorted(ga.array_keys()):
            xa, xb = ga[name][...], gb[name][...]
            same = xa.dtype == xb.dtype and np.asarray(xa).tobytes() == np.asarray(xb).tobytes()
            attrs = dict(ga[name].attrs) == dict(gb[name].attrs)
            print(f"  zarr {name} {xa.dtype} {xa.shape}: bytes {'equal' if same else 'DIFFER'}, "
                  f"attributes {'equal' if attrs else 'DIFFER'}")  # fmt: skip
        pa, pb = dict(ga.attrs), dict(gb.attrs)
        print(
            "  group attributes that differ:",
            sorted(k for k in set(pa) | set(pb) if pa.get(k) != pb.get(k)),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    compare(args.before, args.after)


if __name__ == "__main__":
    main()
