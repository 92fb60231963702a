"""The GPU check: which GPUs a host has, whose they are, whether a service's GPU is free (read by
on_host/gpu_state.py), and what a host must have before anything is built on it.
"""
