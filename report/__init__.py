"""What the run prints at its end and while it runs, as pyinfra state callbacks: `summary` holds the
run's one store of per-host, per-service rows (written by `summary.record` from every step that
decides a service's fate) and prints it as the end-of-run table, and `health_timer` logs each
(re)started service's time to `/health` and the hosts the run could not reach."""
