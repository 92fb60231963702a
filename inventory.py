# Example inventory for real GPU hosts: copy it, replace the addresses, then run
#   pyinfra inventory.py deploy.py --dry   # the plan
#   pyinfra inventory.py deploy.py -y      # apply it (docs/your-own-hosts.md)
#
# Host names are logical: `ssh_hostname` is the address. Moving a service after a GPU
# failure is editing `run_services` here (and, if the new host numbers its GPUs or ports
# differently, an override such as {"dflash": {"gpu": 1, "port": 30001}}) and re-running.
# Everything else (stack, models, flags) comes from group_data/*.yml.

gpu_hosts = [
    (
        "gpu-old",
        {
            "ssh_hostname": "10.0.0.11",
            "ssh_user": "root",
            "run_services": ["ddtree"],
        },
    ),
    (
        "gpu-new",
        {
            "ssh_hostname": "10.0.0.12",
            "ssh_user": "root",
            # GPU0:30000 there is taken by another server: this one goes to GPU1:30001.
            "run_services": {"dflash": {"gpu": 1, "port": 30001}},
        },
    ),
]
