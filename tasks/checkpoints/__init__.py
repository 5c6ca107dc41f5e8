"""The checkpoints' room: which weights make each pass, and the checks before they run.

Read it in this order:

- `choice` — `resolve_checkpoints`, what the flow calls: the file of each pass (explicit
  files, a checkpoint root searched by the files' own headers, or small untrained models),
  each family's size, and the refusal that says what is missing;
- `auto_size` — the rule of model size `auto` (the largest size that covers every pass);
- `families` — the two families (Sapiens2, Sapiens v1), their sizes and which has each pass;
- `files` — what a checkpoint file is (`CheckpointRef`) and what a root holds (`RootScan`);
- `untrained` — the random-weight stand-ins built once when there are no checkpoints;
- `verify` — every chosen file checked once before any frame is sent;
- `convert` — `svfx models convert`: a released v1 `.pth` into safetensors;
- `errors` — the refusals, importable without torch; `caches` — per-file JSON caches
  (sha256, verified) under $SVFX_HOME.

Nothing is re-exported here: import from the module that holds a name.
"""
