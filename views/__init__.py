"""The views: what a person reads about the fleet, each from the deploy's own reads and decisions,
changing nothing. `status` (the status view's rows: each host's one read and its plan,
deploys/plan.py), `measure` (served throughput side by side, through the engine's own benchmark
client). They sit above the deploy's components (deploys/), whose plan they read."""
