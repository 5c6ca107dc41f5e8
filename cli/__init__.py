"""`svfx`, the command line: submit shots, watch them, query the catalog, run clusters,
workers and servers. One module per group of commands (`cli.main` builds the app), each
command calling `flows`, `tasks` or `schemas.catalog`; nothing outside `cli` imports it.
Exit codes: 0 complete / ok, 1 partial, 2 failed or invalid input."""
