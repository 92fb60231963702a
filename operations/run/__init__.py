"""The run's own machinery, which every step uses: the one read of each host (host_reads) and the
per-run state (run_state, this_run), the plan's record types (plan), whole-file writes and kept
directories, SSH channels, the templates, redaction of secrets from the output, and progress lines.
It imports no other room.
"""
