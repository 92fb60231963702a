"""Services: the service account, the unit each service runs as (units, unit_file, service_inputs),
its secrets, the preflight of its flags, the readiness gate with its rollback (readiness,
lifecycle, rollback), placement (what no longer runs on a host goes), and the rollout's waves.
"""
