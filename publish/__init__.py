"""Publishing a job's outputs to a production tracker (Kitsu, ShotGrid): what a publish makes
(`item`), the one small protocol every tracker's adapter speaks (`tracker`), the adapters,
one module each (`kitsu`, `shotgrid`), found by name (`adapters`), and running a publish and
recording it in the catalog (`run`)."""
