"""The bottom room: what every package of the platform shares and that imports nothing of
ours (`core.errors`: the root of the errors a user can cause)."""
